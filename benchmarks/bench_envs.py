"""Env-only throughput: our BatchedEnv backends against MuJoCo's physical limit and the peers, in one run.

Counts agent steps per second (physics steps/s = agent steps/s * frame_skip, also reported). For each task and
batch size it times, interleaved round-robin so machine load hits every contender alike:

* ``ours``: ``sample_fast.envs.make(task, N, backend=...)`` (``--backend mujoco`` by default, 2 threads);
* ``rollout``: ``mujoco.rollout.Rollout(nthread=2)``, one call per env step, same model (the physical limit for
  MuJoCo C; it computes no ``cfrc_ext``, no observation, no reward, no resets);
* ``rollout_islands``: the same with MuJoCo's default flags, constraint-island discovery on (``build_model`` skips
  it for one-tree models: bit-identical results, less work), to show what that option is worth;
* ``envpool_sync`` / ``envpool_async``: EnvPool's ``<Task>-v5`` with 2 threads (async: ``num_envs=2N``,
  ``batch_size=N``, send/recv);
* ``gym_sync``: gymnasium's ``SyncVectorEnv`` of ``<Task>-v5``.

Besides wall-clock steps/s it records the process CPU time per agent step (all threads), which stays meaningful
when other processes load the machine: wall ratios then measure scheduler share as much as efficiency.

    python benchmarks/bench_envs.py [--quick] [--envs ant] [--num-envs 64 256] [--backend mujoco|mjx]

Writes ``benchmarks/results/envs_cpu.json`` and ``.md`` (``envs_<backend>_<device>`` for other backends): median, min
and max over repeats, ratios, machine.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sample_fast.envs import make
from sample_fast.envs.physics import build_model
from sample_fast.envs.tasks import TASKS, resolve_options

from sample_fast.benchmark import harness

NUM_ACTION_BATCHES = 16  # random action batches generated before timing and cycled through


class Contender:
    """Something that steps N envs: ``step(k)`` does one agent step with action batch k; ``close()``."""

    name: str
    frame_skip: int

    def step(self, k: int) -> None: ...

    def close(self) -> None: ...


class Ours(Contender):
    def __init__(self, task: str, n: int, backend: str, num_threads: int, seed: int) -> None:
        opts = {"num_threads": num_threads} if backend == "mujoco" else {}
        self.env = make(task, n, backend=backend, seed=seed, **opts)
        self.name, self.frame_skip = f"ours_{backend}", self.env.frame_skip
        rng = np.random.default_rng(seed)
        lo, hi = self.env.action_spec.low.numpy(), self.env.action_spec.high.numpy()
        self.actions = [
            torch.from_numpy(rng.uniform(lo, hi, (n, *self.env.action_spec.shape)).astype(np.float32)).to(
                self.env.device
            )
            for _ in range(NUM_ACTION_BATCHES)
        ]
        self.env.reset()

    def step(self, k: int) -> None:
        self.env.step(self.actions[k % NUM_ACTION_BATCHES])

    def close(self) -> None:
        self.env.close()


class RawRollout(Contender):
    def __init__(self, task: str, n: int, num_threads: int, seed: int, mujoco_defaults: bool = False) -> None:
        import mujoco
        from mujoco import rollout

        t = TASKS[task]
        self.name, self.frame_skip = "rollout_islands" if mujoco_defaults else "rollout", t.frame_skip
        self.model = build_model(t, resolve_options(t, {}, {}))
        if mujoco_defaults:  # MuJoCo's default: constraint-island discovery on (build_model skips it for one tree)
            self.model.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_ISLAND)
        self.datas = [mujoco.MjData(self.model) for _ in range(num_threads)]
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        d = mujoco.MjData(self.model)
        mujoco.mj_forward(self.model, d)
        s0 = np.zeros(mujoco.mj_stateSize(self.model, spec))
        mujoco.mj_getState(self.model, d, s0, spec)
        self.state = np.tile(s0, (n, 1))
        self.out = np.zeros((n, self.frame_skip, s0.size))
        rng = np.random.default_rng(seed)
        lo, hi = self.model.actuator_ctrlrange[:, 0], self.model.actuator_ctrlrange[:, 1]
        self.controls = [rng.uniform(lo, hi, (n, 1, self.model.nu)) for _ in range(NUM_ACTION_BATCHES)]
        self.rollout = rollout.Rollout(nthread=num_threads)

    def step(self, k: int) -> None:
        self.rollout.rollout(
            self.model, self.datas, self.state, self.controls[k % NUM_ACTION_BATCHES], nstep=self.frame_skip,
            state=self.out,
        )  # fmt: skip
        self.state[:] = self.out[:, -1]

    def close(self) -> None:
        self.rollout.close()


class EnvPool(Contender):
    def __init__(self, task: str, n: int, num_threads: int, seed: int, asynchronous: bool) -> None:
        import envpool

        t = TASKS[task]
        self.name = "envpool_async" if asynchronous else "envpool_sync"
        self.asynchronous = asynchronous
        num = 2 * n if asynchronous else n
        self.env = envpool.make(
            t.envpool_id, env_type="gymnasium", num_envs=num, batch_size=n, seed=seed, num_threads=num_threads
        )
        self.frame_skip = int(self.env.config.get("frame_skip", t.frame_skip))
        rng = np.random.default_rng(seed)
        shape = (n, *self.env.action_space.shape)
        lo, hi = self.env.action_space.low, self.env.action_space.high
        self.actions = [rng.uniform(lo, hi, shape) for _ in range(NUM_ACTION_BATCHES)]
        if asynchronous:
            self.env.async_reset()
        else:
            self.env.reset()

    def step(self, k: int) -> None:
        a = self.actions[k % NUM_ACTION_BATCHES]
        if self.asynchronous:
            info = self.env.recv()[-1]
            self.env.send(a, info["env_id"])
        else:
            self.env.step(a)

    def close(self) -> None:
        self.env.close()


class GymSync(Contender):
    def __init__(self, task: str, n: int, seed: int) -> None:
        import gymnasium as gym

        t = TASKS[task]
        self.name, self.frame_skip = "gym_sync", t.frame_skip
        self.env = gym.vector.SyncVectorEnv([lambda: gym.make(t.gymnasium_id) for _ in range(n)])
        rng = np.random.default_rng(seed)
        sp = self.env.action_space
        self.actions = [rng.uniform(sp.low, sp.high).astype(sp.dtype) for _ in range(NUM_ACTION_BATCHES)]
        self.env.reset(seed=seed)

    def step(self, k: int) -> None:
        self.env.step(self.actions[k % NUM_ACTION_BATCHES])

    def close(self) -> None:
        self.env.close()


def _time(c: Contender, n: int, num_steps: int) -> tuple[float, float]:
    """Agent steps per wall second, and this process's CPU time (all its threads) per agent step in µs."""
    t = harness.time_calls(c.step, num_steps)
    return n * num_steps / t.wall_s, t.cpu_s / (n * num_steps) * 1e6


def run_case(task: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    makers: list[Callable[[], Contender]] = [lambda: Ours(task, n, args.backend, args.num_threads, args.seed)]
    if not args.no_peers:
        makers.append(lambda: RawRollout(task, n, args.num_threads, args.seed))
        makers.append(lambda: RawRollout(task, n, args.num_threads, args.seed, mujoco_defaults=True))
        makers.append(lambda: EnvPool(task, n, args.num_threads, args.seed, asynchronous=False))
        makers.append(lambda: EnvPool(task, n, args.num_threads, args.seed, asynchronous=True))
        if not args.no_gym:
            makers.append(lambda: GymSync(task, n, args.seed))
    contenders: list[Contender] = []
    for mk in makers:
        try:
            contenders.append(mk())
        except Exception as e:  # a peer that does not install here is reported, not fatal
            print(f"  skipped a contender: {type(e).__name__}: {e}")
    # Size each timed block to ~args.seconds at a nominal rate, per contender (slow ones get fewer steps).
    nominal = {"gym_sync": 5000.0}
    steps = {c.name: max(3, int(args.seconds * nominal.get(c.name, 12000.0) / n)) for c in contenders}
    try:
        for c in contenders:  # warm-up (compilation, caches, thread start)
            for k in range(args.warmup_steps):
                c.step(k)
        # PERF: round-robin so background load spreads over all contenders
        timed = harness.interleave(
            {c.name: lambda _r, c=c: _time(c, n, steps[c.name]) for c in contenders}, args.repeats
        )
    finally:
        for c in contenders:
            c.close()
    rates = {name: [rate for rate, _ in xs] for name, xs in timed.items()}
    cpu_us = {name: [cpu for _, cpu in xs] for name, xs in timed.items()}
    out: dict[str, Any] = {"task": task, "num_envs": n, "frame_skip": contenders[0].frame_skip, "results": {}}
    for c in contenders:
        stats = harness.spread(rates[c.name])  # median, min, max, quartiles, repeats
        out["results"][c.name] = {
            **stats,
            "physics_steps_per_s": stats["median"] * c.frame_skip,
            # Load-robust efficiency: CPU time the contender's process spent per agent step (all threads).
            "cpu_us_per_step": harness.median(cpu_us[c.name]),
        }
    ours = out["results"][contenders[0].name]["median"]
    ours_cpu = out["results"][contenders[0].name]["cpu_us_per_step"]
    others = [name for name in out["results"] if name != contenders[0].name]
    out["ratios"] = {f"ours/{name}": ours / out["results"][name]["median"] for name in others}
    # > 1 means ours needs less CPU per step than the peer: the ratio to expect on an idle machine
    out["cpu_efficiency_ratios"] = {
        f"ours/{name}": out["results"][name]["cpu_us_per_step"] / ours_cpu for name in others
    }
    # Paired by round (each round times every contender back to back, so a load change hits a pair alike): the
    # median of the per-round ratios, and the share of rounds in which ours was at least 1.1x the peer.
    ours_r = rates[contenders[0].name]
    out["paired_ratios"] = {f"ours/{name}": harness.paired_ratio(ours_r, rates[name]) for name in others}
    out["rounds_at_1_1x"] = {f"ours/{name}": harness.share_at_least(ours_r, rates[name], 1.1) for name in others}
    # The ceiling: raw stepping of the same model (no cfrc_ext, observation, reward or resets) against each EnvPool
    # mode (and against the same stepping with MuJoCo's default flags). Ours cannot beat a peer by more than this
    # without stepping MuJoCo faster than MuJoCo.
    if "rollout" in rates:
        out["ceiling"] = {
            f"rollout/{name}": harness.paired_ratio(rates["rollout"], rates[name])
            for name in others
            if name.startswith("envpool") or name == "rollout_islands"
        }
    return out


#: Packages the Markdown names (the JSON's ``machine.packages`` has the harness's whole list).
VERSIONS = ("mujoco", "gymnasium", "envpool", "numpy", "torch", "jax", "mujoco-mjx")


def machine_info(quiet: dict[str, Any]) -> dict[str, Any]:
    """The harness's machine record, plus this report's original names: ``cpu``, ``cores``, ``versions``."""
    m = harness.machine_record(quiet)
    return {**m, "cpu": m["cpu_model"], "cores": m["cpu_count"], "versions": {k: m["packages"][k] for k in VERSIONS}}


def to_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Env-only throughput ({report['backend']} backend)",
        "",
        f"Agent steps/s, median of {report['args']['repeats']} repeats (min-max in brackets), "
        f"{report['args']['num_threads']} threads where configurable. Machine: {m['cpu']}, {m['cores']} cores; "
        f"load average {report['load_before']} before, {report['load_after']} after. "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        "",
    ]
    if report.get("quiet"):
        lines += [harness.quiet_line(report["quiet"]), ""]
    for case in report["cases"]:
        lines += [
            f"## {case['task']}, {case['num_envs']} envs, frame_skip {case['frame_skip']}",
            "",
            "| contender | steps/s | physics steps/s | CPU µs per step |",
            "|---|---|---|---|",
        ]
        for name, r in case["results"].items():
            lines.append(
                f"| {name} | {r['median']:,.0f} [{r['min']:,.0f}-{r['max']:,.0f}] | {r['physics_steps_per_s']:,.0f} "
                f"| {r['cpu_us_per_step']:.1f} |"
            )
        lines += ["", "Throughput ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in case["ratios"].items()), ""]
        lines += [
            "CPU-efficiency ratios (peer's CPU per step / ours): "
            + ", ".join(f"{k} = {v:.2f}" for k, v in case["cpu_efficiency_ratios"].items()),
            "",
        ]
        if case.get("paired_ratios"):
            lines += [
                "Paired by round (median of per-round ratios; share of rounds >= 1.1x): "
                + ", ".join(
                    f"{k} = {v:.3f} ({case['rounds_at_1_1x'][k]:.0%})" for k, v in case["paired_ratios"].items()
                ),
                "",
            ]
        if case.get("ceiling"):
            lines += [
                "Ceiling (raw rollout stepping of our model / the peer, paired by round): "
                + ", ".join(f"{k} = {v:.3f}" for k, v in case["ceiling"].items()),
                "",
            ]
    if report.get("notes"):
        lines += ["## Notes", "", report["notes"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat of ~0.3 s per contender (smoke run)")
    p.add_argument("--envs", nargs="+", default=["ant"], choices=sorted(TASKS), help="tasks")
    p.add_argument("--num-envs", nargs="+", type=int, default=[64, 256], help="batch sizes")
    p.add_argument("--backend", default="mujoco", help="our backend: mujoco (default) or mjx")
    p.add_argument("--num-threads", type=int, default=2, help="threads for ours, rollout and EnvPool")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per contender (median reported)")
    p.add_argument("--seconds", type=float, default=1.5, help="approximate length of one timed repeat")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-peers", action="store_true", help="time only ours")
    p.add_argument("--no-gym", action="store_true", help="skip gymnasium SyncVectorEnv (slow)")
    p.add_argument("--out", default=None, help="output stem (default benchmarks/results/envs_<cpu|gpu>)")
    p.add_argument("--notes", default="", help="free text added to the markdown report")
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.seconds, args.warmup_steps = 1, 0.3, 5
    quiet = harness.check_quiet_from_args(args)
    report: dict[str, Any] = {
        "backend": args.backend,
        "args": vars(args),
        "machine": machine_info(quiet),
        "quiet": quiet,
        "load_before": harness.load_average(),
        "cases": [],
        "notes": args.notes,
    }
    for task in args.envs:
        for n in args.num_envs:
            print(f"{task} x {n}:")
            case = run_case(task, n, args)
            for name, r in case["results"].items():
                print(
                    f"  {name:>14}: {r['median']:>9,.0f} steps/s  [{r['min']:,.0f}-{r['max']:,.0f}]  "
                    f"{r['cpu_us_per_step']:.1f} CPU µs/step"
                )
            print("  throughput " + ", ".join(f"{k} = {v:.2f}" for k, v in case["ratios"].items()))
            print("  cpu-efficiency " + ", ".join(f"{k} = {v:.2f}" for k, v in case["cpu_efficiency_ratios"].items()))
            print("  paired " + ", ".join(f"{k} = {v:.3f}" for k, v in case["paired_ratios"].items()))
            if case.get("ceiling"):
                print("  ceiling " + ", ".join(f"{k} = {v:.3f}" for k, v in case["ceiling"].items()))
            report["cases"].append(case)
    report["load_after"] = harness.load_average()
    device = "gpu" if args.backend == "mjx" and torch.cuda.is_available() else "cpu"
    name = f"envs_{device}" if args.backend == "mujoco" else f"envs_{args.backend}_{device}"
    stem = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    harness.write_results(*harness.split_stem(stem), report, to_markdown(report))
    print(f"wrote {stem}.json and {stem}.md (load average {report['load_before']} -> {report['load_after']})")


if __name__ == "__main__":
    main()
