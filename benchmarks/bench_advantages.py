"""Benchmark of the advantage kernels (sample_fast.extensions) against torchrl, in one run on one machine.

CPU mode (default; T=64, B=8192, float32): numba GAE / V-trace vs torchrl's ``generalized_advantage_estimate``,
``vec_generalized_advantage_estimate`` and ``vtrace_advantage_estimate`` (in torchrl's own ``[B, T, 1]`` layout),
our torch reference loop, and a plain memory copy (the bandwidth ceiling); plus numba's first-call JIT time with a
cold and a warm cache (fresh subprocesses, temporary NUMBA_CACHE_DIR). ``--device cuda`` (T=64, B=65536): the numba
CUDA kernels vs torchrl on CUDA vs a torch.compile'd reference, against the device copy bandwidth.

    python benchmarks/bench_advantages.py [--quick] [--device cpu|cuda] [--threads N]

Writes benchmarks/results/advantages{,_cuda}.json and .md. Methods are timed interleaved (one call each per round)
so a load spike from another process hits every method alike; medians of the rounds are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sample_fast.benchmark import harness

RESULTS_DIR = Path(__file__).resolve().parent / "results"
GAMMA, LAM = 0.99, 0.95

# Cold/warm JIT probe, run in a fresh interpreter: import, then the first call of each public function.
JIT_PROBE = """
import json, time
t0 = time.perf_counter()
import torch
from sample_fast.extensions import compute_gae, compute_vtrace
t_import = time.perf_counter() - t0
T, B = {num_steps}, {num_envs}
x = torch.randn(T, B)
done = torch.zeros(T, B, dtype=torch.bool)
t0 = time.perf_counter()
compute_gae(x, x, x[0], done, done, gamma=0.99, lam=0.95, backend="numba")
t_gae = time.perf_counter() - t0
t0 = time.perf_counter()
compute_vtrace(x, x, x, x, x[0], done, done, gamma=0.99, backend="numba")
t_vtrace = time.perf_counter() - t0
print(json.dumps({{"import_s": t_import, "first_gae_s": t_gae, "first_vtrace_s": t_vtrace}}))
"""


def make_inputs(num_steps: int, num_envs: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Time-major float32 rollout with ~1% terminated and ~1% truncated steps."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_steps, num_envs)
    inputs = dict(
        behavior_logp=torch.randn(shape, generator=gen) * 0.5,
        target_logp=torch.randn(shape, generator=gen) * 0.5,
        rewards=torch.randn(shape, generator=gen),
        values=torch.randn(shape, generator=gen),
        bootstrap_value=torch.randn(num_envs, generator=gen),
        terminated=torch.rand(shape, generator=gen) < 0.01,
        truncated=torch.rand(shape, generator=gen) < 0.01,
        truncation_values=torch.randn(shape, generator=gen),
    )
    return {k: v.to(device) for k, v in inputs.items()}


def to_torchrl(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchrl's native layout [B, T, 1], with next_state_value per step (V[t+1], truncation value, bootstrap)."""
    next_values = torch.cat([inputs["values"][1:], inputs["bootstrap_value"][None]])
    next_values = torch.where(inputs["truncated"], inputs["truncation_values"], next_values)

    def layout(x: torch.Tensor) -> torch.Tensor:
        return x.t().unsqueeze(-1).contiguous()

    return dict(
        state_value=layout(inputs["values"]),
        next_state_value=layout(next_values),
        reward=layout(inputs["rewards"]),
        done=layout(inputs["terminated"] | inputs["truncated"]),
        terminated=layout(inputs["terminated"]),
        log_pi=layout(inputs["target_logp"]),
        log_mu=layout(inputs["behavior_logp"]),
    )


def bytes_moved(inputs: dict[str, torch.Tensor], vtrace: bool) -> int:
    """Minimum traffic of one call: every input read once, both [T, B] outputs written once."""
    names = ["rewards", "values", "bootstrap_value", "terminated", "truncated", "truncation_values"]
    if vtrace:
        names += ["behavior_logp", "target_logp"]
    read = sum(inputs[n].numel() * inputs[n].element_size() for n in names)
    return read + 2 * inputs["rewards"].numel() * inputs["rewards"].element_size()


def time_interleaved(methods: dict[str, Callable[[], object]], rounds: int, sync: Callable[[], None]) -> dict:
    """Warm each method up, then time one call of each per round; return per-method median/min seconds."""
    for fn in methods.values():
        fn()
        fn()
    sync()
    cases = {
        name: lambda _r, fn=fn: harness.time_calls(lambda _k: fn(), 1, sync).wall_s for name, fn in methods.items()
    }
    samples = harness.interleave(cases, rounds)
    return {name: {"median_s": harness.median(s), "min_s": min(s), "rounds": len(s)} for name, s in samples.items()}


def jit_times(num_steps: int, num_envs: int) -> dict:
    """First-call times in fresh processes: cold (empty NUMBA_CACHE_DIR) then warm (the cache just written)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="numba_cache_") as cache_dir:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
        for label in ("cold_cache", "warm_cache"):
            code = JIT_PROBE.format(num_steps=num_steps, num_envs=num_envs)
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, check=True
            )
            out[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def machine_info(quiet: dict) -> dict:
    """The harness's machine record, plus this report's original keys: the versions it names at the top level,
    ``loadavg_start`` and, with CUDA, the CUDA version (``loadavg_end`` is added after the run)."""
    m = harness.machine_record(quiet)
    info = {**m, **{pkg: m["packages"][pkg] for pkg in ("torch", "numba", "numpy", "torchrl")}}
    info["loadavg_start"] = harness.load_1min()
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
    return info


# ---------------------------------------------------------------------------------------------------------------
# CPU mode


def bench_cpu(args: argparse.Namespace) -> dict:
    from sample_fast.extensions import compute_gae, compute_vtrace
    from sample_fast.extensions._numba_cpu import gae_numba, vtrace_numba
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
        vtrace_advantage_estimate,
    )

    torch.set_num_threads(args.threads)  # compute_* hands torch's thread count to numba: same threads for both
    num_steps, num_envs = args.num_steps, args.num_envs or 8192
    inputs = make_inputs(num_steps, num_envs, "cpu")
    rl = to_torchrl(inputs)
    gae_in = [inputs[k] for k in ("rewards", "values", "bootstrap_value", "terminated", "truncated")]
    vt_in = [inputs["behavior_logp"], inputs["target_logp"], *gae_in]
    tv = inputs["truncation_values"]
    arrays = [x.numpy() for x in gae_in] + [tv.numpy()]
    out = [torch.empty_like(inputs["rewards"]).numpy() for _ in range(2)]
    logps = [inputs["behavior_logp"].numpy(), inputs["target_logp"].numpy()]
    gae_bytes, vt_bytes = bytes_moved(inputs, False), bytes_moved(inputs, True)
    copy_src = torch.empty(gae_bytes // 2, dtype=torch.uint8)  # clone reads + writes gae_bytes in all
    copy_src_vt = torch.empty(vt_bytes // 2, dtype=torch.uint8)

    methods = {
        "numba_gae": lambda: compute_gae(*gae_in, gamma=GAMMA, lam=LAM, truncation_values=tv, backend="numba"),
        "numba_gae_1thread": lambda: gae_numba(*arrays, GAMMA, LAM, *out, num_threads=1),
        "torchrl_gae": lambda: generalized_advantage_estimate(
            GAMMA, LAM, rl["state_value"], rl["next_state_value"], rl["reward"], rl["done"], rl["terminated"]
        ),
        "torchrl_vec_gae": lambda: vec_generalized_advantage_estimate(
            GAMMA, LAM, rl["state_value"], rl["next_state_value"], rl["reward"], rl["done"], rl["terminated"]
        ),
        "reference_gae": lambda: compute_gae(*gae_in, gamma=GAMMA, lam=LAM, truncation_values=tv, backend="torch"),
        "numba_vtrace": lambda: compute_vtrace(*vt_in, gamma=GAMMA, truncation_values=tv, backend="numba"),
        "numba_vtrace_1thread": lambda: vtrace_numba(*logps, *arrays, GAMMA, 1.0, 1.0, 1.0, *out, num_threads=1),
        "torchrl_vtrace": lambda: vtrace_advantage_estimate(
            GAMMA,
            rl["log_pi"],
            rl["log_mu"],
            rl["state_value"],
            rl["next_state_value"],
            rl["reward"],
            rl["done"],
            rl["terminated"],
        ),  # fmt: skip
        "reference_vtrace": lambda: compute_vtrace(*vt_in, gamma=GAMMA, truncation_values=tv, backend="torch"),
        "copy_gae_bytes": lambda: copy_src.clone(),
        "copy_vtrace_bytes": lambda: copy_src_vt.clone(),
    }
    timings = time_interleaved(methods, args.rounds, sync=lambda: None)
    result = {
        "mode": "cpu",
        "num_steps": num_steps,
        "num_envs": num_envs,
        "dtype": "float32",
        "threads": args.threads,
        "numba_threading_layer": numba_threading_layer(),
        "bytes_moved": {"gae": gae_bytes, "vtrace": vt_bytes},
        "timings": timings,
    }
    add_bandwidth(result, {"gae": "copy_gae_bytes", "vtrace": "copy_vtrace_bytes"})
    add_ratios(
        result,
        [
            ("torchrl_gae", "numba_gae"),
            ("torchrl_vec_gae", "numba_gae"),
            ("torchrl_vtrace", "numba_vtrace"),
            ("reference_gae", "numba_gae"),
            ("reference_vtrace", "numba_vtrace"),
            ("numba_gae_1thread", "numba_gae"),
            ("numba_vtrace_1thread", "numba_vtrace"),
        ],
    )
    ratios = result["ratios_median"]
    result["targets"] = {
        "numba_gae >= 10x torchrl_gae": ratios["torchrl_gae / numba_gae"] >= 10,
        "numba_gae >= 2x torchrl_vec_gae": ratios["torchrl_vec_gae / numba_gae"] >= 2,
        "numba_vtrace >= 10x torchrl_vtrace": ratios["torchrl_vtrace / numba_vtrace"] >= 10,
    }
    if not args.quick:
        result["jit"] = jit_times(num_steps, num_envs)
    return result


def numba_threading_layer() -> str:
    import numba

    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel ran: sizes below MIN_PARALLEL_ELEMENTS take the serial build
        return "none (serial kernels only)"


def add_bandwidth(result: dict, copy_for: dict[str, str]) -> None:
    """GB/s = bytes moved / time, for each kernel and for the copy of the same number of bytes; from the median
    (the headline) and from the fastest round (least disturbed by other processes on a shared machine)."""
    for stat in ("median", "min"):
        bandwidth = {}
        for name, t in result["timings"].items():
            kind = "vtrace" if "vtrace" in name else "gae"
            bandwidth[name] = result["bytes_moved"][kind] / t[f"{stat}_s"] / 1e9
        result[f"gb_per_s_{stat}"] = bandwidth
        result[f"fraction_of_copy_bandwidth_{stat}"] = {
            name: gbps / bandwidth[copy_for["vtrace" if "vtrace" in name else "gae"]]
            for name, gbps in bandwidth.items()
            if not name.startswith("copy")
        }


def add_ratios(result: dict, pairs: list[tuple[str, str]]) -> None:
    """Speed-ups ``slow / fast`` from medians (the headline) and from the fastest rounds."""
    for stat in ("median", "min"):
        t = {k: v[f"{stat}_s"] for k, v in result["timings"].items()}
        result[f"ratios_{stat}"] = {f"{slow} / {fast}": t[slow] / t[fast] for slow, fast in pairs}


# ---------------------------------------------------------------------------------------------------------------
# CUDA mode


def compiled_reference():
    """torch.compile of the reference loops (T is static: the loop unrolls into a few fused kernels)."""
    from sample_fast.extensions._reference import gae_reference, vtrace_reference

    return torch.compile(gae_reference), torch.compile(vtrace_reference)


def bench_cuda(args: argparse.Namespace) -> dict:
    from sample_fast.extensions import compute_gae, compute_vtrace
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
        vtrace_advantage_estimate,
    )

    num_steps, num_envs = args.num_steps, args.num_envs or 65536
    inputs = make_inputs(num_steps, num_envs, "cuda")
    rl = to_torchrl(inputs)
    gae_in = [inputs[k] for k in ("rewards", "values", "bootstrap_value", "terminated", "truncated")]
    vt_in = [inputs["behavior_logp"], inputs["target_logp"], *gae_in]
    tv = inputs["truncation_values"]
    gae_compiled, vtrace_compiled = compiled_reference()
    gae_bytes, vt_bytes = bytes_moved(inputs, False), bytes_moved(inputs, True)
    copy_src = torch.empty(gae_bytes // 2, dtype=torch.uint8, device="cuda")
    copy_src_vt = torch.empty(vt_bytes // 2, dtype=torch.uint8, device="cuda")
    t0 = time.perf_counter()
    gae_compiled(*gae_in, tv, GAMMA, LAM)
    vtrace_compiled(*vt_in, tv, GAMMA, 1.0, 1.0, 1.0)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0

    methods = {
        "cuda_gae": lambda: compute_gae(*gae_in, gamma=GAMMA, lam=LAM, truncation_values=tv, backend="cuda"),
        "compiled_gae": lambda: gae_compiled(*gae_in, tv, GAMMA, LAM),
        "torchrl_gae": lambda: generalized_advantage_estimate(
            GAMMA, LAM, rl["state_value"], rl["next_state_value"], rl["reward"], rl["done"], rl["terminated"]
        ),
        "torchrl_vec_gae": lambda: vec_generalized_advantage_estimate(
            GAMMA, LAM, rl["state_value"], rl["next_state_value"], rl["reward"], rl["done"], rl["terminated"]
        ),
        "cuda_vtrace": lambda: compute_vtrace(*vt_in, gamma=GAMMA, truncation_values=tv, backend="cuda"),
        "compiled_vtrace": lambda: vtrace_compiled(*vt_in, tv, GAMMA, 1.0, 1.0, 1.0),
        "torchrl_vtrace": lambda: vtrace_advantage_estimate(
            GAMMA,
            rl["log_pi"],
            rl["log_mu"],
            rl["state_value"],
            rl["next_state_value"],
            rl["reward"],
            rl["done"],
            rl["terminated"],
        ),  # fmt: skip
        "copy_gae_bytes": lambda: copy_src.clone(),
        "copy_vtrace_bytes": lambda: copy_src_vt.clone(),
    }
    timings = time_interleaved(methods, args.rounds, sync=torch.cuda.synchronize)
    result = {
        "mode": "cuda",
        "num_steps": num_steps,
        "num_envs": num_envs,
        "dtype": "float32",
        "torch_compile_first_call_s": compile_s,
        "bytes_moved": {"gae": gae_bytes, "vtrace": vt_bytes},
        "timings": timings,
    }
    add_bandwidth(result, {"gae": "copy_gae_bytes", "vtrace": "copy_vtrace_bytes"})
    add_ratios(
        result,
        [
            ("torchrl_gae", "cuda_gae"),
            ("torchrl_vec_gae", "cuda_gae"),
            ("compiled_gae", "cuda_gae"),
            ("torchrl_vtrace", "cuda_vtrace"),
            ("compiled_vtrace", "cuda_vtrace"),
        ],
    )
    return result


# ---------------------------------------------------------------------------------------------------------------
# Report


def to_markdown(result: dict) -> str:
    info = result["machine"]
    lines = [
        f"# Advantage kernels, {result['mode']} (T={result['num_steps']}, B={result['num_envs']}, {result['dtype']})",
        "",
        f"Machine: {info['cpu_model']}, {info['cpu_count']} cores"
        + (f", {info['gpu']}" if result["mode"] == "cuda" else f", {result['threads']} threads")
        + f"; torch {info['torch']}, numba {info['numba']}, torchrl {info['torchrl']}, numpy {info['numpy']}, "
        f"Python {info['python']}. Load average {info['loadavg_start']:.1f} at start, "
        f"{info['loadavg_end']:.1f} at end.",
        *([harness.quiet_line(result["quiet"])] if result.get("quiet") else []),
        "",
        "| method | median ms | min ms | GB/s (median) | of copy (median) | GB/s (min) | of copy (min) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, t in result["timings"].items():
        row = [name, f"{t['median_s'] * 1e3:.3f}", f"{t['min_s'] * 1e3:.3f}"]
        for stat in ("median", "min"):
            frac = result[f"fraction_of_copy_bandwidth_{stat}"].get(name)
            row += [f"{result[f'gb_per_s_{stat}'][name]:.1f}", f"{frac:.0%}" if frac is not None else "ceiling"]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| speed-up | from medians | from fastest rounds |", "| --- | ---: | ---: |"]
    for name, value in result["ratios_median"].items():
        lines.append(f"| {name} | {value:.1f}x | {result['ratios_min'][name]:.1f}x |")
    if "targets" in result:
        lines += ["", "| target | met |", "| --- | --- |"]
        lines += [f"| {name} | {'yes' if ok else 'NO'} |" for name, ok in result["targets"].items()]
    if "jit" in result:
        lines += [
            "",
            "| first call in a fresh process | import torch + extensions s | first GAE s | first V-trace s |",
            "| --- | ---: | ---: | ---: |",
        ]
        for label, j in result["jit"].items():
            lines.append(f"| {label} | {j['import_s']:.2f} | {j['first_gae_s']:.2f} | {j['first_vtrace_s']:.2f} |")
    if "torch_compile_first_call_s" in result:
        lines += ["", f"torch.compile first calls (GAE + V-trace): {result['torch_compile_first_call_s']:.1f} s"]
    lines += [
        "",
        f"GB/s = bytes read + written by one call ({result['bytes_moved']['gae'] / 1e6:.1f} MB for GAE, "
        f"{result['bytes_moved']['vtrace'] / 1e6:.1f} MB for V-trace) / time; the copy rows clone a buffer "
        "of half that size (same traffic) and are the ceiling.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds, no cold-cache JIT probe")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch and numba threads (CPU mode)")
    parser.add_argument("--num-steps", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=None, help="default 8192 (cpu) / 65536 (cuda)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5 quick, 25 full)")
    parser.add_argument("--out", type=Path, default=None, help="output stem (default results/advantages[_cuda])")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (5 if args.quick else 25)
    if args.rounds < 5:
        parser.error("--rounds must be >= 5 (medians of fewer are noise)")
    if args.device == "cuda" and not torch.cuda.is_available():  # before the quiet check and the record
        raise SystemExit("--device cuda needs a CUDA device, and torch.cuda.is_available() is False here")

    quiet = harness.check_quiet_from_args(args)
    machine = machine_info(quiet)
    result = bench_cuda(args) if args.device == "cuda" else bench_cpu(args)
    result["machine"] = machine
    result["machine"]["loadavg_end"] = harness.load_1min()
    result["quiet"] = quiet
    result["quick"] = args.quick
    stem = args.out or RESULTS_DIR / ("advantages" if args.device == "cpu" else "advantages_cuda")
    markdown = to_markdown(result)
    paths = harness.write_results(stem.parent, stem.with_suffix("").name, result, markdown)
    print(markdown)
    print(f"wrote {paths['json']} and {paths['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
