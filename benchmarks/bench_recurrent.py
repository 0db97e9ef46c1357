"""Learning curves of feed-forward and recurrent policies on a partially observed task (docs/recurrent.md).

    python benchmarks/bench_recurrent.py run --out DIR [--seconds 240]   # trains the runs (nice -n 10), one at a time
    python benchmarks/bench_recurrent.py curves --runs DIR               # -> benchmarks/results/recurrent_pomdp.*
    python benchmarks/bench_recurrent.py staleness                       # -> benchmarks/results/recurrent_staleness.*
    python benchmarks/bench_recurrent.py cost                            # -> benchmarks/results/recurrent_cost.*

``run``: HalfCheetah with the velocities removed from its observation (task option
``include_velocities_in_observation=false``: 8 joint positions, no velocities), the trainer's defaults otherwise,
``run.time_limit_s`` seconds each, for an MLP (the default 64x64) and a GRU policy (64-unit MLP encoder, 64-unit
GRU). The run directories are named ``<env>_<policy>_s<seed>``. ``curves``: their progress.csv files -> return
against env steps and wall time (CSV, JSON, Markdown, PNG), read at the end (equal wall time) and at the
shortest run's env steps (equal env steps). Speed of the recurrent sampler itself: the FPS suite's inference_rnn
stage (docs/benchmark.md).

``staleness``: what replaying a recurrent segment from its stored state costs (R2D2's "representational drift",
Kapturowski et al. 2019). A GRU learns cue recall (toy kind=recall, 8-step episodes) from slots of 12 steps, so
episodes cross slot boundaries and a slot's stored state carries the cue. Every slot is kept. With the final
weights, each slot is re-run twice: from its stored state (computed by the weights that acted, ``age`` versions
ago) and from the state the final weights themselves reach at the slot start (chained from the very first slot,
whose state is exactly zero). Reported per age bucket: the total-variation distance between the two action
distributions (2 actions: |p_stored(a) - p_fresh(a)|), over all rows, over the rows after a burn-in of k steps,
and over the query rows (where the recalled cue decides the reward).

``cost``: CPU seconds (the process clock, so another process's load does not enter, unlike wall-clock rates) per env
step of the three parts of sampler + inference on Ant: one ``env.step`` of the mujoco backend (1 simulator
thread), the MLP policy's ``act`` and the GRU policy's ``act_recurrent`` on a split of envs (torch 1 thread),
interleaved over rounds. The recurrent policy's share of the MLP's sampler + inference throughput on a CPU-bound
machine is then ``(env + mlp) / (env + gru)``; the FPS suite's ``inference_rnn`` stage measures it directly in
wall-clock time where the machine is quiet enough for that.
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


def staleness(args: argparse.Namespace) -> dict:
    import torch
    from sample_fast.envs import make

    from sample_fast.learner import Learner, LearnerConfig
    from sample_fast.policy import ActorCritic, PolicyConfig
    from sample_fast.recurrent import SequenceInputs
    from sample_fast.sampler import Sampler, SamplerConfig
    from sample_fast.trajectory_store import TrajectoryStore

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    T, B, L = args.rollout_len, args.num_envs, args.recall_steps
    env = make("toy", B, kind="recall", recall_steps=L, seed=args.seed)
    policy = ActorCritic(env.observation_spec, env.action_spec,
                         PolicyConfig(hidden_sizes=[32], rnn="gru", rnn_size=32))  # fmt: skip
    store = TrajectoryStore(env.observation_spec, env.action_spec, T, B, 3, max_episode_steps=L,
                            rnn_state_shape=policy.rnn_state_shape)  # fmt: skip
    learner = Learner(policy, LearnerConfig(lr=3e-3, num_epochs=4, num_minibatches=2))
    sampler = Sampler([env], policy, store, SamplerConfig(rollout_len=T, num_splits=1, num_slots=3, seed=args.seed),
                      version_fn=lambda: learner.policy_version)  # fmt: skip
    slots = []
    while len(slots) < args.num_slots:
        sampler.advance(wait_s=1.0)
        while (idx := store.acquire_ready(0.0)) is not None:
            batch = store.slot(idx).clone()
            store.release(idx)
            slots.append((int(batch["policy_version"].max()), batch))
            learner.train(batch)
    sampler.close()
    final_version = learner.policy_version
    buckets = [(1, 1), (2, 4), (5, 16), (17, 64), (65, 10**9)]
    burn_ins = [0, 2, 4, L]
    sums = {b: {"n_slots": 0, **{f"tv_burn_in_{k}": 0.0 for k in burn_ins}, "tv_query": 0.0, "n_query": 0,
                "state_err": 0.0, "dv_row0": 0.0} for b in buckets}  # fmt: skip
    with torch.no_grad():
        state = policy.initial_state(B)  # the first slot's state is exactly zero
        for version, batch in slots:
            obs, actions, reset = batch["obs"][:T], batch["actions"], batch["rnn_reset"][:T]
            logp_s, _, v_s, _ = policy.evaluate_sequence(obs, actions, SequenceInputs(batch["rnn_state"], reset))
            logp_f, _, v_f, states = policy.evaluate_sequence(obs, actions, SequenceInputs(state, reset))
            live = ~reset[0]  # envs whose state at the slot start is carried (not zeroed by row 0's reset)
            err = (batch["rnn_state"] - state).flatten(1).norm(dim=1) / state.flatten(1).norm(dim=1).clamp_min(1e-8)
            state = states[T - 1]  # the final weights' state entering the next slot (before its row-0 reset)
            tv = (logp_s.exp() - logp_f.exp()).abs()  # [T, B]; 2 actions: TV of the two distributions
            age = final_version - version
            bucket = next(b for b in buckets if b[0] <= age <= b[1])
            acc = sums[bucket]
            acc["n_slots"] += 1
            acc["state_err"] += float(err[live].mean()) if bool(live.any()) else 0.0
            acc["dv_row0"] += float((v_s[0] - v_f[0]).abs().mean())
            for k in burn_ins:
                acc[f"tv_burn_in_{k}"] += float(tv[k:].mean())
            query = obs[..., -1] == 1.0
            acc["tv_query"] += float(tv[query].sum())
            acc["n_query"] += int(query.sum())
    rows = []
    for (lo, hi), acc in sums.items():
        if not acc["n_slots"]:
            continue
        n = acc["n_slots"]
        rows.append({"age_versions": f"{lo}-{hi}" if hi < 10**9 else f">={lo}", "slots": n,
                     **{f"tv_after_burn_in_{k}": acc[f"tv_burn_in_{k}"] / n for k in burn_ins},
                     "tv_query_rows": acc["tv_query"] / max(acc["n_query"], 1),
                     "relative_state_error": acc["state_err"] / n,
                     "abs_value_diff_row0": acc["dv_row0"] / n})  # fmt: skip
    lines = ["# Stored-state staleness of replayed recurrent segments (toy cue recall, GRU 32)", "",
             f"Command: `python benchmarks/bench_recurrent.py staleness --num-slots {args.num_slots}` "
             f"({T}-step slots of {B} envs, {L}-step episodes, {len(slots) * T * B} env steps, {final_version} "
             "policy versions; 1 torch thread). Mean total-variation distance between the action distributions "
             "re-run from the stored state and from the final weights' own state, per slot age (policy versions "
             "between the slot's acting weights and the final ones):", "",
             "| age (versions) | slots | ‖h_stored - h_fresh‖ / ‖h_fresh‖ at the slot start | abs(V diff), row 0 | "
             "TV, all rows | " + " | ".join(f"after {k}-step burn-in" for k in burn_ins[1:])
             + " | TV, query rows |", "|---" * (6 + len(burn_ins)) + "|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['age_versions']} | {r['slots']} | {r['relative_state_error']:.3f} | "
                     f"{r['abs_value_diff_row0']:.4f} | "
                     + " | ".join(f"{r[f'tv_after_burn_in_{k}']:.4f}" for k in burn_ins)
                     + f" | {r['tv_query_rows']:.4f} |")  # fmt: skip
    out = {"meta": {"num_slots": args.num_slots, "rollout_len": T, "num_envs": B, "recall_steps": L,
                    "final_version": final_version, "machine": harness.machine_record()}, "rows": rows}  # fmt: skip
    harness.write_results(RESULTS, "recurrent_staleness", out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


def cost(args: argparse.Namespace) -> dict:
    import torch
    from sample_fast.envs import make

    from sample_fast.policy import ActorCritic, PolicyConfig

    torch.set_num_threads(1)
    n = args.num_envs
    env = make("ant", n, backend="mujoco", num_threads=1, seed=0)
    obs, _ = env.reset(seed=0)
    low, high = env.action_spec.low, env.action_spec.high
    actions = [low + (high - low) * torch.rand(n, *low.shape) for _ in range(8)]
    torch.manual_seed(0)
    mlp = ActorCritic(env.observation_spec, env.action_spec, PolicyConfig(hidden_sizes=[64, 64]))
    gru = ActorCritic(env.observation_spec, env.action_spec,
                      PolicyConfig(hidden_sizes=[64], rnn="gru", rnn_size=args.rnn_size))  # fmt: skip
    state, reset = gru.initial_state(n), torch.zeros(n, dtype=torch.bool)
    cases = {
        "env_step": lambda k: env.step(actions[k % 8]),
        "mlp_act": lambda k: mlp.act(obs, with_value=False),
        "gru_act": lambda k: gru.act_recurrent(obs, state, reset),
    }
    per_step = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            timed = harness.time_calls(fn, args.calls)
            per_step[name].append(timed.cpu_s / (timed.calls * n) * 1e6)  # CPU µs per env step
    env.close()
    med = {name: harness.median(v) for name, v in per_step.items()}
    share = (med["env_step"] + med["mlp_act"]) / (med["env_step"] + med["gru_act"])
    lines = ["# CPU cost per env step: Ant env step, MLP act, GRU act (1 thread each)", "",
             f"Command: `python benchmarks/bench_recurrent.py cost --num-envs {n} --rnn-size {args.rnn_size}` "
             f"({args.rounds} interleaved rounds of {args.calls} calls on {n} envs; the process CPU clock, so other "
             "processes' load does not enter; MLP 64x64, GRU: MLP encoder [64] + GRU "
             f"{args.rnn_size}).", "",
             "| part | CPU µs per env step (median) | rounds (min-max) |", "| --- | --- | --- |"]  # fmt: skip
    for name, v in per_step.items():
        lines.append(f"| {name} | {med[name]:.2f} | {min(v):.2f}-{max(v):.2f} |")
    lines += ["", f"GRU sampler + inference as a share of the MLP's, CPU-bound: (env + mlp) / (env + gru) = "
              f"**{share:.3f}**"]  # fmt: skip
    out = {"meta": {"num_envs": n, "rnn_size": args.rnn_size, "rounds": args.rounds, "calls": args.calls,
                    "machine": harness.machine_record()},
           "cpu_us_per_env_step": per_step, "median": med, "gru_share_of_mlp": share}  # fmt: skip
    harness.write_results(RESULTS, "recurrent_cost", out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


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
    st = sub.add_parser("staleness")
    st.add_argument("--num-slots", type=int, default=400)
    st.add_argument("--num-envs", type=int, default=32)
    st.add_argument("--rollout-len", type=int, default=12)
    st.add_argument("--recall-steps", type=int, default=8)
    st.add_argument("--seed", type=int, default=0)
    co = sub.add_parser("cost")
    co.add_argument("--num-envs", type=int, default=64, help="envs per split (the trainer: 128 envs / 2 splits)")
    co.add_argument("--rnn-size", type=int, default=64)
    co.add_argument("--rounds", type=int, default=7)
    co.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("MUJOCO_GL", "egl")
    {"run": run, "curves": curves, "staleness": staleness, "cost": cost}[args.cmd](args)


if __name__ == "__main__":
    main()
