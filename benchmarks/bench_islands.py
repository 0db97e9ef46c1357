"""What skipping MuJoCo's constraint-island discovery saves: physics CPU per agent step, one thread, per task.

For each task it steps the same perturbed initial states with the same random controls twice, interleaved over
rounds: once with the model ``envs.physics.build_model`` gives (discovery off for one-tree models) and once with
MuJoCo's default flags (discovery on). Each agent step is ``mj_step`` x frame_skip then ``mj_rnePostConstraint``,
as the ``mujoco`` backend does. It also checks that both give bit-identical states (the tests check this too).

    python benchmarks/bench_islands.py [--envs ant humanoid] [--rounds 5]

Writes ``benchmarks/results/islands_cpu.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import time

import mujoco
import numpy as np
from sample_fast.envs.physics import build_model
from sample_fast.envs.tasks import TASKS, resolve_options

from sample_fast.benchmark import harness

ISLAND = int(mujoco.mjtDisableBit.mjDSBL_ISLAND)


def run(model: mujoco.MjModel, frame_skip: int, num_envs: int, num_steps: int, seed: int) -> tuple[float, np.ndarray]:
    """CPU µs per agent step of this thread, and the final state rows."""
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    d = mujoco.MjData(model)
    mujoco.mj_forward(model, d)
    s0 = np.zeros(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, d, s0, spec)
    rng = np.random.default_rng(seed)
    rows = np.tile(s0, (num_envs, 1))
    rows[:, 1 : 1 + model.nq] += rng.uniform(-0.1, 0.1, (num_envs, model.nq))
    lo, hi = model.actuator_ctrlrange.T
    controls = rng.uniform(lo, hi, (num_steps, num_envs, model.nu))

    def agent_step(k: int) -> None:
        for i in range(num_envs):
            mujoco.mj_setState(model, d, rows[i], spec)
            d.ctrl[:] = controls[k, i]
            mujoco.mj_step(model, d, frame_skip)
            mujoco.mj_rnePostConstraint(model, d)
            mujoco.mj_getState(model, d, rows[i], spec)

    # This thread's CPU clock: the physics cost, whatever else runs on the machine.
    t = harness.time_calls(agent_step, num_steps, cpu_clock=time.thread_time)
    return t.cpu_s / (num_steps * num_envs) * 1e6, rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", default=sorted(TASKS), choices=sorted(TASKS))
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=100, help="agent steps per env per round")
    p.add_argument("--out", default=None, help="output stem (default benchmarks/results/islands_cpu)")
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)
    quiet = harness.check_quiet_from_args(args)
    report = {
        "args": vars(args),
        "mujoco": mujoco.__version__,
        "machine": harness.machine_record(quiet),
        "quiet": quiet,
        "load_before": harness.load_average(),
        "tasks": {},
    }
    for name in args.envs:
        task = TASKS[name]
        skipped = build_model(task, resolve_options(task, {}, {}))
        default = build_model(task, resolve_options(task, {}, {}))
        default.opt.disableflags &= ~ISLAND
        runs = harness.interleave(  # round r: both models from the same states, with the same controls
            {
                "skipped": lambda r, m=skipped, fs=task.frame_skip: run(m, fs, args.num_envs, args.num_steps, seed=r),
                "default": lambda r, m=default, fs=task.frame_skip: run(m, fs, args.num_envs, args.num_steps, seed=r),
            },
            args.rounds,
        )
        times = {case: [us for us, _ in xs] for case, xs in runs.items()}
        identical = all(np.array_equal(a, b) for (_, a), (_, b) in zip(runs["skipped"], runs["default"], strict=True))
        row = {
            "skipped_us": harness.median(times["skipped"]),
            "default_us": harness.median(times["default"]),
            "speedup": harness.paired_ratio(times["default"], times["skipped"]),
            "bit_identical": bool(identical),
            "ntree": int(skipped.ntree),
        }
        report["tasks"][name] = row
        print(f"{name:>12}: {row['default_us']:.1f} -> {row['skipped_us']:.1f} µs per agent step "
              f"(x{row['speedup']:.3f}), bit-identical {identical}", flush=True)  # fmt: skip
    report["load_after"] = harness.load_average()
    stem = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "islands_cpu")
    lines = [
        "# Island discovery: physics CPU per agent step, one thread",
        "",
        f"mujoco {report['mujoco']}; {args.num_envs} envs x {args.num_steps} agent steps per round, median of "
        f"{args.rounds} interleaved rounds; load average {report['load_before']} before, {report['load_after']} after.",
        harness.quiet_line(quiet),
        "",
        "| task | MuJoCo default (discovery on), µs | build_model (off), µs | speed-up (paired) | bit-identical |",
        "|---|---|---|---|---|",
    ]
    for name, row in report["tasks"].items():
        lines.append(
            f"| {name} | {row['default_us']:.1f} | {row['skipped_us']:.1f} | {row['speedup']:.3f} | "
            f"{row['bit_identical']} |"
        )
    harness.write_results(*harness.split_stem(stem), report, "\n".join(lines) + "\n")
    print(f"wrote {stem}.json and {stem}.md")
    return report


if __name__ == "__main__":
    main()
