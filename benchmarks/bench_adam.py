"""torch's fused Adam against its default (foreach) Adam on the CPU, as a learner lever (issue #14).

    python benchmarks/bench_adam.py            # -> benchmarks/results/adam_cpu.{json,md}

Both implementations run in this one process, interleaved round by round (``harness.interleave``), 1 torch thread
(the learner's on 2 cores for Ant), on the trainer's policies:

* ``step``: one ``optimizer.step()`` over the parameters of the default Ant policy (2x64 tanh actor and critic,
  22k parameters in 13 tensors) and of the Atari policy (Nature CNN + 512 units, 1.7M parameters), fixed gradients;
* ``update``: one ``Learner.train`` of a T=64 x B=64 Ant batch (V-trace targets, 4 epochs x 4 minibatches of 1024:
  16 Adam steps), the learner's optimizer swapped for each implementation on the same parameters.

Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))

from bench_distributed import make_batch, make_learner, median_train_ms  # noqa: E402

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
IMPLS = {"foreach": {"foreach": True}, "fused": {"fused": True}}


def atari_params() -> list[torch.Tensor]:
    from sample_fast.envs import Spec

    from sample_fast.policy import ActorCritic, PolicyConfig

    obs, act = Spec((4, 84, 84), torch.uint8), Spec((), torch.int64, num_actions=6)
    policy = ActorCritic(obs, act, PolicyConfig(encoder="nature_cnn", hidden_sizes=[512], activation="relu"))
    return list(policy.parameters())


def step_case(params: list[torch.Tensor], impl: str, calls: int):
    """``round -> mean µs`` of ``calls`` steps of a fresh optimizer of ``impl`` (its state made by 3 steps first)."""
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.Adam(params, lr=1e-4, eps=1e-5, **IMPLS[impl])
    for _ in range(3):
        opt.step()

    def run(_round: int) -> float:
        return harness.time_calls(lambda _k: opt.step(), calls).wall_s / calls * 1e6

    return run


def update_case(impl: str, batches: list, updates: int):
    learner = make_learner([64, 64], "tanh")
    learner.optimizer = torch.optim.Adam(learner.params, lr=learner.cfg.lr, eps=learner.cfg.adam_eps, **IMPLS[impl])
    learner.train(batches[0])  # warm-up: numba V-trace compile, Adam state

    def run(i: int) -> float:
        return median_train_ms(learner, batches, i * updates, updates)

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300, help="optimizer steps per round (Ant policy; Atari: / 10)")
    p.add_argument("--updates", type=int, default=3, help="Learner.train calls per round")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--name", default="adam_cpu")
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < 10 or args.updates < 1:
        p.error("--rounds >= 1, --calls >= 10 and --updates >= 1")
    quiet = harness.check_quiet_from_args(args, log=print)
    torch.set_num_threads(1)
    ant_learner = make_learner([64, 64], "tanh")  # seeded: the same initial policy as each update case's learner
    ant = list(ant_learner.params)
    atari = atari_params()
    batches = [make_batch(ant_learner.policy, seed=i) for i in range(args.updates * args.rounds + 1)]
    cases = {}
    for impl in IMPLS:
        cases[f"step ant {impl}"] = step_case(ant, impl, args.calls)
        cases[f"step atari {impl}"] = step_case(atari, impl, max(10, args.calls // 10))
        cases[f"update ant {impl}"] = update_case(impl, batches, args.updates)
    rounds = harness.interleave(cases, args.rounds)
    rows = []
    lines = [
        "# torch's fused Adam against the default (foreach) on the CPU",
        "",
        harness.quiet_line(quiet),
        "",
        f"1 torch thread; {args.rounds} interleaved rounds in one process. step: mean of {args.calls} "
        f"`optimizer.step()` calls per round ({max(10, args.calls // 10)} for the Atari policy); update: median of "
        f"{args.updates} `Learner.train` calls per round (T=64 x B=64 Ant batch, 4 epochs x 4 minibatches: 16 steps).",
        "",
        "| what | unit | foreach (median, min-max) | fused (median, min-max) | fused / foreach time |",
        "|---|---|---:|---:|---:|",
    ]
    for what, unit in (("step ant", "µs per step"), ("step atari", "µs per step"), ("update ant", "ms per update")):
        a, b = rounds[f"{what} foreach"], rounds[f"{what} fused"]
        ratio = harness.paired_ratio(b, a)
        rows.append({"case": what, "unit": unit, "foreach": a, "fused": b, "fused_over_foreach": ratio})
        sa, sb = harness.spread(a), harness.spread(b)
        lines.append(
            f"| {what} | {unit} | {sa['median']:.1f} ({sa['min']:.1f}-{sa['max']:.1f}) | "
            f"{sb['median']:.1f} ({sb['min']:.1f}-{sb['max']:.1f}) | {ratio:.2f}x |"
        )
    lines += ["", "Below 1.00x the fused step is faster. Per-round values are in the JSON file."]
    record = {"machine": harness.machine_record(quiet), "args": vars(args), "rows": rows}
    paths = harness.write_results(args.out, args.name, record, "\n".join(lines))
    print("\n".join(lines))
    print(paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
