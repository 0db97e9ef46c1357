"""distributed=ddp on this machine: the all-reduce cost per update, and 2 ranks against 1 with the same total envs.

    python benchmarks/bench_distributed.py allreduce    # -> benchmarks/results/distributed/allreduce.{json,md}
    python benchmarks/bench_distributed.py throughput   # -> benchmarks/results/distributed/throughput.{json,md}

allreduce (2 gloo ranks spawned here, CPU): for the default Ant policy (2x64 tanh MLPs, configs/algo/appo.yaml) and
a 2x256 MLP: the bytes one minibatch's gradient all_reduce moves (float32 gradients + the loss), its median time,
the per-update total (num_epochs x num_minibatches = 16 of them, plus the advantage, normaliser and end-of-update
collectives, measured as a whole: a 2-rank ``Learner.train`` against the same learner alone on the same per-rank
batch), and the update's compute (the 1-rank ``Learner.train`` of one default-size batch, T=64 x 64 envs).

throughput (Ant, the trainer end to end, ``run.time_limit_s`` each, interleaved rounds): 1 process with
``env.num_envs=N``; ``torchrun --nproc_per_node=1 distributed=ddp`` with N (the wrapper's overhead on a real gloo
group); ``torchrun --nproc_per_node=2`` with N/2 per rank (the same total envs). Env steps/s is the steady-state mean
of progress.csv's rows after the first. On 2 cores, 2 ranks cannot be faster: each rank gets one core, and the
collectives add to the update. Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "distributed"
POLICIES = {"default_2x64_tanh": ([64, 64], "tanh"), "mlp_2x256": ([256, 256], "elu")}
T, B = 64, 64  # the default batch on this machine: rollout_len 64 x (128 envs / 2 splits)
EPOCHS, MINIBATCHES = 4, 4  # configs/algo/appo.yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ant_specs():
    from sample_fast.config import EnvConfig
    from sample_fast.wiring import probe_specs

    return probe_specs(EnvConfig(name="ant", backend="mujoco", device="cpu", num_envs=1, num_threads=1))


def make_learner(hidden: list[int], activation: str, seed: int = 0):
    from sample_fast.learner import Learner, LearnerConfig
    from sample_fast.policy import ActorCritic, PolicyConfig

    obs_spec, act_spec = ant_specs()
    torch.manual_seed(seed)
    policy = ActorCritic(obs_spec, act_spec, PolicyConfig(hidden_sizes=hidden, activation=activation))
    cfg = LearnerConfig(num_epochs=EPOCHS, num_minibatches=MINIBATCHES, kl_coef=0.1, max_grad_norm=3.5)
    return Learner(policy, cfg)


def make_batch(policy, seed: int) -> dict[str, torch.Tensor]:
    """A [T, B] slot-layout batch of random observations, acted by ``policy`` (no episode ends)."""
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, B, policy.obs_dim, generator=gen)
    with torch.no_grad():
        actions, logp, _ = policy.act(obs[:-1].reshape(T * B, -1))
    capacity = T * B
    return {
        "obs": obs,
        "actions": actions.reshape(T, B, -1),
        "behavior_logp": logp.reshape(T, B),
        "rewards": torch.randn(T, B, generator=gen),
        "terminated": torch.zeros(T, B, dtype=torch.bool),
        "truncated": torch.zeros(T, B, dtype=torch.bool),
        "policy_version": torch.zeros(T, B, dtype=torch.int64),
        "final_obs": torch.full((capacity, policy.obs_dim), float("nan")),
        "final_step_idx": torch.full((capacity,), -1, dtype=torch.int64),
        "final_env_idx": torch.full((capacity,), -1, dtype=torch.int64),
        "final_count": torch.tensor(0),
    }


def median_train_ms(learner, batches: list, start: int, updates: int) -> float:
    """Median wall ms of ``updates`` ``learner.train`` calls on ``batches[1:]`` in turn from position ``start``
    (``batches[0]`` is the warm-up batch, trained before timing). bench_compile's and bench_tanh's update case."""
    times = []
    for i in range(updates):
        b = batches[1 + (start + i) % (len(batches) - 1)]
        t0 = time.perf_counter()
        learner.train(b)
        times.append(time.perf_counter() - t0)
    return harness.median(times) * 1e3


def _allreduce_worker(rank: int, port: int, calls: int, updates: int, out: str) -> None:
    import torch.distributed as dist

    from sample_fast.distributed import Sync, attach_learner

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    try:
        for name, (hidden, act) in POLICIES.items():
            learner = make_learner(hidden, act)
            n = sum(p.numel() for p in learner.params) + 1
            flat = torch.zeros(n)
            dist.barrier()
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                dist.all_reduce(flat)
                times.append(time.perf_counter() - t0)
            # the whole update, 1 rank (rank 0 alone; rank 1 waits) then 2 ranks, on the same per-rank batches
            batches = [make_batch(learner.policy, seed=100 * rank + i) for i in range(updates + 1)]
            alone = []
            if rank == 0:
                single = make_learner(hidden, act)
                single.train(batches[0])  # warm-up (numba V-trace compile)
                for b in batches[1:]:
                    t0 = time.perf_counter()
                    single.train(b)
                    alone.append(time.perf_counter() - t0)
            dist.barrier()
            sync = Sync(rank, 2, rank, 2, "gloo", 120.0, torch.device("cpu"))
            sync.ctrl = dist.group.WORLD
            attach_learner(sync, learner, seed=0, resumed=False)
            learner.train(batches[0])
            together = []
            for b in batches[1:]:
                t0 = time.perf_counter()
                learner.train(b)
                together.append(time.perf_counter() - t0)
            results[name] = {
                "params": n - 1,
                "allreduce_bytes": 4 * n,
                "allreduce_s": times,
                "update_1rank_s": alone,
                "update_2rank_s": together,
                "grad_allreduce_calls_per_update": sync.allreduce_calls // (updates + 1),
            }
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def bench_allreduce(args) -> None:
    import torch.multiprocessing as mp

    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.pt")
        mp.spawn(_allreduce_worker, args=(free_port(), args.calls, args.updates, out), nprocs=2, join=True)
        raw = torch.load(out, weights_only=False)
    rows = []
    for name, r in raw.items():
        ar = harness.median(r["allreduce_s"])
        per_update = ar * r["grad_allreduce_calls_per_update"]
        one, two = harness.median(r["update_1rank_s"]), harness.median(r["update_2rank_s"])
        rows.append({
            "policy": name, "params": r["params"], "allreduce_bytes": r["allreduce_bytes"],
            "allreduce_ms": 1e3 * ar, "grad_allreduces_per_update": r["grad_allreduce_calls_per_update"],
            "grad_allreduce_ms_per_update": 1e3 * per_update, "update_1rank_ms": 1e3 * one,
            "update_2rank_ms": 1e3 * two, "grad_allreduce_share_of_update": per_update / one,
            "update_2rank_over_1rank": two / one, "raw": r,
        })  # fmt: skip
    md = [
        "# distributed=ddp: all-reduce cost per update (2 gloo ranks, CPU)",
        "",
        harness.quiet_line(quiet),
        "",
        f"Batch per rank T={T} x B={B} = {T * B} samples; {EPOCHS} epochs x {MINIBATCHES} minibatches; "
        f"all_reduce median of {args.calls} calls, updates median of {args.updates}.",
        "",
        "| policy | params | bytes / all_reduce | all_reduce ms | per update (x16) ms | update 1 rank ms | "
        "update 2 ranks ms | grad all_reduce / update | 2 ranks / 1 rank |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['policy']} | {r['params']} | {r['allreduce_bytes']} | {r['allreduce_ms']:.3f} | "
            f"{r['grad_allreduce_ms_per_update']:.2f} | {r['update_1rank_ms']:.1f} | {r['update_2rank_ms']:.1f} | "
            f"{r['grad_allreduce_share_of_update']:.1%} | {r['update_2rank_over_1rank']:.2f} |"
        )
    md += ["", "2 ranks / 1 rank includes every collective of the update and the two ranks sharing the 2 cores."]
    paths = harness.write_results(args.out, "allreduce", {"machine": machine, "rows": rows}, "\n".join(md))
    print("\n".join(md))
    print(paths)


# ----- throughput ----------------------------------------------------------------------------------------------
def _train_cmd(case: str, num_envs: int, run_dir: str, seconds: float) -> list[str]:
    py = sys.executable
    overrides = [
        "env=ant", f"run.dir={run_dir}", "run.total_env_steps=1e9", f"run.time_limit_s={seconds}",
        "logging.progress=plain", "logging.interval_s=5", "logging.tensorboard=false", "logging.plot=false",
        "run.checkpoint_interval_s=1e6",
    ]  # fmt: skip
    if case == "plain":
        return [py, "-m", "sample_fast.train", f"env.num_envs={num_envs}", *overrides]
    nproc = 1 if case == "ddp_1rank" else 2
    per_rank = num_envs // nproc
    return [py, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}", "-m", "sample_fast.train", "distributed=ddp",
            f"env.num_envs={per_rank}", *overrides]  # fmt: skip


def _steady_fps(run_dir: str) -> float:
    with open(os.path.join(run_dir, "progress.csv")) as f:
        rows = list(csv.DictReader(f))
    fps = [float(r["fps"]) for r in rows[1:-1]] or [float(r["fps"]) for r in rows]  # last row: the partial close
    return statistics.mean(fps)


def bench_throughput(args) -> None:
    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    cases = ("plain", "ddp_1rank", "ddp_2ranks")
    results: dict[str, list[float]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as tmp:

        def run(case: str, r: int) -> float:
            run_dir = os.path.join(tmp, f"{case}_{r}")
            cmd = _train_cmd(case, args.num_envs, run_dir, args.seconds)
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.seconds + 180,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"{case} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
            fps = _steady_fps(run_dir)
            print(f"round {r} {case}: {fps:.0f} env steps/s", flush=True)
            return fps

        results = harness.interleave({c: (lambda r, c=c: run(c, r)) for c in cases}, args.rounds)
    rows = {c: {"fps": harness.median(v), "rounds": v} for c, v in results.items()}
    ratio_2 = harness.paired_ratio(results["ddp_2ranks"], results["plain"])
    ratio_1 = harness.paired_ratio(results["ddp_1rank"], results["plain"])
    md = [
        f"# distributed=ddp: Ant, {args.num_envs} envs in total, 1 process vs torchrun 1 and 2 ranks (gloo, CPU)",
        "",
        harness.quiet_line(quiet),
        "",
        f"{machine.get('cpu_count', '?')} cores; {args.seconds:g} s per run (run.time_limit_s), {args.rounds} "
        "interleaved rounds; env steps/s: mean of progress.csv's steady rows, median over rounds.",
        "",
        "| case | envs per rank | env steps/s | vs 1 process (paired median) |",
        "|---|---:|---:|---:|",
        f"| 1 process (distributed=none) | {args.num_envs} | {rows['plain']['fps']:.0f} | 1.00 |",
        f"| torchrun 1 rank (distributed=ddp) | {args.num_envs} | {rows['ddp_1rank']['fps']:.0f} | {ratio_1:.2f} |",
        f"| torchrun 2 ranks (distributed=ddp) | {args.num_envs // 2} | {rows['ddp_2ranks']['fps']:.0f} | "
        f"{ratio_2:.2f} |",
    ]
    data = {"machine": machine, "num_envs": args.num_envs, "seconds": args.seconds, "rows": rows,
            "ratio_2ranks_vs_plain": ratio_2, "ratio_1rank_vs_plain": ratio_1}  # fmt: skip
    paths = harness.write_results(args.out, "throughput", data, "\n".join(md))
    print("\n".join(md))
    print(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allreduce")
    a.add_argument("--calls", type=int, default=300)
    a.add_argument("--updates", type=int, default=5)
    t = sub.add_parser("throughput")
    t.add_argument("--num-envs", type=int, default=128)
    t.add_argument("--seconds", type=float, default=40.0)
    t.add_argument("--rounds", type=int, default=2)
    for p in (a, t):
        p.add_argument("--out", default=str(OUT))
        harness.add_quiet_arguments(p)
    args = parser.parse_args()
    (bench_allreduce if args.what == "allreduce" else bench_throughput)(args)


if __name__ == "__main__":
    main()
