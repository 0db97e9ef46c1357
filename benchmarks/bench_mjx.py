"""MJX Ant benchmark: env-only steps/s and compile time per batch size, with MuJoCo C on the same model options.

Each (option set, batch size) case runs in its own subprocess with a hard timeout, because MJX on the CPU has been
seen to hang inside XLA (see /work/shared/docs/peers.md); a hung or failed case is recorded, not fatal. MuJoCo C runs
through ``make(..., backend="mujoco")`` (raw ``mujoco.mj_step`` when that backend is missing) in the same run, so the
ratio is meaningful on a busy machine. Throughput is env steps (agent actions) per second; physics steps are
``frame_skip`` (5 for Ant) times that.

    python benchmarks/bench_mjx.py                       # CPU: batch 32..1024, writes benchmarks/results/mjx_cpu.*
    python benchmarks/bench_mjx.py --quick               # tiny sizes, a smoke test of this script
    python benchmarks/bench_mjx.py --device cuda --batch-sizes 1024,4096,16384,65536 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from sample_fast.benchmark import harness

#: The two model option sets: gymnasium's Ant as is, and the MJX speed settings (feet-only contacts, 1 solver
#: iteration, 4 line-search iterations; Brax's Ant uses the same kind of settings).
OPTION_SETS: dict[str, dict[str, Any]] = {
    "gymnasium": {},
    "fast": {"contacts": "feet", "solver_iterations": 1, "ls_iterations": 4},
}


def run_case(
    backend: str, option_set: str, num_envs: int, device: str, seconds: float, task: str = "ant", seed: int = 0
) -> dict:
    """Build one env, time it; runs inside the case subprocess. Returns a result row."""
    import torch
    from sample_fast.envs import make

    opts = dict(OPTION_SETS[option_set])
    t0 = time.perf_counter()
    if backend == "mujoco-raw":
        return run_raw_mujoco(option_set, num_envs, seconds, task)
    env = make(task, num_envs, backend=backend, device=device, seed=seed, **opts)
    build_s = time.perf_counter() - t0
    env.reset(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    nu = env.action_spec.shape[0]
    actions = [(torch.rand(num_envs, nu, generator=gen) * 2 - 1).to(env.device) for _ in range(8)]
    for a in actions[:2]:  # warm-up: first dispatch, allocator
        env.step(a)
    done = [0]

    def step(k: int) -> None:
        r = env.step(actions[k % len(actions)])
        if (k + 1) % 4 == 0:
            done[0] += int((r.terminated | r.truncated).sum())  # SYNC: tiny, every 4th step

    t = harness.run_for(step, seconds, min_calls=3)
    num_steps, elapsed = t.calls, t.wall_s
    env.close()
    return {
        "backend": backend,
        "task": task,
        "option_set": option_set,
        "num_envs": num_envs,
        "device": str(device),
        "env_steps_per_s": num_steps * num_envs / elapsed,
        "physics_steps_per_s": num_steps * num_envs * env.frame_skip / elapsed,
        "num_steps": num_steps,
        "compile_s": getattr(env, "compile_s", None),
        "build_s": build_s,
        "episodes_ended_sampled": done[0],
    }


def run_raw_mujoco(option_set: str, num_envs: int, seconds: float, task_name: str = "ant") -> dict:
    """MuJoCo C without the env layer, one thread: ``mj_step(nstep=frame_skip)`` + ``mj_rnePostConstraint``."""
    import mujoco
    import numpy as np
    from sample_fast.envs import physics, tasks

    task = tasks.TASKS[task_name]
    opts = tasks.resolve_options(task, OPTION_SETS[option_set], {})
    model, frame_skip = physics.build_model(task, opts), opts["frame_skip"]
    datas = [mujoco.MjData(model) for _ in range(num_envs)]
    rng = np.random.default_rng(0)

    def step(_k: int) -> None:
        for d in datas:
            d.ctrl[:] = rng.uniform(-1, 1, model.nu)
            mujoco.mj_step(model, d, nstep=frame_skip)
            mujoco.mj_rnePostConstraint(model, d)
            if not np.isfinite(d.qvel).all():
                mujoco.mj_resetData(model, d)

    t = harness.run_for(step, seconds, min_calls=3)
    num_steps, elapsed = t.calls, t.wall_s
    return {
        "backend": "mujoco-raw",
        "task": task_name,
        "option_set": option_set,
        "num_envs": num_envs,
        "device": "cpu",
        "env_steps_per_s": num_steps * num_envs / elapsed,
        "physics_steps_per_s": num_steps * num_envs * frame_skip / elapsed,
        "num_steps": num_steps,
        "compile_s": None,
        "build_s": None,
    }


def spawn_case(
    backend: str, option_set: str, num_envs: int, device: str, seconds: float, timeout_s: float, task: str = "ant"
) -> dict:
    """Run one case in a fresh interpreter; a timeout or crash becomes an ``error`` row."""
    case = {"backend": backend, "option_set": option_set, "num_envs": num_envs, "device": device, "seconds": seconds}
    case["task"] = task
    return harness.run_case_in_subprocess(__file__, case, timeout_s, " (MJX hang or slow compile)")


def mujoco_backend() -> str:
    try:
        import sample_fast.envs.mujoco_env  # noqa: F401

        return "mujoco"
    except ImportError:
        return "mujoco-raw"


def to_markdown(result: dict) -> str:
    lines = [
        f"# MJX {result.get('task', 'ant')} benchmark ({result['device']})",
        "",
        f"{result['when']}, {result['host']}; jax {result['versions'].get('jax')}, mujoco "
        f"{result['versions'].get('mujoco')}. Env steps/s (x frame_skip = physics), {result['seconds']} s per case; "
        "MuJoCo C measured in the same run on the same model options. Report, not a target.",
        *([harness.quiet_line(result["quiet"])] if result.get("quiet") else []),
        "",
        "| option set | num_envs | MJX steps/s | compile s | MuJoCo C steps/s | MJX / C |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    c_rows = {(r["option_set"], r["num_envs"]): r for r in result["rows"] if r["backend"] != "mjx"}
    for r in result["rows"]:
        if r["backend"] != "mjx":
            continue
        same_set = [c for (o, _), c in c_rows.items() if o == r["option_set"] and "error" not in c]
        c = c_rows.get((r["option_set"], r["num_envs"])) or (same_set[-1] if same_set else None)
        c_sps = c.get("env_steps_per_s") if c else None
        if "error" in r:
            lines.append(f"| {r['option_set']} | {r['num_envs']} | {r['error'][:60]} | | {_fmt(c_sps)} | |")
            continue
        ratio = f"{r['env_steps_per_s'] / c_sps:.2f}" if c_sps else ""
        lines.append(
            f"| {r['option_set']} | {r['num_envs']} | {r['env_steps_per_s']:.0f} | {r['compile_s']:.1f} | "
            f"{_fmt(c_sps)} | {ratio} |"
        )
    lines += ["", f"MuJoCo C backend: `{result['c_backend']}`, {result['c_threads']}.", ""]
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return f"{x:.0f}" if x else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:k]")
    p.add_argument("--batch-sizes", default=None, help="comma-separated num_envs (default: 32,128,512,1024 on cpu)")
    p.add_argument("--option-sets", default="gymnasium,fast", help=f"comma-separated of {sorted(OPTION_SETS)}")
    p.add_argument("--seconds", type=float, default=None, help="timed seconds per case (default 10; quick 1)")
    p.add_argument("--case-timeout-s", type=float, default=600.0, help="hard limit per case (compile included)")
    p.add_argument("--no-mujoco", action="store_true", help="skip the MuJoCo C comparison")
    p.add_argument("--c-batch-sizes", default=None, help="num_envs for MuJoCo C (default: the MJX sizes; 1024 on GPU)")
    p.add_argument("--task", default=None, help="task to run (default ant; halfcheetah with --quick)")
    p.add_argument("--quick", action="store_true", help="halfcheetah, batch 4, fast options, 1 s: a smoke test")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results, or $OUT if set)")
    p.add_argument("--name", default=None, help="output file stem (default mjx_<device type>)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)

    if args.case:  # child process: one case
        c = json.loads(args.case)
        row = run_case(c["backend"], c["option_set"], c["num_envs"], c["device"], c["seconds"], c.get("task", "ant"))
        harness.print_case_result(row)
        return 0

    on_gpu = args.device.startswith("cuda")
    # --quick uses HalfCheetah: its Euler integrator compiles ~3x faster than Ant's RK4 on the CPU.
    task = args.task or ("halfcheetah" if args.quick else "ant")
    if args.quick:
        sizes, sets, seconds = [4], ["fast"], args.seconds or 1.0
    else:
        default_sizes = "1024,4096,16384,65536" if on_gpu else "32,128,512,1024"
        sizes = [int(s) for s in (args.batch_sizes or default_sizes).split(",")]
        sets, seconds = args.option_sets.split(","), args.seconds or 10.0
    c_sizes = [int(s) for s in args.c_batch_sizes.split(",")] if args.c_batch_sizes else ([1024] if on_gpu else sizes)
    if args.quick:
        c_sizes = sizes
    unknown = [s for s in sets if s not in OPTION_SETS]
    if unknown:
        p.error(f"unknown option set(s) {unknown}; choose from {sorted(OPTION_SETS)}")
    out_dir = args.out or os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    stem = args.name or ("mjx_gpu" if on_gpu else "mjx_cpu") + ("_quick" if args.quick else "")

    c_backend = mujoco_backend()
    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": f"{machine['hostname']} ({machine['cpu_count']} CPUs)",
        "device": args.device,
        "task": task,
        "seconds": seconds,
        "versions": {
            "jax": machine["packages"]["jax"],
            "mujoco": machine["packages"]["mujoco"],
            "python": machine["python"],
        },
        "c_backend": c_backend,
        "c_threads": "all cores (num_threads default)" if c_backend == "mujoco" else "1 thread",
        "machine": machine,
        "quiet": quiet,
        "rows": [],
    }
    for option_set in sets:
        for n in sizes:
            if not args.no_mujoco and n in c_sizes:
                row = spawn_case(c_backend, option_set, n, "cpu", seconds, args.case_timeout_s, task)
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
            row = spawn_case("mjx", option_set, n, args.device, seconds, args.case_timeout_s, task)
            print(json.dumps(row), flush=True)
            result["rows"].append(row)
            # Written after every case so a run killed by an outer timeout still leaves its results.
            harness.write_results(out_dir, stem, result, to_markdown(result))
    print(to_markdown(result))
    failed = [r for r in result["rows"] if "error" in r]
    return 1 if failed and args.quick else 0


if __name__ == "__main__":
    sys.exit(main())
