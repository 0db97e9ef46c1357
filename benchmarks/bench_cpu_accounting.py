"""Where the sampler's time goes on a small CPU (issue #14): wall, process CPU and main-thread CPU per env step.

    python benchmarks/bench_cpu_accounting.py     # -> benchmarks/results/cpu_accounting.{json,md}

The FPS suite's env-only and +inference stages (Ant, mujoco backend, the trainer's 128 envs, 2 simulator threads per
env, 1 torch thread), each in a fresh interpreter, interleaved for ``--rounds`` rounds:

* ``env``: ``env.step`` on one 128-env batch (the caller's thread steps its share of the envs inline);
* ``inference``: the serial-mode ``Sampler`` as the suite's inference stage runs it: 2 groups of 64 envs, each
  with its own 2 simulator threads, ``policy.act`` and the slot writes on the main thread (the mujoco backend's
  defaults: ``recv`` only waits for the simulator threads);
* ``inference caller_steps=true``: the same with the mujoco backend's ``caller_steps=True``: ``recv`` steps the
  group's not yet claimed envs on the main thread instead of blocking until the simulator threads finish them.

Each case reports, per 128 env steps: the wall time, the process's CPU time (all threads) and the main thread's CPU
time. ``cores busy`` is CPU / wall; ``idle`` is cores x wall - CPU, the core time nobody used. For ``inference`` the
main thread's CPU is broken down by phase (``env.recv``, ``policy.act``, ``env.send``, the rest of the sampler).
Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
CASES = ("env", "inference", "inference caller_steps=true")


def _timed(acc: dict[str, int], name: str, fn):
    def wrapper(*args, **kwargs):
        t = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[name] = acc.get(name, 0) + time.thread_time_ns() - t

    return wrapper


def run_case(case: dict) -> dict:
    import torch
    from sample_fast.envs import make

    from sample_fast import wiring
    from sample_fast.benchmark import stages
    from sample_fast.sampler import SamplerConfig

    torch.set_num_threads(1)
    n, splits, threads, seconds = case["num_envs"], case["num_splits"], case["sim_threads"], case["seconds"]
    kind = case["kind"]
    acc: dict[str, int] = {}
    closers = []
    if kind == "env":
        env = make("ant", n, backend="mujoco", seed=0, num_threads=threads)
        closers.append(env.close)
        env.reset(seed=0)
        bank = stages.random_action_bank(env)

        def step(k: int) -> None:
            env.step(bank[k % len(bank)])

    else:
        caller_steps = kind == "inference caller_steps=true"
        envs = [make("ant", n // splits, backend="mujoco", seed=0, num_threads=threads, caller_steps=caller_steps)
                for _ in range(splits)]  # fmt: skip
        policy = stages.build_policy(envs[0].observation_spec, envs[0].action_spec, [64, 64], "cpu")
        scfg = SamplerConfig(rollout_len=64, num_splits=splits, num_slots=2 * splits, seed=0)
        store, sampler = wiring.build_sampler(envs, policy, scfg, version_fn=lambda: 0, split_seeds=list(range(splits)))
        closers.append(sampler.close)
        for e in envs:
            e.recv = _timed(acc, "env.recv", e.recv)
            e.send = _timed(acc, "env.send", e.send)
        sampler._act = _timed(acc, "policy.act", sampler._act)
        sampler.advance = _timed(acc, "sampler.advance (all)", sampler.advance)

        def step(k: int) -> None:
            sampler.advance(wait_s=0.0)
            slot = store.acquire_ready(timeout_s=0.0)
            while slot is not None:  # no learner: READY slots go straight back, as in the suite's stage
                store.release(slot)
                slot = store.acquire_ready(timeout_s=0.0)

    try:
        harness.run_for(step, 1.0)  # warm-up
        acc.clear()
        main = harness.run_for(step, seconds, cpu_clock=time.thread_time)
        acc_main = dict(acc)
        acc.clear()
        proc = harness.run_for(step, seconds)
    finally:
        for close in closers:
            close()
    per = n  # env steps per call (inference: one pass over both groups)
    out = {
        **case,
        "env_steps_per_s": proc.calls * per / proc.wall_s,
        "wall_ms_per_128": proc.wall_s / proc.calls * 1e3 * 128 / per,
        "cpu_ms_per_128": proc.cpu_s / proc.calls * 1e3 * 128 / per,
        "main_cpu_ms_per_128": main.cpu_s / main.calls * 1e3 * 128 / per,
        "phases_us_per_128": {k: v / main.calls / 1e3 * 128 / per for k, v in acc_main.items()},
        "cores": len(os.sched_getaffinity(0)),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="per timed block (two blocks per case)")
    parser.add_argument("--num-envs", type=int, default=128)
    parser.add_argument("--sim-threads", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per case")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="cpu_accounting")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    if args.case:
        harness.print_case_result(run_case(json.loads(args.case)))
        return
    quiet = harness.check_quiet_from_args(args, log=print)
    base = {"num_envs": args.num_envs, "num_splits": 2, "sim_threads": args.sim_threads, "seconds": args.seconds}

    def case_fn(kind: str):
        def run(_round: int) -> dict:
            res = harness.run_case_in_subprocess(__file__, {**base, "kind": kind}, args.timeout_s)
            if "error" in res:
                raise RuntimeError(f"{kind}: {res['error']}")
            return res

        return run

    results = harness.interleave({k: case_fn(k) for k in CASES}, args.rounds)
    env_sps = [r["env_steps_per_s"] for r in results["env"]]
    rows = []
    for kind in CASES:
        rs = results[kind]
        cores = rs[0]["cores"]
        med = {k: harness.median([r[k] for r in rs]) for k in ("env_steps_per_s", "wall_ms_per_128",
                                                               "cpu_ms_per_128", "main_cpu_ms_per_128")}  # fmt: skip
        row = {
            "case": kind,
            **med,
            "per_round_env_steps_per_s": [r["env_steps_per_s"] for r in rs],
            "share_of_env_only": harness.paired_ratio([r["env_steps_per_s"] for r in rs], env_sps),
            "cores_busy": med["cpu_ms_per_128"] / med["wall_ms_per_128"],
            "idle_ms_per_128": cores * med["wall_ms_per_128"] - med["cpu_ms_per_128"],
            "phases_us_per_128": {
                k: harness.median([r["phases_us_per_128"][k] for r in rs]) for k in rs[0]["phases_us_per_128"]
            },  # fmt: skip
        }
        rows.append(row)
        print(f"{kind:24s} {row['env_steps_per_s']:8.0f}/s  share {row['share_of_env_only']:.3f}  wall "
              f"{row['wall_ms_per_128']:.2f}  cpu {row['cpu_ms_per_128']:.2f}  main {row['main_cpu_ms_per_128']:.2f}"
              f"  idle {row['idle_ms_per_128']:.2f} ms per 128 env steps")  # fmt: skip
    data = {"machine": harness.machine_record(quiet), "quiet": quiet, "settings": base, "rounds": args.rounds,
            "results": results, "rows": rows}  # fmt: skip
    md = [
        f"# CPU accounting of the sampler: Ant, mujoco backend, {args.num_envs} envs, {args.sim_threads} simulator "
        "threads per env, 1 torch thread",
        "",
        harness.quiet_line(quiet),
        "",
        f"{args.rounds} interleaved rounds, each case in a fresh interpreter; medians over rounds; ratios paired per "
        "round. Per 128 env steps: wall, process CPU (all threads), main-thread CPU; idle = cores x wall - CPU.",
        "",
        "| case | env steps/s (per round) | share of env-only | wall ms | CPU ms | main-thread CPU ms | cores busy | "
        "idle core-ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(f"| {r['case']} | {' / '.join(f'{x:.0f}' for x in r['per_round_env_steps_per_s'])} | "
                  f"{r['share_of_env_only']:.2f}x | {r['wall_ms_per_128']:.2f} | {r['cpu_ms_per_128']:.2f} | "
                  f"{r['main_cpu_ms_per_128']:.2f} | {r['cores_busy']:.2f} | {r['idle_ms_per_128']:.2f} |")  # fmt: skip
    inf = next(r for r in rows if r["case"] == "inference")
    ph = inf["phases_us_per_128"]
    rest = ph.get("sampler.advance (all)", 0.0) - sum(v for k, v in ph.items() if k != "sampler.advance (all)")
    md += [
        "",
        "Main-thread CPU of `inference` by phase (µs per 128 env steps, i.e. per pass over both groups): "
        + ", ".join(f"{k} {v:.0f}" for k, v in ph.items() if k != "sampler.advance (all)")
        + f", the rest of `Sampler.advance` (slot writes, bookkeeping) {rest:.0f}; all of `advance` "
        f"{ph.get('sampler.advance (all)', 0.0):.0f}.",
    ]
    print(harness.write_results(args.out, args.name, data, "\n".join(md) + "\n"))


if __name__ == "__main__":
    main()
