"""Learning curves of feed-forward and recurrent policies on a partially observed task (docs/recurrent.md).

    python benchmarks/bench_recurrent.py run --out DIR [--seconds 240]   # trains the runs (nice -n 10), one at a time
    python benchmarks/bench_recurrent.py curves --runs DIR               # -> benchmarks/results/recurrent_pomdp.*

``run``: HalfCheetah with the velocities removed from its observation (task option
``include_velocities_in_observation=false``: 8 joint positions, no velocities), the trainer's defaults otherwise,
``run.time_limit_s`` seconds each, for an MLP (the default 64x64) and a GRU policy (64-unit MLP encoder, 64-unit
GRU). The run directories are named ``<env>_<policy>_s<seed>``. ``curves``: their progress.csv files -> return
against env steps and wall time (CSV, JSON, Markdown, PNG), read at the end (equal wall time) and at the
shortest run's env steps (equal env steps). Speed of the recurrent sampler itself: the FPS suite's inference_rnn
stage (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
from pathlib import Path

from sample_fast.benchmark import harness

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "recurrent_pomdp"
ENV = "halfcheetah"
#: policy variant -> overrides (besides the env's); the MLP is the trainer's default policy
POLICIES = {
    "mlp": [],
    "gru": ["policy.rnn=gru", "policy.rnn_size=64", "policy.hidden_sizes=[64]"],
}
TASK = ["env=halfcheetah", "+env.options.include_velocities_in_observation=false"]


def command(policy: str, seconds: float, seed: int, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "sample_fast.train", *TASK, *POLICIES[policy], f"run.time_limit_s={seconds:g}",
            f"run.seed={seed}", "logging=quiet", "logging.interval_s=10", f"run.dir={run_dir}"]  # fmt: skip


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for policy in POLICIES:
        cmd = command(policy, args.seconds, args.seed, out / f"{ENV}_{policy}_s{args.seed}")
        print(" ".join(cmd), flush=True)
        with open(out / f"{ENV}_{policy}_s{args.seed}.log", "w") as log:
            subprocess.run(["nice", "-n", "10", *cmd], stdout=log, stderr=subprocess.STDOUT, check=True,
                           timeout=args.seconds + 180)  # fmt: skip


def _read(path: Path) -> list[tuple[float, float, float]]:
    with path.open() as f:
        rows = [(float(r["env_steps"]), float(r["wall_s"]), float(r["episode_return_mean"] or "nan"))
                for r in csv.DictReader(f)]  # fmt: skip
    return [r for r in rows if not math.isnan(r[2])]


def curves(args: argparse.Namespace) -> dict:
    runs = {}  # policy -> rows
    for policy in POLICIES:
        path = Path(args.runs) / f"{ENV}_{policy}_s{args.seed}" / "progress.csv"
        if path.exists():
            runs[policy] = _read(path)
    if not runs:
        raise SystemExit(f"no progress.csv of {ENV}_<policy>_s{args.seed} runs under {args.runs}")
    mark = min(rows[-1][0] for rows in runs.values())  # the shortest run's env steps
    summary = []
    for policy, rows in runs.items():
        at_mark = [r[2] for r in rows if r[0] <= mark]
        summary.append({
            "policy": policy, "overrides": POLICIES[policy], "final_return": rows[-1][2], "env_steps": rows[-1][0],
            "wall_s": rows[-1][1], "env_steps_per_s": rows[-1][0] / rows[-1][1],
            "equal_steps_mark": mark, "return_at_mark": at_mark[-1] if at_mark else math.nan,
            "command": " ".join(["python", "-m", "sample_fast.train", *TASK, *POLICIES[policy],
                                 f"run.time_limit_s={args.seconds:g}", f"run.seed={args.seed}"]),
        })  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / f"{NAME}.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", "env_steps", "wall_s", "episode_return_mean"])
        writer.writerows([policy, *row] for policy, rows in runs.items() for row in rows)
    lines = [f"# {ENV} without velocities in the observation: MLP vs GRU (CPU, shared 2-core machine)", "",
             args.note, "", "Commands (seed 0, one run at a time, `nice -n 10`):", ""]  # fmt: skip
    lines += [f"- {s['policy']}: `{s['command']}`" for s in summary]
    lines += ["", f"| policy | return at {mark / 1e3:.0f}k env steps (equal steps) | return at the end (equal wall "
              "time) | env steps | wall s | env steps/s |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    lines += [f"| {s['policy']} | {s['return_at_mark']:.0f} | {s['final_return']:.0f} | {s['env_steps']:.0f} | "
              f"{s['wall_s']:.0f} | {s['env_steps_per_s']:.0f} |" for s in summary]  # fmt: skip
    out = {"meta": {"runs": str(args.runs), "note": args.note, "env": ENV, "task": TASK}, "summary": summary}
    harness.write_results(RESULTS, NAME, out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(runs)
    return out


def _plot(runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for policy, rows in runs.items():
        axes[0].plot([r[0] for r in rows], [r[2] for r in rows], label=policy)
        axes[1].plot([r[1] for r in rows], [r[2] for r in rows], label=policy)
    axes[0].set(title=f"{ENV} (no velocities): return vs env steps", xlabel="env steps", ylabel="return (mean 100)")
    axes[1].set(title=f"{ENV} (no velocities): return vs wall time", xlabel="wall s", ylabel="return (mean 100)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{NAME}.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True, help="folder for the run directories and their logs")
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("curves")
    c.add_argument("--runs", required=True)
    c.add_argument("--seconds", type=float, default=240.0, help="the runs' run.time_limit_s (for the command line)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--note", default="")
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    (run if args.cmd == "run" else curves)(args)


if __name__ == "__main__":
    main()
