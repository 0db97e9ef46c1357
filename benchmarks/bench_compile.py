"""torch.compile as a lever (issue #14): the policy's acting path and the learner's update, eager against compiled.

    python benchmarks/bench_compile.py            # -> benchmarks/results/compile_cpu.{json,md}

The trainer's default sizes on this machine (configs/algo/appo.yaml, `env=ant`): the 64x64 tanh policy on Ant's
105-dim observation, 1 torch thread per process (the sampler's inference thread, the learner's
``runner.learner_threads`` on 2 cores).

* ``act``: ``ActorCritic.act(obs, with_value=False)`` on 64 observations (one split of the default 128 envs), the
  sampler's call per env step. Compiled: ``torch.compile`` (inductor, the CPU's C++ backend, ``dynamic=False``) of
  the same computation (normalise, actor MLP, Gaussian sample and log-prob).
* ``update``: one ``Learner.train`` of a T=64 x B=64 batch (V-trace targets, 4 epochs x 4 minibatches of 1024).
  Compiled: ``policy.evaluate`` (the minibatch forward, and through AOTAutograd its backward) replaced by its
  ``torch.compile``; the optimizer, the targets and the bookkeeping stay eager.

Eager and compiled are interleaved round by round (``harness.interleave``), so a load change hits both; the compile
time (first call) is reported apart and excluded. Take /tmp/race.lock while it runs (docs/benchmark.md).
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

from bench_distributed import make_batch, make_learner, median_train_ms  # noqa: E402

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
NUM_OBS = 64  # one split of the trainer's 128 envs


def act_cases(calls: int) -> tuple[dict, dict[str, float]]:
    learner = make_learner([64, 64], "tanh")
    policy = learner.policy
    obs = torch.randn(NUM_OBS, policy.obs_dim, generator=torch.Generator().manual_seed(0))

    def eager(o):
        return policy.act(o, with_value=False)

    def raw(o):
        return policy._act_heads(policy._features(o), o.shape[0], False, False)

    compiled = torch.compile(raw, dynamic=False)
    compile_s = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        compiled(obs)
        compile_s["act"] = time.perf_counter() - t0
        a_e, _, _ = eager(obs)
        a_c, _, _ = compiled(obs)
        assert a_e.shape == a_c.shape == (NUM_OBS, policy.act_dim)

    def timed(fn):
        def one_round(_: int) -> float:
            with torch.no_grad():
                for _ in range(20):
                    fn(obs)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(obs)
                return (time.perf_counter() - t0) / calls * 1e6

        return one_round

    return {"act eager": timed(eager), "act compiled": timed(compiled)}, compile_s


def update_cases(updates: int) -> tuple[dict, dict[str, float]]:
    eager_l, comp_l = make_learner([64, 64], "tanh", seed=0), make_learner([64, 64], "tanh", seed=0)
    comp_l.policy.evaluate = torch.compile(comp_l.policy.evaluate, dynamic=False)
    batches = [make_batch(eager_l.policy, seed=i) for i in range(updates + 2)]
    eager_l.train(batches[0])  # numba V-trace compile, warm caches
    t0 = time.perf_counter()
    comp_l.train(batches[0])
    compile_s = {"update": time.perf_counter() - t0}
    state = {"i": 1}

    def timed(learner):
        def one_round(_: int) -> float:
            start, state["i"] = state["i"], state["i"] + updates
            return median_train_ms(learner, batches, start, updates)

        return one_round

    return {"update eager": timed(eager_l), "update compiled": timed(comp_l)}, compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="act calls per round")
    parser.add_argument("--updates", type=int, default=3, help="updates per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="compile_cpu")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    quiet = harness.check_quiet_from_args(args, log=print)
    cases, compile_s = act_cases(args.calls)
    ucases, ucompile = update_cases(args.updates)
    cases.update(ucases)
    compile_s.update(ucompile)
    results = harness.interleave(cases, args.rounds)
    rows = []
    for what, unit in (("act", "us per call"), ("update", "ms per update")):
        e, c = results[f"{what} eager"], results[f"{what} compiled"]
        ratio = harness.paired_ratio(c, e)
        rows.append({"what": what, "unit": unit, "eager": harness.spread(e), "compiled": harness.spread(c),
                     "compiled_over_eager": ratio, "compile_s": compile_s[what]})  # fmt: skip
        print(f"{what}: eager {harness.median(e):.1f}, compiled {harness.median(c):.1f} {unit}: {ratio:.2f}x time")
    data = {"machine": harness.machine_record(quiet), "quiet": quiet, "rounds": args.rounds, "calls": args.calls,
            "updates": args.updates, "threads": 1, "results": results, "rows": rows}  # fmt: skip
    md = [
        "# torch.compile as a lever: the acting path and the learner update, eager vs compiled (CPU)",
        "",
        harness.quiet_line(quiet),
        "",
        f"Ant (105-dim obs), 64x64 tanh policy, 1 torch thread; {args.rounds} interleaved rounds; act: {args.calls} "
        f"calls on {NUM_OBS} observations per round; update: median of {args.updates} `Learner.train` calls of a "
        "T=64 x B=64 batch per round. Compiled: inductor, dynamic=False; compile time excluded.",
        "",
        "| what | unit | eager (median, min-max) | compiled (median, min-max) | compiled / eager time | compile s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        e, c = r["eager"], r["compiled"]
        md.append(f"| {r['what']} | {r['unit']} | {e['median']:.1f} ({e['min']:.1f}-{e['max']:.1f}) | "
                  f"{c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f}) | {r['compiled_over_eager']:.2f}x | "
                  f"{r['compile_s']:.1f} |")  # fmt: skip
    md.append("")
    md.append("Below 1.00x the compiled version is faster. Per-round values are in the JSON file.")
    print(harness.write_results(args.out, args.name, data, "\n".join(md) + "\n"))


if __name__ == "__main__":
    main()
