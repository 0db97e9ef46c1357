"""Where a training run's CPU goes on a small machine (issue #14): per process, and per phase of the learner.

    python benchmarks/bench_train_accounting.py     # -> benchmarks/results/train_accounting.{json,md}
    python benchmarks/bench_train_accounting.py --seconds 60 -- env=ant sampler.rollout_len=32   # trainer overrides

Runs ``sample_fast.train`` in this process (the learner side: the Runner and the Learner; the sampler is its child
process) with the given Hydra overrides (default: ``env=ant``, the trainer's defaults) for ``--warmup-s`` and then a
window of ``--seconds``, and reports, per env step trained in the window:

* the CPU time of each process (all its threads, from /proc): the learner process and the sampler process, and
  what is left of ``cores x wall`` (idle core time);
* the learner process's main-thread CPU and wall time by phase: waiting for a ready slot
  (``Runner._next_ready_slot``), ``Learner._prepare`` (slot -> batch tensors), ``Learner._optimize`` (targets +
  epochs x minibatches), ``Learner._metrics``, the weight publish, the hooks (the trainer's logger and
  checkpoints), the rest of ``Runner._train_on`` (slot release, episode drain, the sampler check).

Linux only (it reads /proc/<pid>/task/*/stat). Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_fast.benchmark import harness  # noqa: E402
from sample_fast.procs import cpu_seconds as proc_cpu_s  # noqa: E402

OUT = ROOT / "benchmarks" / "results"


class Phases:
    """Main-thread CPU and wall time per named phase (nested phases are charged to the innermost)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.on = False
        self._stack: list[str] = []

    def wrap(self, name: str, fn):
        def wrapper(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            c, w = time.thread_time(), time.perf_counter()
            outer = self._stack[-1] if self._stack else None
            self._stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                dc, dw = time.thread_time() - c, time.perf_counter() - w
                self.cpu[name] = self.cpu.get(name, 0.0) + dc
                self.wall[name] = self.wall.get(name, 0.0) + dw
                if outer is not None:  # charge the inner time to the inner phase only
                    self.cpu[outer] = self.cpu.get(outer, 0.0) - dc
                    self.wall[outer] = self.wall.get(outer, 0.0) - dw

        return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup-s", type=float, default=30.0, help="trained before the window opens")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="train_accounting")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the trainer (after --)")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    if args.warmup_s < 0 or args.seconds <= 0:
        parser.error("--warmup-s must be >= 0 and --seconds > 0")
    if not os.path.exists("/proc/self/stat"):
        parser.error("needs Linux's /proc (per-process CPU times)")
    overrides = args.overrides or ["env=ant"]
    if not any(o.startswith("env=") for o in overrides):
        overrides = ["env=ant", *overrides]
    quiet = harness.check_quiet_from_args(args, log=print)

    from sample_fast import learner as learner_mod
    from sample_fast import runner as runner_mod
    from sample_fast import train as train_mod
    from sample_fast.cli import compose_overrides

    ph = Phases()
    L, R = learner_mod.Learner, runner_mod.Runner
    for name in ("_prepare", "_optimize", "_metrics"):
        setattr(L, name, ph.wrap(f"Learner.{name}", getattr(L, name)))
    R._next_ready_slot = ph.wrap("wait for a ready slot", R._next_ready_slot)
    R._train_on = ph.wrap("rest of Runner._train_on", R._train_on)
    R._publish = ph.wrap("weight publish", R._publish)
    R._hook = ph.wrap("hooks (logger, checkpoints)", R._hook)

    state: dict = {}
    orig_loop = R._loop

    def loop(self, total_env_steps, time_limit_s):
        state["runner"] = self
        return orig_loop(self, total_env_steps, time_limit_s)

    R._loop = loop
    orig_train_on = R._train_on

    def train_on(self, slot_idx):  # open and close the window at train-call boundaries
        out = orig_train_on(self, slot_idx)
        now = time.perf_counter()
        if "t_open" not in state and now - state["t_start"] >= args.warmup_s:
            state.update(t_open=now, steps_open=self.env_steps, cpu_open=proc_cpu_s(os.getpid()),
                         sampler_pid=self.process.pid, sampler_open=proc_cpu_s(self.process.pid))  # fmt: skip
            ph.on = True
        elif "t_open" in state and now - state["t_open"] >= args.seconds:
            ph.on = False
            state.update(t_close=now, steps_close=self.env_steps, cpu_close=proc_cpu_s(os.getpid()),
                         sampler_close=proc_cpu_s(state["sampler_pid"]))  # fmt: skip
            self.request_stop()
        return out

    R._train_on = train_on
    with tempfile.TemporaryDirectory(prefix="train_accounting_") as rdir:
        limit = args.warmup_s + args.seconds + 120
        cfg = compose_overrides([*overrides, f"run.dir={rdir}", "logging.progress=off", "logging.tensorboard=false",
                                 "logging.plot=false", f"run.time_limit_s={limit}"])  # fmt: skip
        state["t_start"] = time.perf_counter()
        train_mod.train(cfg)
    if "t_close" not in state:
        raise SystemExit("the run ended before the window closed (raise run.total_env_steps or lower --seconds)")
    wall = state["t_close"] - state["t_open"]
    steps = state["steps_close"] - state["steps_open"]
    cores = len(os.sched_getaffinity(0))
    learner_cpu = state["cpu_close"] - state["cpu_open"]
    sampler_cpu = state["sampler_close"] - state["sampler_open"]
    us = 1e6 / steps
    rows = {
        "learner process (all threads)": learner_cpu * us,
        "sampler process (all threads)": sampler_cpu * us,
        "idle (cores x wall - both)": (cores * wall - learner_cpu - sampler_cpu) * us,
    }
    phases = sorted(ph.cpu, key=lambda k: -ph.wall[k])
    data = {
        "machine": harness.machine_record(quiet), "quiet": quiet, "overrides": overrides, "cores": cores,
        "window_s": wall, "env_steps": steps, "env_steps_per_s": steps / wall,
        "us_per_env_step": rows,
        "learner_main_thread_us_per_env_step": {k: {"cpu": ph.cpu[k] * us, "wall": ph.wall[k] * us} for k in phases},
    }  # fmt: skip
    md = [
        f"# CPU accounting of a training run: `python -m sample_fast.train {' '.join(overrides)}`",
        "",
        harness.quiet_line(quiet),
        "",
        f"A window of {wall:.0f} s after {args.warmup_s:.0f} s of training: {steps} env steps, "
        f"**{steps / wall:.0f} env steps/s**, {cores} cores ({cores * 1e6 / (steps / wall):.0f} core-µs per env step "
        "in all). Process CPU from /proc (all threads).",
        "",
        "| where | core-µs per env step | share of the cores |",
        "|---|---:|---:|",
    ]
    total = cores * wall * us
    for k, v in rows.items():
        md.append(f"| {k} | {v:.1f} | {v / total:.0%} |")
    md += ["", "The learner process's main thread, by phase (µs per env step; wall includes waiting):", "",
           "| phase | CPU | wall |", "|---|---:|---:|"]  # fmt: skip
    for k in phases:
        md.append(f"| {k} | {ph.cpu[k] * us:.1f} | {ph.wall[k] * us:.1f} |")
    md.append(f"| window | | {wall * us:.1f} |")
    text = "\n".join(md) + "\n"
    print(text)
    print(harness.write_results(args.out, args.name, data, text))


if __name__ == "__main__":
    main()
