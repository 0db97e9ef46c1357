"""Time to a mean game score: ``env=pong`` (a run's progress.csv) against the CleanRL-style peer (its updates.csv)
and Sample Factory's Atari example (the curve.csv of ``benchmarks/sf_pong_race.py``).

Every log carries the mean score of the last 100 finished games (ours: ``episode_return_mean``, the trainer's
``logging.return_window=100``; the CleanRL-style peer: ``score_mean100``; Sample Factory: its ``Avg episode reward``
over ``--stats_avg`` = 100 games, which for Pong is the game score), wall-clock seconds and env steps. This script
reads them, finds the first time each mean reaches each threshold, and writes a Markdown table and one PNG with the
curves over wall-clock time and over env steps:

    .venv/bin/python benchmarks/pong_race.py --ours benchmarks/results/train_pong_default/progress.csv \\
        --peer benchmarks/results/race_pong_cleanrl/updates.csv --out benchmarks/results/race_pong_cleanrl/race

Without ``--peer`` it tabulates our run alone (``benchmarks/gpu_pong.sh``: the GPU run's times to a score).
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass

THRESHOLDS = (-15.0, -10.0, -5.0, 0.0, 5.0, 10.0, 18.0, 20.0)
#: wall-clock marks of the table (those within the shortest run; its end is always added)
TIME_MARKS_S = (60, 120, 300, 600, 1800, 3600, 5400, 7200)


@dataclass
class Curve:
    name: str
    wall_s: list[float]
    env_steps: list[float]
    score: list[float]  # mean of the last 100 games; NaN before the first game ends

    def first_reach(self, threshold: float) -> tuple[float, float] | None:
        """(wall_s, env_steps) of the first row whose mean score is >= threshold; None if never."""
        for w, s, v in zip(self.wall_s, self.env_steps, self.score, strict=True):
            if not math.isnan(v) and v >= threshold:
                return w, s
        return None

    def at_time(self, wall_s: float) -> float:
        """The mean score of the last row at or before ``wall_s`` (NaN if none)."""
        return _last_at_or_before(self.wall_s, self.score, wall_s)

    def at_steps(self, env_steps: float) -> float:
        """The mean score of the last row at or before ``env_steps`` (NaN if none)."""
        return _last_at_or_before(self.env_steps, self.score, env_steps)

    def median_fps(self) -> float:
        rates = sorted(
            (s1 - s0) / (w1 - w0)
            for w0, w1, s0, s1 in zip(self.wall_s, self.wall_s[1:], self.env_steps, self.env_steps[1:], strict=False)
            if w1 > w0
        )
        return rates[len(rates) // 2] if rates else float("nan")


def _last_at_or_before(xs: list[float], values: list[float], x: float) -> float:
    """``values`` at the last of the ascending ``xs`` that is <= ``x``; NaN if the first is already past it."""
    best = float("nan")
    for xi, v in zip(xs, values, strict=True):
        if xi > x:
            break
        best = v
    return best


def _float(x: str) -> float:
    return float(x) if x not in ("", "nan") else float("nan")


def read_ours(path: str) -> Curve:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return Curve(
        "sample_fast env=pong",
        [float(r["wall_s"]) for r in rows],
        [float(r["env_steps"]) for r in rows],
        [_float(r["episode_return_mean"]) for r in rows],
    )


def read_peer(path: str) -> Curve:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return Curve(
        "CleanRL-style PPO",
        [float(r["wall_s"]) for r in rows],
        [float(r["global_step"]) for r in rows],
        [_float(r["score_mean100"]) for r in rows],
    )


def read_sf(path: str) -> Curve:
    """``benchmarks/sf_pong_race.py``'s curve.csv (its clock, launch_s, counts SF's start-up)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return Curve(
        "Sample Factory 2.1.1",
        [float(r["launch_s"]) for r in rows],
        [float(r["env_steps"]) for r in rows],
        [_float(r["episode_return_mean"]) for r in rows],
    )


def table(curves: list[Curve]) -> str:
    def cell(hit: tuple[float, float] | None, curve: Curve) -> str:
        if hit is None:
            return f"not reached in {curve.wall_s[-1]:,.0f} s ({curve.env_steps[-1] / 1e6:.2f}M)"
        return f"{hit[0]:,.0f} s ({hit[1] / 1e6:.2f}M)"

    lines = ["| mean score of the last 100 games | " + " | ".join(c.name for c in curves) + " |"]
    lines.append("| --- |" + " --- |" * len(curves))
    for th in THRESHOLDS:
        lines.append(f"| >= {th:+g} | " + " | ".join(cell(c.first_reach(th), c) for c in curves) + " |")
    end = min(c.wall_s[-1] for c in curves)
    marks = [m for m in TIME_MARKS_S if m < end] + [end]
    for m in marks:
        lines.append(f"| at {m:,.0f} s | " + " | ".join(f"{c.at_time(m):+.2f}" for c in curves) + " |")
    last = min(c.env_steps[-1] for c in curves)
    for m in [m for m in (0.5e6, 1e6, 1.5e6, 2e6, 3e6, 4e6) if m <= last] + [last]:
        lines.append(f"| at {m / 1e6:.2f}M env steps | " + " | ".join(f"{c.at_steps(m):+.2f}" for c in curves) + " |")
    lines.append("| median env steps/s | " + " | ".join(f"{c.median_fps():,.0f}" for c in curves) + " |")
    return "\n".join(lines)


def plot(curves: list[Curve], png_path: str, title: str = "Pong-v5 on a 2-core CPU") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in curves:
        a.plot([w / 60 for w in c.wall_s], c.score, label=c.name)
        b.plot([s / 1e6 for s in c.env_steps], c.score, label=c.name)
    a.set_xlabel("training wall-clock (minutes)")
    b.set_xlabel("env steps (millions)")
    for ax in (a, b):
        ax.set_ylabel("mean score, last 100 games")
        ax.axhline(0, color="gray", lw=0.5)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True, help="progress.csv of an env=pong run")
    p.add_argument("--peer", help="updates.csv of benchmarks/cleanrl_ppo_atari.py")
    p.add_argument("--sf", help="curve.csv of benchmarks/sf_pong_race.py (omit both peers: our run alone)")
    p.add_argument("--out", required=True, help="output prefix: <out>.md and <out>.png")
    p.add_argument("--title", default="Pong-v5 on a 2-core CPU", help="the figure's title")
    args = p.parse_args(argv)
    curves = [read_ours(args.ours)] + ([read_peer(args.peer)] if args.peer else [])
    curves += [read_sf(args.sf)] if args.sf else []
    text = table(curves)
    with open(args.out + ".md", "w") as f:
        f.write(text + "\n")
    plot(curves, args.out + ".png", args.title)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
