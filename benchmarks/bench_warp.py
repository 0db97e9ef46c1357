"""MuJoCo Warp (``backend="warp"``) benchmark: kernel compile time with an empty and with a warm kernel cache, env-only
steps/s per batch size, GPU memory on CUDA, and the ``mujoco`` backend (MuJoCo C, all cores) on the same model in the
same run for the ratio.

Each case runs in its own interpreter with a hard timeout, so "first compile" really starts from an empty kernel
cache (a fresh folder under the output folder, deleted afterwards) and "cached" is a second process loading from that
cache, the way a second training run does. Throughput is env steps (agent actions) per second; physics steps are
``frame_skip`` (5 for Ant) times that.

    python benchmarks/bench_warp.py                         # CPU: Ant at 64 worlds -> benchmarks/results/warp_cpu.*
    python benchmarks/bench_warp.py --quick                 # hopper, 4 worlds, 1 s: a smoke test of this script
    python benchmarks/bench_warp.py --device cuda --batch-sizes 4096,16384,65536 --out $OUT   # the GPU suite's call
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from sample_fast.benchmark import harness


def run_case(backend: str, task: str, num_envs: int, device: str, seconds: float, cache_dir: str | None) -> dict:
    """Build one env, time it; runs inside the case subprocess. Returns a result row."""
    import torch
    from sample_fast.envs import make

    opts: dict[str, Any] = {"kernel_cache_dir": cache_dir} if backend == "warp" else {}
    t0 = time.perf_counter()
    env = make(task, num_envs, backend=backend, device=device, seed=0, **opts)
    build_s = time.perf_counter() - t0
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    nu = env.action_spec.shape[0]
    actions = [(torch.rand(num_envs, nu, generator=gen) * 2 - 1).to(env.device) for _ in range(8)]
    for a in actions[:2]:
        env.step(a)
    last: list[Any] = [None]

    def step(k: int) -> None:
        last[0] = env.step(actions[k % len(actions)])

    def finish() -> None:
        if last[0] is not None:
            float(last[0].reward[0])  # SYNC: the device finished every step timed

    t0 = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - t0 < seconds:
        step(calls)
        calls += 1
    finish()
    elapsed = time.perf_counter() - t0
    row = {
        "backend": backend,
        "task": task,
        "num_envs": num_envs,
        "device": str(env.device),
        "env_steps_per_s": calls * num_envs / elapsed,
        "physics_steps_per_s": calls * num_envs * env.frame_skip / elapsed,
        "num_steps": calls,
        "build_s": build_s,
        "compile_s": getattr(env, "compile_s", None),
        "nconmax": getattr(env, "nconmax", None),
        "njmax": getattr(env, "njmax", None),
        "cuda_graph": getattr(env, "cuda_graph", None),
        "num_threads": getattr(env, "num_threads", None),
    }
    if env.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(env.device)
        row["gpu_mem_used_gib"] = (total - free) / 2**30
    env.close()
    return row


def spawn_case(case: dict, timeout_s: float) -> dict:
    """Run one case in a fresh interpreter; a timeout or crash becomes an ``error`` row."""
    row = harness.run_case_in_subprocess(__file__, case, timeout_s)
    if "error" not in row:
        row["cache"] = case.get("cache")
    return row


def to_markdown(result: dict) -> str:
    lines = [
        f"# MuJoCo Warp {result['task']} benchmark ({result['device']})",
        "",
        f"{result['when']}, {result['host']}; mujoco-warp {result['versions'].get('mujoco-warp')}, warp-lang "
        f"{result['versions'].get('warp-lang')}, mujoco {result['versions'].get('mujoco')}. Env steps/s "
        f"(x frame_skip = physics), {result['seconds']} s per case, each case a fresh process. `first` = the first "
        f"process on the kernel cache (empty at the start: {result.get('kernel_cache_was_empty')}), `cached` = a "
        "later process on the same cache. MuJoCo C (`mujoco` backend, all cores) measured in the "
        "same run. Report, not a target.",
        *([harness.quiet_line(result["quiet"])] if result.get("quiet") else []),
        "",
        "| backend | kernel cache | num_envs | env steps/s | physics steps/s | build s | compile s | GPU mem GiB | "
        "warp / C |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    c_rows = {r["num_envs"]: r for r in result["rows"] if r["backend"] == "mujoco" and "error" not in r}
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['backend']} | {r.get('cache') or ''} | {r['num_envs']} | {r['error'][:80]} | | | | | |")
            continue
        c = c_rows.get(r["num_envs"])
        ratio = f"{r['env_steps_per_s'] / c['env_steps_per_s']:.3f}" if c and r["backend"] == "warp" else ""
        mem = f"{r['gpu_mem_used_gib']:.2f}" if r.get("gpu_mem_used_gib") is not None else "-"
        comp = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
        lines.append(
            f"| {r['backend']} | {r.get('cache') or '-'} | {r['num_envs']} | {r['env_steps_per_s']:.0f} | "
            f"{r['physics_steps_per_s']:.0f} | {r['build_s']:.1f} | {comp} | {mem} | {ratio} |"
        )
    lines += [
        "",
        "`build s`: make() to a ready env (model, probe rollouts for the buffer sizes, kernels, warm-up step; on "
        "CUDA the graph capture). `compile s`: the kernel part of it (Warp's build or cache load, first reset and "
        "step).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:k]")
    p.add_argument("--task", default=None, help="task (default ant; hopper with --quick)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated num_envs (default 64 on cpu)")
    p.add_argument("--seconds", type=float, default=None, help="timed seconds per case (default 10; quick 1)")
    p.add_argument("--case-timeout-s", type=float, default=600.0, help="hard limit per case (compile included)")
    p.add_argument("--no-mujoco", action="store_true", help="skip the MuJoCo C comparison")
    p.add_argument("--quick", action="store_true", help="hopper, 4 worlds, 1 s: a smoke test")
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results, or $OUT if set)")
    p.add_argument("--name", default=None, help="output file stem (default warp_<device type>)")
    p.add_argument("--cache-dir", default=None, help="kernel cache to use and keep (default: a fresh temporary one)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)

    if args.case:  # child process: one case
        c = json.loads(args.case)
        row = run_case(c["backend"], c["task"], c["num_envs"], c["device"], c["seconds"], c.get("cache_dir"))
        harness.print_case_result(row)
        return 0

    on_gpu = args.device.startswith("cuda")
    task = args.task or ("hopper" if args.quick else "ant")
    if args.quick:
        sizes, seconds = [4], args.seconds or 1.0
    else:
        sizes = [int(s) for s in (args.batch_sizes or ("4096,16384,65536" if on_gpu else "64")).split(",")]
        seconds = args.seconds or 10.0
    out_dir = args.out or os.environ.get("OUT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    stem = args.name or ("warp_gpu" if on_gpu else "warp_cpu") + ("_quick" if args.quick else "")
    os.makedirs(out_dir, exist_ok=True)

    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": f"{machine['hostname']} ({machine['cpu_count']} CPUs)",
        "device": args.device,
        "task": task,
        "seconds": seconds,
        "versions": {k: machine["packages"].get(k) for k in ("mujoco-warp", "warp-lang", "mujoco", "torch")},
        "machine": machine,
        "quiet": quiet,
        "rows": [],
    }
    if args.cache_dir:  # the caller's cache (the GPU suite's, filled here for its later sections)
        cache_dir = os.path.abspath(args.cache_dir)
        os.makedirs(cache_dir, exist_ok=True)
    else:  # empty: the first case compiles everything
        cache_dir = tempfile.mkdtemp(prefix="warp-kernels-", dir=out_dir)
    result["kernel_cache_was_empty"] = not any(os.scandir(cache_dir))
    try:
        for i, n in enumerate(sizes):
            base = {"task": task, "num_envs": n, "device": args.device, "seconds": seconds, "cache_dir": cache_dir}
            kinds = ["first", "cached"] if i == 0 else ["cached"]
            for kind in kinds:
                row = spawn_case({**base, "backend": "warp", "cache": kind}, args.case_timeout_s)
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
                harness.write_results(out_dir, stem, result, to_markdown(result))
            if not args.no_mujoco and (not on_gpu or n == sizes[0]):
                row = spawn_case({**base, "backend": "mujoco", "device": "cpu"}, args.case_timeout_s)
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
                harness.write_results(out_dir, stem, result, to_markdown(result))
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    print(to_markdown(result))
    failed = [r for r in result["rows"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
