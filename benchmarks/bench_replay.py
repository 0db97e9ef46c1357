"""Prioritized trajectory replay: sampler/update throughput against raw torchrl, and learning curves with replay.

    python benchmarks/bench_replay.py throughput          # -> benchmarks/results/replay_throughput.{json,md}
    python benchmarks/bench_replay.py curves --runs DIR   # progress.csv of runs named <env>_r<ratio>_s<seed>
                                                          # -> benchmarks/results/replay_curves.{json,md,csv,png}

Throughput: every case runs in the same process, interleaved over repeats (the 2 cores are shared with other work,
so compare the ratios in one table, not absolute numbers across tables). Cases:
  * ``sampler/ours``: SegmentPrioritySampler.sample (n draws) + update_priority (n) over a capacity-sized table.
  * ``sampler/torchrl_uniform``: torchrl's RandomSampler through a raw ReplayBuffer (the floor of torchrl's
    machinery; uniform, no priorities).
  * ``sampler/torchrl_prioritized``: torchrl's PrioritizedSampler (sum/min trees in its C++ extension) — recorded
    as unavailable with the error where the extension does not load (torchrl 0.14.1 with torch 2.13 here).
  * ``segments/ours_sample``: TrajectoryReplay.sample (draw + gather [T, n b] + IS weights) vs
    ``segments/torchrl_sample``: raw ReplayBuffer(LazyTensorStorage, RandomSampler).sample of the same segments
    -> the wrapper's overhead. ``segments/ours_add`` vs ``segments/torchrl_extend``: storing one fresh [T, B] batch.
Curves: return against env steps and wall time, per env and replay ratio, median over seeds.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from sample_fast.benchmark import harness

RESULTS = Path(__file__).resolve().parent / "results"


def _us_per_call(fn, inner: int) -> float:
    """Mean µs per call over ``inner`` back-to-back calls of ``fn(k)``."""
    return harness.time_calls(fn, inner).wall_s / inner * 1e6


def throughput(args: argparse.Namespace) -> dict:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer

    from sample_fast.replay import ReplayConfig, SegmentPrioritySampler, TrajectoryReplay

    torch.set_num_threads(1)
    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    rows = []
    # --- sampler alone: index draw + priority update over a table of `capacity` segments -------------------------
    for capacity in args.capacities:
        storage_items = TensorDict({"x": torch.zeros(capacity, 1)}, batch_size=[capacity])
        ours = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=SegmentPrioritySampler(capacity, 0.6))
        ours.extend(storage_items)
        ours.sampler.update_priority(torch.arange(capacity), torch.rand(capacity) + 0.1)
        uniform = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=RandomSampler())
        uniform.extend(storage_items)
        prio_error = None
        try:
            from torchrl.data import PrioritizedSampler

            torchrl_prio = ReplayBuffer(
                storage=LazyTensorStorage(capacity), sampler=PrioritizedSampler(capacity, alpha=0.6, beta=0.4)
            )
            torchrl_prio.extend(storage_items)
        except Exception as e:  # noqa: BLE001 - recorded in the results: the extension does not load here
            torchrl_prio, prio_error = None, f"{type(e).__name__}: {e}"
        num = args.draws
        new_prio = torch.rand(num) + 0.1

        def ours_step(_k, rb=ours, new_prio=new_prio, num=num):
            index = rb.sampler.sample(rb.storage, num)[0]
            rb.sampler.update_priority(index, new_prio)

        def uniform_step(_k, rb=uniform, num=num):
            rb.sampler.sample(rb.storage, num)

        def prio_step(_k, rb=torchrl_prio, new_prio=new_prio, num=num):
            index = rb.sampler.sample(rb.storage, num)[0]
            rb.sampler.update_priority(index, new_prio)

        cases = {"sampler/ours": ours_step, "sampler/torchrl_uniform": uniform_step}
        if torchrl_prio is not None:
            cases["sampler/torchrl_prioritized"] = prio_step
        # interleaved: load changes hit every case alike
        timed = {n: lambda _r, fn=fn: _us_per_call(fn, args.inner) for n, fn in cases.items()}
        times = harness.interleave(timed, args.repeats)
        for name in cases:
            rows.append({"case": name, "capacity": capacity, "draws": num, "us_per_call": harness.median(times[name])})
        if prio_error is not None:
            rows.append({"case": "sampler/torchrl_prioritized", "capacity": capacity, "draws": num,
                         "us_per_call": None, "error": prio_error})  # fmt: skip

    # --- whole segments: our TrajectoryReplay against a raw torchrl buffer of the same [T, b] segments ---------------
    num_steps, num_envs, b, obs_dim, act_dim = 64, 64, 8, args.obs_dim, 8
    capacity = args.segment_capacity
    gen = torch.Generator().manual_seed(0)

    def fresh_batch() -> dict[str, torch.Tensor]:
        # The slot contract (docs/sampler.md): obs [T + 1, B], a side table of B rows (Ant: 1 per env), none used.
        return {
            "obs": torch.randn(num_steps + 1, num_envs, obs_dim, generator=gen),
            "actions": torch.randn(num_steps, num_envs, act_dim, generator=gen),
            "behavior_logp": torch.randn(num_steps, num_envs, generator=gen),
            "rewards": torch.randn(num_steps, num_envs, generator=gen),
            "terminated": torch.zeros(num_steps, num_envs, dtype=torch.bool),
            "truncated": torch.zeros(num_steps, num_envs, dtype=torch.bool),
            "policy_version": torch.zeros(num_steps, num_envs, dtype=torch.int64),
            "final_obs": torch.zeros(num_envs, obs_dim),
            "final_step_idx": torch.zeros(num_envs, dtype=torch.int64),
            "final_env_idx": torch.zeros(num_envs, dtype=torch.int64),
            "final_count": torch.zeros((), dtype=torch.int64),
        }

    batch = fresh_batch()
    replay = TrajectoryReplay(ReplayConfig(ratio=0.5, capacity=capacity, segment_envs=b), "cpu")
    for _ in range(capacity // (num_envs // b)):
        replay.add(batch, torch.rand(num_envs // b))
    raw = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=RandomSampler())
    segments = TensorDict(
        {k: v.reshape(v.shape[0], num_envs // b, b, *v.shape[2:]).transpose(0, 1) for k, v in batch.items()
         if not k.startswith("final_")},
        batch_size=[num_envs // b],
    )  # fmt: skip
    for _ in range(capacity // (num_envs // b)):
        raw.extend(segments)
    num_segments = replay.num_segments_for(num_envs)
    prio = torch.rand(num_segments)
    fresh_prio = torch.rand(num_envs // b)

    def ours_sample(_k):
        sample = replay.sample(num_segments, learner_version=0, beta=0.5)
        replay.update_priorities(sample.index, prio)

    def raw_sample(_k):
        raw.sample(num_segments)

    cases = {
        "segments/ours_sample+update": ours_sample,
        "segments/torchrl_sample": raw_sample,
        "segments/ours_add": lambda _k: replay.add(batch, fresh_prio),
        "segments/torchrl_extend": lambda _k: raw.extend(segments),
    }
    inner = max(1, args.inner // 10)
    times = harness.interleave({n: lambda _r, fn=fn: _us_per_call(fn, inner) for n, fn in cases.items()}, args.repeats)
    for name in cases:
        rows.append({"case": name, "capacity": capacity, "draws": num_segments,
                     "us_per_call": harness.median(times[name])})  # fmt: skip

    meta = {
        "what": "replay sampler/update throughput, interleaved repeats in one process, torch 1 thread",
        "segment": {"T": num_steps, "b": b, "obs_dim": obs_dim, "act_dim": act_dim, "fresh_B": num_envs},
        "repeats": args.repeats, "inner": args.inner, "torch": torch.__version__,
        "python": machine["python"], "loadavg_at_end": [f"{x:.2f}" for x in harness.load_average()],
        "machine": machine, "quiet": quiet,
    }  # fmt: skip
    out = {"meta": meta, "rows": rows}
    lines = ["# Replay sampler/update throughput (CPU, 1 torch thread, shared 2-core machine)", "",
             f"load average at the end: {' '.join(meta['loadavg_at_end'])}; median of {args.repeats} interleaved "
             "repeats.", harness.quiet_line(quiet), "", "| case | capacity (segments) | draws/call | µs per call |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        value = f"{row['us_per_call']:.1f}" if row["us_per_call"] is not None else f"unavailable ({row['error']})"
        lines.append(f"| {row['case']} | {row['capacity']} | {row['draws']} | {value} |")
    harness.write_results(RESULTS, "replay_throughput", out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


def _read_progress(path: Path) -> list[dict[str, float]]:
    with path.open() as f:
        return [
            {k: (float(v) if v not in ("", None) else math.nan) for k, v in row.items()} for row in csv.DictReader(f)
        ]


def curves(args: argparse.Namespace) -> dict:
    """Aggregate progress.csv files of runs named <env>_r<ratio>_s<seed> into the results."""
    runs = defaultdict(dict)  # (env, ratio) -> seed -> rows
    for progress in sorted(Path(args.runs).glob("*_r*_s*/progress.csv")):
        name = progress.parent.name
        env, rest = name.split("_r", 1)
        ratio, seed = rest.split("_s")
        rows = _read_progress(progress)
        if rows:
            runs[(env, float(ratio))][int(seed)] = rows
    summary = []
    flat_rows = []
    # Equal-env-steps comparison: each env's shortest run sets the mark every run of that env is read at.
    mark = {}
    for (env, _), by_seed in runs.items():
        shortest = min(rows[-1]["env_steps"] for rows in by_seed.values())
        mark[env] = min(mark.get(env, math.inf), shortest)
    for (env, ratio), by_seed in sorted(runs.items()):
        finals, steps, walls, fps, at_mark = [], [], [], [], []
        for seed, rows in sorted(by_seed.items()):
            returns = [r["episode_return_mean"] for r in rows if not math.isnan(r["episode_return_mean"])]
            finals.append(returns[-1] if returns else math.nan)
            upto = [r["episode_return_mean"] for r in rows
                    if r["env_steps"] <= mark[env] and not math.isnan(r["episode_return_mean"])]  # fmt: skip
            at_mark.append(upto[-1] if upto else math.nan)
            steps.append(rows[-1]["env_steps"])
            walls.append(rows[-1]["wall_s"])
            fps.append(rows[-1]["env_steps"] / max(rows[-1]["wall_s"], 1e-9))
            for r in rows:
                flat_rows.append({"env": env, "replay_ratio": ratio, "seed": seed, "env_steps": r["env_steps"],
                                  "wall_s": r["wall_s"], "episode_return_mean": r["episode_return_mean"],
                                  "replay_segments": r.get("replay_segments", math.nan),
                                  "replay_weight_mean": r.get("replay_weight_mean", math.nan)})  # fmt: skip
        valid = [x for x in finals if not math.isnan(x)]
        summary.append({
            "env": env, "replay_ratio": ratio, "seeds": sorted(by_seed), "final_return_per_seed": finals,
            "final_return_median": statistics.median(valid) if valid else math.nan,
            "equal_steps_mark": mark[env], "return_at_mark_per_seed": at_mark,
            "return_at_mark_median": statistics.median([x for x in at_mark if not math.isnan(x)] or [math.nan]),
            "env_steps_median": statistics.median(steps), "wall_s_median": statistics.median(walls),
            "env_steps_per_s_median": statistics.median(fps),
        })  # fmt: skip
    out = {"meta": {"runs": str(args.runs), "note": args.note}, "summary": summary}
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "replay_curves.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat_rows[0]) if flat_rows else ["env"])
        writer.writeheader()
        writer.writerows(flat_rows)
    lines = ["# Learning with prioritized replay (CPU, shared 2-core machine)", "", args.note, "",
             "| env | replay_ratio | seeds | return at end (equal wall time), per seed | median | "
             "return at equal env steps (mark), per seed | median | env steps (median) | wall s | steps/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for s in summary:
        per_seed = ", ".join(f"{x:.0f}" for x in s["final_return_per_seed"])
        at_mark = ", ".join(f"{x:.0f}" for x in s["return_at_mark_per_seed"])
        lines.append(f"| {s['env']} | {s['replay_ratio']} | {len(s['seeds'])} | {per_seed} | "
                     f"{s['final_return_median']:.0f} | ({s['equal_steps_mark'] / 1e3:.0f}k) {at_mark} | "
                     f"{s['return_at_mark_median']:.0f} | {s['env_steps_median']:.0f} | {s['wall_s_median']:.0f} | "
                     f"{s['env_steps_per_s_median']:.0f} |")  # fmt: skip
    harness.write_results(RESULTS, "replay_curves", out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(runs)
    return out


def _plot(runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({env for env, _ in runs})
    if not envs:
        return
    fig, axes = plt.subplots(len(envs), 2, figsize=(11, 3.8 * len(envs)), squeeze=False)
    colors = {0.0: "tab:gray", 0.5: "tab:blue", 1.0: "tab:red"}
    for i, env in enumerate(envs):
        for (run_env, ratio), by_seed in sorted(runs.items()):
            if run_env != env:
                continue
            for j, (_seed, rows) in enumerate(sorted(by_seed.items())):
                xs = [(r["env_steps"], r["wall_s"], r["episode_return_mean"]) for r in rows
                      if not math.isnan(r["episode_return_mean"])]  # fmt: skip
                if not xs:
                    continue
                label = f"replay_ratio={ratio}" if j == 0 else None
                color = colors.get(ratio, None)
                axes[i, 0].plot([x[0] for x in xs], [x[2] for x in xs], color=color, label=label, alpha=0.8)
                axes[i, 1].plot([x[1] for x in xs], [x[2] for x in xs], color=color, label=label, alpha=0.8)
        axes[i, 0].set(title=f"{env}: return vs env steps", xlabel="env steps", ylabel="episode return (mean 100)")
        axes[i, 1].set(title=f"{env}: return vs wall time", xlabel="wall s", ylabel="episode return (mean 100)")
        axes[i, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "replay_curves.png", dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("throughput")
    p.add_argument("--capacities", type=int, nargs="+", default=[256, 4096, 65536])
    p.add_argument("--draws", type=int, default=8, help="segments drawn per call")
    p.add_argument("--segment-capacity", type=int, default=256, help="segments in the whole-segment cases")
    p.add_argument("--obs-dim", type=int, default=105, help="Ant-v5's observation size")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inner", type=int, default=200)
    harness.add_quiet_arguments(p)
    c = sub.add_parser("curves")
    c.add_argument("--runs", required=True)
    c.add_argument("--note", default="")
    args = parser.parse_args()
    throughput(args) if args.cmd == "throughput" else curves(args)


if __name__ == "__main__":
    main()
