"""numpy's tanh against torch's on the CPU as a lever (issue #14): the kernel, the acting call, the learner update.

    python benchmarks/bench_tanh.py            # -> benchmarks/results/tanh_cpu.{json,md}

``sample_fast.activations`` routes the policy's tanh (the default MuJoCo policy's activation) through numpy's
ufunc on the CPU; ``activations.KERNEL = "torch"`` (what ``SAMPLE_FAST_TANH=torch`` sets at import) routes it
through ``torch.tanh``. Both kernels run in this one process, interleaved round by round (``harness.interleave``),
1 torch thread (the sampler's inference thread and the learner's on 2 cores):

* ``kernel``: one tanh of a float32 ``[rows, 64]`` tensor (64: one split's acting batch; 1024: a learner minibatch;
  4160: the [T + 1, B] targets pass of a T=64 x B=64 batch), and its error against float64 ``torch.tanh``;
* ``act``: ``ActorCritic.act(obs, with_value=False)`` on 64 observations (the sampler's call per env step);
* ``update``: one ``Learner.train`` of a T=64 x B=64 batch (V-trace targets, 4 epochs x 4 minibatches of 1024).

The end-to-end effect (the FPS suite's +inference and +training) is ``benchmarks/bench_levers.py``'s
``tanh=torch`` variant. Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_distributed import make_batch, make_learner, median_train_ms  # noqa: E402

from sample_fast import activations  # noqa: E402
from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
KERNELS = ("numpy", "torch")
ROWS = (64, 1024, 4160)


def with_kernel(kernel: str, fn):
    def run(r: int) -> float:
        old, activations.KERNEL = activations.KERNEL, kernel
        try:
            return fn(r)
        finally:
            activations.KERNEL = old

    return run


def per_call_us(fn, calls: int) -> float:
    fn()  # warm-up, untimed
    return harness.time_calls(lambda _: fn(), calls).wall_s / calls * 1e6


def kernel_cases(calls: int) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(0)
    cases, errors = {}, {}
    for rows in ROWS:
        x = torch.randn(rows, 64, generator=gen) * 3
        ref = torch.tanh(x.double())
        for kernel in KERNELS:

            def fn(_: int, x=x) -> float:
                return per_call_us(lambda: activations.tanh(x), calls)

            cases[f"kernel {rows} {kernel}"] = with_kernel(kernel, fn)
            old, activations.KERNEL = activations.KERNEL, kernel
            err = activations.tanh(x).double() - ref
            activations.KERNEL = old
            errors[f"{rows} {kernel}"] = {"max_abs": err.abs().max().item(),
                                          "max_rel": (err.abs() / ref.abs().clamp_min(1e-30)).max().item()}  # fmt: skip
    return cases, errors


def act_cases(calls: int) -> dict:
    learner = make_learner([64, 64], "tanh", seed=0)
    policy = learner.policy
    obs = torch.randn(64, policy.obs_dim, generator=torch.Generator().manual_seed(1))

    def fn(_: int) -> float:
        with torch.inference_mode():
            return per_call_us(lambda: policy.act(obs, with_value=False), calls)

    return {f"act {k}": with_kernel(k, fn) for k in KERNELS}


def update_cases(updates: int) -> dict:
    learners = {k: make_learner([64, 64], "tanh", seed=0) for k in KERNELS}
    batches = [make_batch(learners["numpy"].policy, seed=i) for i in range(updates + 2)]
    for k, learner in learners.items():
        with_kernel(k, lambda _, learner=learner: learner.train(batches[0]))(0)  # numba V-trace compile, warm caches

    def timed(learner):
        def one_round(r: int) -> float:
            return median_train_ms(learner, batches, r * updates, updates)

        return one_round

    return {f"update {k}": with_kernel(k, timed(learner)) for k, learner in learners.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="kernel and act calls per round")
    parser.add_argument("--updates", type=int, default=3, help="updates per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="tanh_cpu")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    quiet = harness.check_quiet_from_args(args, log=print)
    cases, errors = kernel_cases(args.calls)
    cases.update(act_cases(args.calls))
    cases.update(update_cases(args.updates))
    results = harness.interleave(cases, args.rounds)
    rows = []
    whats = [(f"kernel {r}", "us per call") for r in ROWS] + [("act", "us per call"), ("update", "ms per update")]
    for what, unit in whats:
        n, t = results[f"{what} numpy"], results[f"{what} torch"]
        ratio = harness.paired_ratio(n, t)
        rows.append({"what": what, "unit": unit, "numpy": harness.spread(n), "torch": harness.spread(t),
                     "numpy_over_torch": ratio})  # fmt: skip
        print(f"{what}: numpy {harness.median(n):.1f}, torch {harness.median(t):.1f} {unit}: {ratio:.2f}x time")
    data = {"machine": harness.machine_record(quiet), "quiet": quiet, "rounds": args.rounds, "calls": args.calls,
            "updates": args.updates, "threads": 1, "errors": errors, "results": results, "rows": rows}  # fmt: skip
    md = [
        "# tanh through numpy against torch.tanh (CPU): the kernel, the acting call, the learner update",
        "",
        harness.quiet_line(quiet),
        "",
        f"1 torch thread; {args.rounds} interleaved rounds. kernel: float32 [rows, 64], {args.calls} calls per "
        f"round; act: `ActorCritic.act(obs, with_value=False)` of the 64x64 tanh policy on 64 Ant observations, "
        f"{args.calls} calls per round; update: median of {args.updates} `Learner.train` calls of a T=64 x B=64 "
        "batch per round (4 epochs x 4 minibatches of 1024).",
        "",
        "| what | unit | numpy (median, min-max) | torch (median, min-max) | numpy / torch time |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        n, t = r["numpy"], r["torch"]
        md.append(f"| {r['what']} | {r['unit']} | {n['median']:.1f} ({n['min']:.1f}-{n['max']:.1f}) | "
                  f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {r['numpy_over_torch']:.2f}x |")  # fmt: skip
    md += ["", "Error against float64 `torch.tanh` of the same float32 input (x ~ 3 N(0, 1)):", "",
           "| rows | kernel | max abs | max rel |", "|---:|---|---:|---:|"]  # fmt: skip
    for key, e in errors.items():
        rows_, kernel = key.split()
        md.append(f"| {rows_} | {kernel} | {e['max_abs']:.2e} | {e['max_rel']:.2e} |")
    md.append("")
    md.append("Below 1.00x numpy is faster. Per-round values are in the JSON file.")
    print(harness.write_results(args.out, args.name, data, "\n".join(md) + "\n"))


if __name__ == "__main__":
    main()
