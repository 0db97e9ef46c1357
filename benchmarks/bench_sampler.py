"""Sampler benchmarks: env-only vs double-buffered sampler+inference, async sampler+learner, and a memory soak.

Stages (all in one run, interleaved in rounds so machine noise hits every stage alike; ratios are per round):
  env-only   one BatchedEnv of N envs stepped with fixed actions (the simulator's own rate, the peer to beat)
  sampler    Sampler with ActorCritic 2x256 inference, N envs in num_splits groups, slots freed at once
  async      Runner in async mode with the real Learner training concurrently (CPU seconds of each process)
  --soak-minutes M: the async run for M minutes, sampling the resident memory of both processes every 10 s

Examples:
    .venv/bin/python benchmarks/bench_sampler.py --num-envs 128 --seconds 10 --rounds 3
    .venv/bin/python benchmarks/bench_sampler.py --soak-minutes 5
    .venv/bin/python benchmarks/bench_sampler.py --device cuda --env ant --num-envs 4096   # MJX (needs a GPU)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sample_fast import wiring
from sample_fast.benchmark import harness
from sample_fast.config import EnvConfig
from sample_fast.learner import LearnerConfig
from sample_fast.policy import PolicyConfig
from sample_fast.procs import CTRL_SAMPLER_STEPS, cpu_seconds, rss_bytes
from sample_fast.runner import Runner, RunnerConfig
from sample_fast.sampler import SamplerConfig, build_split_envs

RESULTS = Path(__file__).parent / "results"


def make_env(name: str, backend: str, num_envs: int, num_threads: int | None, device: str, seed: int = 0):
    env_cfg = EnvConfig(name=name, backend=backend, device=device, num_threads=num_threads or 0)
    return wiring.build_env(env_cfg, num_envs, seed=seed)


def make_policy(obs_spec, act_spec):
    torch.manual_seed(0)
    return wiring.build_policy(obs_spec, act_spec, PolicyConfig(hidden_sizes=[256, 256]))


def make_learner(policy):
    return wiring.build_learner(policy, LearnerConfig(), device="cpu")


def bench_env_only(args, seconds: float) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) of one env of N envs with fixed random actions."""
    env = make_env(args.env, args.backend, args.num_envs, args.env_threads_total, args.device)
    try:
        env.reset(seed=0)
        spec = env.action_spec
        gen = torch.Generator().manual_seed(0)
        actions = [(torch.rand((env.num_envs, *spec.shape), generator=gen) * 2 - 1).to(env.device) for _ in range(8)]
        for i in range(20):  # warm-up
            env.step(actions[i % 8])
        t = harness.run_for(lambda n: env.step(actions[n % 8]), seconds, sync=_sync(env.device))
        return _rates(t, env.num_envs)
    finally:
        env.close()


def _sync(device: torch.device) -> Callable[[], None] | None:
    """The timing boundary's device wait (None on the CPU: nothing is queued)."""
    return functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else None  # SYNC: boundary


def _rates(t: harness.Timed, num_envs: int) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) of ``t.calls`` passes over ``num_envs`` envs."""
    steps = t.calls * num_envs
    return steps / t.wall_s, steps / max(t.cpu_s, 1e-9)


def bench_sampler(args, seconds: float) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) of the double-buffered Sampler with ActorCritic inference;
    slots are freed as soon as they are READY."""
    cfg = SamplerConfig(
        rollout_len=args.rollout_len,
        num_splits=args.num_splits,
        num_slots=2 * args.num_splits,
        seed=0,
        check_slots=False,
    )
    per_split = args.num_envs // args.num_splits
    env_fn = functools.partial(make_env, args.env, args.backend, per_split, args.env_threads_per_split, args.device)
    envs = build_split_envs(env_fn, args.num_splits)
    policy = make_policy(envs[0].observation_spec, envs[0].action_spec).to(envs[0].device)
    store, sampler = wiring.build_sampler(
        envs, policy, cfg, version_fn=lambda: 0, split_seeds=list(range(args.num_splits))
    )
    prev = torch.get_num_threads()
    torch.set_num_threads(args.inference_threads)
    try:

        def drain() -> None:
            while (slot_idx := store.acquire_ready(0.0)) is not None:
                store.release(slot_idx)

        def one_pass(_k: int) -> None:
            sampler.advance(0.0)
            drain()

        for k in range(20):  # warm-up
            one_pass(k)
        return _rates(harness.run_for(one_pass, seconds, sync=_sync(envs[0].device)), args.num_envs)
    finally:
        torch.set_num_threads(prev)
        sampler.close()


class _Probe:
    """Runner hooks that record throughput and sample both processes' memory and CPU time."""

    def __init__(self, runner_ref: dict, sample_every_s: float) -> None:
        self.ref, self.every = runner_ref, sample_every_s
        self.samples: list[dict] = []
        self.last = 0.0
        self.env_steps = 0
        self.episodes = 0

    def sample(self, env_steps: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        runner = self.ref["runner"]
        child = runner.process.pid if runner.process is not None else None
        self.samples.append(
            {
                "t_s": now - self.ref["t0"],
                "env_steps": env_steps,
                "main_rss_mb": rss_bytes() / 2**20,
                "sampler_rss_mb": rss_bytes(child) / 2**20 if child else 0.0,
                "main_cpu_s": cpu_seconds(),
                "sampler_cpu_s": cpu_seconds(child) if child else 0.0,
                "sampler_env_steps": float(runner.control[CTRL_SAMPLER_STEPS]) if runner.process is not None else 0.0,
            }
        )

    def on_train(self, env_steps, metrics) -> None:
        self.env_steps = env_steps
        self.metrics = metrics
        self.sample(env_steps)

    def on_episodes(self, env_steps, returns, lengths) -> None:
        self.episodes += returns.numel()

    def on_stop(self, env_steps, reason) -> None:
        self.sample(env_steps, force=True)


def bench_async(args, seconds: float, sample_every_s: float) -> dict:
    """Async Runner: sampler process + learner training concurrently. Returns throughput, CPU and memory samples."""
    per_split = args.num_envs // args.num_splits
    env_fn = functools.partial(make_env, args.env, args.backend, per_split, args.env_threads_per_split, args.device)
    probe_env = env_fn()
    obs_spec, act_spec = probe_env.observation_spec, probe_env.action_spec
    probe_env.close()
    policy_fn = functools.partial(make_policy, obs_spec, act_spec)
    cfg = SamplerConfig(
        rollout_len=args.rollout_len,
        num_splits=args.num_splits,
        num_slots=2 * args.num_splits,
        seed=0,
        inference_threads=args.inference_threads,
    )
    ref = {"t0": time.monotonic()}
    probe = _Probe(ref, sample_every_s)
    rcfg = RunnerConfig(learner_threads=args.learner_threads)
    runner = Runner(env_fn, policy_fn, make_learner, cfg, rcfg, mode="async", hooks=probe)
    ref["runner"] = runner
    ref["t0"] = time.monotonic()
    summary = runner.run(total_env_steps=10**12, time_limit_s=seconds)
    s = probe.samples
    first = next((x for x in s if x["env_steps"] > 0), s[0])
    last = s[-1]
    dt = last["t_s"] - first["t_s"]
    out = {
        "summary": {k: v for k, v in summary.items()},
        "trained_steps_per_s": (last["env_steps"] - first["env_steps"]) / max(dt, 1e-9),
        "sampled_steps_per_s": (last["sampler_env_steps"] - first["sampler_env_steps"]) / max(dt, 1e-9),
        "main_cpu_frac": (last["main_cpu_s"] - first["main_cpu_s"]) / max(dt, 1e-9),
        "sampler_cpu_frac": (last["sampler_cpu_s"] - first["sampler_cpu_s"]) / max(dt, 1e-9),
        "window_s": dt,
        "last_metrics": {k: float(v) for k, v in getattr(probe, "metrics", {}).items()},
        "samples": s,
    }
    return out


def slope_mb_per_min(samples: list[dict], key: str, skip_s: float) -> float:
    pts = [(x["t_s"], x[key]) for x in samples if x["t_s"] >= skip_s]
    if len(pts) < 2:
        return float("nan")
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / max(var, 1e-9)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ant")
    p.add_argument("--backend", default="mujoco")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (MJX on a GPU)")
    p.add_argument("--num-envs", type=int, default=128)
    p.add_argument("--num-splits", type=int, default=2)
    p.add_argument("--rollout-len", type=int, default=64)
    p.add_argument("--env-threads-total", type=int, default=2, help="threads of the env-only baseline")
    p.add_argument("--env-threads-per-split", type=int, default=2, help="mujoco threads of each split's env")
    p.add_argument("--inference-threads", type=int, default=1)
    p.add_argument("--learner-threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=8.0, help="per stage per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--async-seconds", type=float, default=40.0)
    p.add_argument("--soak-minutes", type=float, default=0.0, help="run only the memory soak, for this long")
    p.add_argument("--skip-async", action="store_true")
    p.add_argument("--out", default=None, help="results basename (default: benchmarks/results/sampler_<device>)")
    harness.add_quiet_arguments(p)
    args = p.parse_args(argv)
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit(
                "--device cuda needs a CUDA device (torch.cuda.is_available() is False); run on a GPU host, "
                "e.g. --device cuda --backend mjx --num-envs 4096"
            )
        if args.backend == "mujoco":
            args.backend = "mjx"
    if args.num_envs % args.num_splits:
        sys.exit(f"--num-envs {args.num_envs} must be divisible by --num-splits {args.num_splits}")
    torch.set_num_threads(max(1, args.learner_threads))
    base = Path(args.out) if args.out else RESULTS / f"sampler_{args.device.split(':')[0]}"
    json_path = base.with_suffix(".json")  # one JSON per device; each configuration (or the soak) is one key
    quiet = harness.check_quiet_from_args(args)
    machine = harness.machine_record(quiet)
    meta = {
        "args": vars(args),
        "host": machine["hostname"],
        "cpus": machine["cpu_count"],
        "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg_start": harness.load_average(),
        "machine": machine,
        "quiet": quiet,
    }

    if args.soak_minutes > 0:
        res = bench_async(args, args.soak_minutes * 60.0, sample_every_s=10.0)
        res["main_rss_slope_mb_per_min"] = slope_mb_per_min(res["samples"], "main_rss_mb", skip_s=60.0)
        res["sampler_rss_slope_mb_per_min"] = slope_mb_per_min(res["samples"], "sampler_rss_mb", skip_s=60.0)
        meta["loadavg_end"] = harness.load_average()
        res["meta"] = meta
        path = harness.write_results(json_path.parent, json_path.stem, {"soak": res}, merge=True)["json"]
        print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=1))
        for x in res["samples"]:
            print(
                f"t={x['t_s']:7.1f}s steps={x['env_steps']:>10} main_rss={x['main_rss_mb']:8.1f}MB "
                f"sampler_rss={x['sampler_rss_mb']:8.1f}MB"
            )
        print(f"wrote {path}")
        return

    rounds = []
    for r in range(args.rounds):
        env_only, env_only_cpu = bench_env_only(args, args.seconds)
        sampler, sampler_cpu = bench_sampler(args, args.seconds)
        rounds.append(
            {
                "env_only": env_only,
                "sampler": sampler,
                "ratio": sampler / env_only,
                "env_only_per_cpu_s": env_only_cpu,
                "sampler_per_cpu_s": sampler_cpu,
                "cpu_ratio": sampler_cpu / env_only_cpu,
                "loadavg": harness.load_1min(),
            }
        )
        print(
            f"round {r}: env-only {env_only:8.0f}/s ({env_only_cpu:6.0f}/cpu-s)  sampler+inference {sampler:8.0f}/s "
            f"({sampler_cpu:6.0f}/cpu-s)  ratio {sampler / env_only:.3f} (cpu {sampler_cpu / env_only_cpu:.3f}) "
            f"load {rounds[-1]['loadavg']}",
            flush=True,
        )
    result = {
        "meta": meta,
        "rounds": rounds,
        "env_only_median": harness.median([x["env_only"] for x in rounds]),
        "sampler_median": harness.median([x["sampler"] for x in rounds]),
        # per-round ratios: env-only and sampler ran back to back in each round
        "ratio_median": harness.paired_ratio([x["sampler"] for x in rounds], [x["env_only"] for x in rounds]),
        "cpu_ratio_median": harness.median([x["cpu_ratio"] for x in rounds]),
    }
    if not args.skip_async:
        a = bench_async(args, args.async_seconds, sample_every_s=2.0)
        a.pop("samples")
        result["async"] = a
        print(
            f"async: trained {a['trained_steps_per_s']:.0f}/s sampled {a['sampled_steps_per_s']:.0f}/s, CPU: "
            f"main {a['main_cpu_frac']:.2f} cores, sampler {a['sampler_cpu_frac']:.2f} cores",
            flush=True,
        )
    result["meta"]["loadavg_end"] = harness.load_average()
    key = f"{args.env}_{args.backend}_num_envs_{args.num_envs}"
    harness.write_results(json_path.parent, json_path.stem, {key: result}, merge=True)
    print(f"ratio (median of {args.rounds} rounds): {result['ratio_median']:.3f}; wrote {json_path}")


if __name__ == "__main__":
    main()
