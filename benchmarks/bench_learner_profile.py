"""Where the learner's update spends its CPU time, and how much of it matrix products need (issue #14).

    python benchmarks/bench_learner_profile.py     # -> benchmarks/results/learner_profile_cpu.{json,md}

The trainer's default Ant update (``bench_distributed.make_learner``: the 64x64 tanh policy on Ant's 105-dim
observation, a T=64 x B=64 batch, V-trace targets, 4 epochs x 4 minibatches of 1024), 1 torch thread (the learner's
share of 2 cores). Reported:

* the update's CPU time (``time.process_time``, median over ``--updates`` calls after a warm-up call);
* one update under ``torch.profiler``: the operators' self CPU time in groups (matrix products, tanh forward and
  backward, minibatch gathers, the optimizer, everything else) and the floating-point operations of its matrix
  products (2 m k n per product, from the recorded shapes);
* this core's single-thread sgemm rate on a large product (2048^3) and on the update's own shapes, measured in the
  same process: the update's matrix products divided by the large-product rate is what the update would cost if it
  were nothing but matrix products at this core's best rate (a lower bound for any implementation of the same
  update in float32 on this core).

Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_distributed import B, T, make_batch, make_learner  # noqa: E402

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"}
#: operator name -> group (first match by prefix wins; the rest is "other")
GROUPS = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("tanh and its backward", ("_NumpyTanh", "aten::tanh")),
    ("minibatch gathers (index)", ("aten::index",)),
    ("optimizer (Adam, zero_grad)", ("Optimizer.", "aten::_fused_adam")),
)
#: the update's product shapes (m, k, n), and the large one that gives the core's rate
SHAPES = ((1024, 105, 64), (1024, 64, 64), (1024, 64, 8), (64, 1024, 105), (64, 1024, 64), (2048, 2048, 2048))


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if any(name.startswith(p) for p in prefixes):
            return group
    return "other"


def sgemm_rates(repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of ``a @ b`` per shape (best of ``repeats``)."""
    gen = torch.Generator().manual_seed(0)
    rates = {}
    for m, k, n in SHAPES:
        a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
        calls = max(3, int(2e8 // (2 * m * k * n)))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                a @ b
            best = min(best, (time.perf_counter() - t0) / calls)
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return rates


def profile_update(learner, batch) -> tuple[dict[str, float], float, float]:
    """One update under the profiler: self CPU ms per group, total self CPU ms, matrix-product GFLOP."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        learner.train(batch)
    groups: dict[str, float] = {}
    flops = 0.0
    for ev in prof.events():
        groups[group_of(ev.name)] = groups.get(group_of(ev.name), 0.0) + ev.self_cpu_time_total / 1e3
        if ev.name in MATMUL_OPS and ev.name != "aten::matmul":
            shapes = [s for s in ev.input_shapes if s]
            if ev.name == "aten::addmm":
                shapes = shapes[1:]  # (bias, mat1, mat2)
            if len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
                (m, k), (_, n) = shapes[0], shapes[1]
                flops += 2.0 * m * k * n
    return groups, sum(groups.values()), flops / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=7, help="timed updates (median)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="learner_profile_cpu")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    quiet = harness.check_quiet_from_args(args, log=print)
    learner = make_learner([64, 64], "tanh", seed=0)
    batches = [make_batch(learner.policy, seed=i) for i in range(args.updates + 2)]
    learner.train(batches[0])  # numba V-trace compile, warm caches
    cpu_ms = []
    for b in batches[1 : args.updates + 1]:
        t0 = time.process_time()
        learner.train(b)
        cpu_ms.append((time.process_time() - t0) * 1e3)
    update_ms = harness.median(cpu_ms)
    groups, profiled_ms, gflop = profile_update(learner, batches[-1])
    rates = sgemm_rates()
    peak = rates["2048x2048x2048"]
    floor_ms = gflop / peak * 1e3
    samples = T * B
    mm_ms = groups.get("matrix products", 0.0)
    print(f"update {update_ms:.1f} ms CPU ({update_ms / samples * 1e3:.1f} us per env step); matrix products "
          f"{mm_ms:.1f} of {profiled_ms:.1f} profiled ms, {gflop:.2f} GFLOP; core sgemm {peak:.1f} GFLOP/s; "
          f"matrix-products-only floor {floor_ms:.1f} ms")  # fmt: skip
    data = {"machine": harness.machine_record(quiet), "quiet": quiet, "threads": 1, "samples_per_update": samples,
            "update_cpu_ms": cpu_ms, "profiled_groups_ms": groups, "profiled_ms": profiled_ms,
            "matmul_gflop": gflop, "sgemm_gflops": rates, "floor_ms": floor_ms}  # fmt: skip
    md = [
        "# The learner's update on the CPU: where its time goes, and the matrix products' share",
        "",
        harness.quiet_line(quiet),
        "",
        f"{harness.now_utc()}, {harness.cpu_model()}; 1 torch thread. The trainer's default Ant update: 64x64 tanh "
        f"policy, 105-dim observations, T={T} x B={B} = {samples} samples, V-trace targets, 4 epochs x 4 minibatches "
        "of 1024 (`python benchmarks/bench_learner_profile.py`).",
        "",
        f"Update CPU time: **{update_ms:.1f} ms** (median of {args.updates}; "
        f"{min(cpu_ms):.1f}-{max(cpu_ms):.1f}), **{update_ms / samples * 1e3:.1f} µs per env step**.",
        "",
        f"One update under `torch.profiler` ({profiled_ms:.1f} ms of operators' self CPU time, profiler overhead "
        "included):",
        "",
        "| group | ms | share |",
        "|---|---:|---:|",
    ]
    for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        md.append(f"| {group} | {ms:.1f} | {ms / profiled_ms:.0%} |")
    md += [
        "",
        "This core's sgemm rate, float32, 1 thread (best of 5):",
        "",
        "| m x k x n | GFLOP/s |",
        "|---|---:|",
    ]
    md += [f"| {shape} | {rate:.1f} |" for shape, rate in rates.items()]
    md += [
        "",
        f"The update's matrix products: **{gflop:.2f} GFLOP**, {gflop / (mm_ms / 1e3):.1f} GFLOP/s inside the update "
        f"(profiled). At the large product's {peak:.1f} GFLOP/s they take **{floor_ms:.1f} ms** "
        f"({floor_ms / samples * 1e3:.1f} µs per env step, {floor_ms / update_ms:.0%} of today's update): the cost of "
        "this update on this core if everything else were free.",
        "",
    ]
    print(harness.write_results(args.out, args.name, data, "\n".join(md)))


if __name__ == "__main__":
    main()
