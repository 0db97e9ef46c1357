"""Thread-placement and pipeline levers of the sampler and trainer (issue #14), measured in the FPS suite.

    python benchmarks/bench_levers.py            # -> benchmarks/results/levers_cpu.{json,md}

Every variant is one run of ``python -m sample_fast.benchmark`` (Ant, mujoco backend, the trainer's 128 envs, no
peers: its env-only stage is the reference) with one setting changed; the variants are interleaved for ``--rounds``
rounds, so a load change hits them alike, and each variant's +inference and +training env steps/s are divided by
the env-only figure of the baseline in the same round (and by the baseline's own +inference/+training figure).

Variants (the suite's settings, docs/benchmark.md):

* ``baseline``: the trainer's fitting on 2 cores: 2 simulator threads, 1 inference thread, 1 learner thread, 2 splits;
* ``sim_threads=1`` / ``sim_threads=3``: ``num_threads`` (the simulator's thread pool) below / above the cores;
* ``inference_threads=2``: ``torch_threads`` (the sampler's torch pool);
* ``learner_threads=2``: ``train.learner_threads``;
* ``splits=4``: ``num_splits`` and ``train.num_splits`` (four env groups of 32 instead of two of 64: more overlap,
  smaller batches per forward);
* ``gil_switch=1ms`` / ``200us`` / ``50us``: ``gil_switch_interval_s``, the sampler process's
  ``sys.setswitchinterval`` (Python's default is 5 ms; see ``SamplerConfig.gil_switch_interval_s``);
* ``caller_steps=true``: the mujoco backend's ``recv`` steps the envs its simulator threads have not claimed yet
  on the caller's thread instead of only waiting for them (``caller_steps``, off by default);
* ``kernel=python``: the mujoco backend's Python stepping loop (four MuJoCo calls per env, the GIL taken back after
  each) instead of the default compiled kernel (``envs.mujoco_kernel``: one GIL-free call per run of envs). It
  measures env-only too, and its shares are given against its own env-only as well;
* ``sim_threads=1+caller_steps``: one simulator thread per env group, and the sampler's main thread steps the
  envs that thread has not claimed when it reaches ``recv`` (3 threads on 2 cores instead of 5);
* ``worker_nice=5`` / ``19``: the mujoco backend's stepping threads run at a higher nice value than the sampler's
  main thread (``worker_nice``), so the main thread's serial work (recv, the policy, send) preempts the physics.
* ``train_window=1call``: not a lever but the train stage's timing before 2026-12-02 (a window closes at the first
  train call ``seconds_per_repeat`` after it opened, the suite's ``warmup_s``), against the default's windows of at
  least ``train.window_calls`` = 10 calls after ``train.warmup_s`` = 3 s;
* ``tanh=torch``: the policy's tanh through torch's CPU kernel (``SAMPLE_FAST_TANH=torch``) instead of numpy's
  ufunc, the default (``sample_fast.activations``).
* ``envs=256``, ``envs=256+minibatches=8``, ``envs=256+T=32``: the trainer's size doubled (256 envs, 2 groups of
  128), with the learner's 4 minibatches (of 2048 samples), with 8 (of 1024, today's minibatch size and Adam steps
  per env step), or with T=32 (today's 4096-step slot). They measure env-only too, so their shares are also given
  against their own env-only.
* ``epochs=3`` / ``epochs=2``: the learner's passes over each batch (``train.learner.num_epochs``) 3 or 2 instead of
  the trainer's 4: a quarter or half less learner CPU per env step.
* ``refresh=slot``: the sampler loads the learner's newest weights at each slot's start (``train.weights_refresh``)
  instead of before every policy forward, the trainer's default (``sampler.weights_refresh=step``).
* ``learner_sched=batch`` / ``idle`` / ``idle+epochs=2``: the learner process's threads under Linux's SCHED_BATCH or
  SCHED_IDLE policy once the sampler runs (``train.learner_sched``, the trainer's ``runner.learner_sched``; SCHED_IDLE
  runs them only on CPU time no sampler thread wants), the last with 2 learner epochs as well.
* ``pin_workers``: the mujoco backend pins stepping thread k of every env group to the k-th core
  (``pin_workers``), so each group's two threads never share a core or migrate; the sampler's main thread and the
  learner stay free. It measures env-only too (pinned), so its shares are also given against its own env-only.

Take /tmp/race.lock while it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_fast.benchmark import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
BASE = ["preset=cpu", "num_envs=[128]", "backends=[mujoco]", "envs=[ant]", "peers=[]", "repeats=3",
        "seconds_per_repeat=2.0", "warmup_s=1.0", "wait_quiet=false"]  # fmt: skip
VARIANTS: dict[str, list[str]] = {
    "baseline": ["stages=[env,inference,train]"],
    "sim_threads=1": ["stages=[inference,train]", "num_threads=1"],
    "sim_threads=3": ["stages=[inference,train]", "num_threads=3"],
    "inference_threads=2": ["stages=[inference,train]", "torch_threads=2"],
    "learner_threads=2": ["stages=[train]", "train.learner_threads=2"],
    "splits=4": ["stages=[inference,train]", "num_splits=4", "train.num_splits=4"],
    "gil_switch=1ms": ["stages=[inference,train]", "gil_switch_interval_s=0.001"],
    "gil_switch=200us": ["stages=[inference,train]", "gil_switch_interval_s=0.0002"],
    "gil_switch=50us": ["stages=[inference,train]", "gil_switch_interval_s=0.00005"],
    "caller_steps=true": ["stages=[inference,train]", "++backend_options.mujoco.caller_steps=true"],
    "kernel=python": ["stages=[env,inference,train]", "++backend_options.mujoco.kernel=python"],
    "sim_threads=1+caller_steps": [
        "stages=[inference,train]",
        "num_threads=1",
        "++backend_options.mujoco.caller_steps=true",
    ],
    "worker_nice=5": ["stages=[inference,train]", "++backend_options.mujoco.worker_nice=5"],
    "worker_nice=19": ["stages=[inference,train]", "++backend_options.mujoco.worker_nice=19"],
    "tanh=torch": ["stages=[inference,train]"],
    "train_window=1call": ["stages=[train]", "train.window_calls=1", "train.warmup_s=null"],
    "envs=256": ["stages=[env,inference,train]", "num_envs=[256]"],
    "envs=256+minibatches=8": ["stages=[env,inference,train]", "num_envs=[256]", "++train.learner.num_minibatches=8"],
    "envs=256+T=32": ["stages=[env,inference,train]", "num_envs=[256]", "rollout_len=32", "train.rollout_len=32"],
    "epochs=3": ["stages=[train]", "train.learner.num_epochs=3"],
    "epochs=2": ["stages=[train]", "train.learner.num_epochs=2"],
    "refresh=slot": ["stages=[train]", "train.weights_refresh=slot"],
    "learner_sched=batch": ["stages=[train]", "train.learner_sched=batch"],
    "learner_sched=idle": ["stages=[train]", "train.learner_sched=idle"],
    "learner_sched=idle+epochs=2": ["stages=[train]", "train.learner_sched=idle", "train.learner.num_epochs=2"],
    "pin_workers": ["stages=[env,inference,train]", "++backend_options.mujoco.pin_workers=true"],
}
#: Variants that differ in the environment of the suite's process (inherited by its spawned samplers), not in config.
VARIANT_ENV: dict[str, dict[str, str]] = {"tanh=torch": {"SAMPLE_FAST_TANH": "torch"}}


def run_variant(name: str, tmp: Path, round_idx: int, timeout_s: float) -> dict[str, float]:
    out_name = f"{name.replace('=', '_')}_r{round_idx}"
    cmd = [sys.executable, "-m", "sample_fast.benchmark", *BASE, *VARIANTS[name], f"out_dir={tmp}",
           f"out_name={out_name}"]  # fmt: skip
    # every variant's own variables set, every other variant's unset (the caller's shell may have exported one)
    env = {k: v for k, v in os.environ.items() if not any(k in e for e in VARIANT_ENV.values())}
    env.update(VARIANT_ENV.get(name, {}))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    data = json.loads((tmp / f"{out_name}.json").read_text())
    return {r["stage"]: r["env_steps_per_s"]["median"] for r in data["results"] if r["kind"] == "sample_fast"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per suite run")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="levers_cpu")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    if "baseline" not in args.variants:
        parser.error("--variants must include baseline (the reference of every ratio)")
    quiet = harness.check_quiet_from_args(args, log=print)
    with tempfile.TemporaryDirectory(prefix="sf_levers_") as tmp:
        cases = {v: (lambda r, v=v: run_variant(v, Path(tmp), r, args.timeout_s)) for v in args.variants}
        results = harness.interleave(cases, args.rounds)
    base = results["baseline"]
    rows = []
    for v in args.variants:
        own_env = [r["env"] for r in results[v]] if v != "baseline" and "env" in results[v][0] else None
        for stage in ("env", "inference", "train") if own_env else ("inference", "train"):
            if stage not in results[v][0]:
                continue
            sps = [r[stage] for r in results[v]]
            share = harness.paired_ratio(sps, [b["env"] for b in base])
            vs_base = harness.paired_ratio(sps, [b[stage] for b in base])
            own = harness.paired_ratio(sps, own_env) if own_env else None
            rows.append({"variant": v, "stage": stage, "env_steps_per_s": sps, "share_of_env_only": share,
                         "vs_baseline": vs_base, "share_of_own_env_only": own})  # fmt: skip
            print(f"{v:22s} {stage:9s} {harness.median(sps):8.0f}  share {share:.3f}  vs baseline {vs_base:.3f}"
                  + (f"  own share {own:.3f}" if own else ""))  # fmt: skip
    env_only = [b["env"] for b in base]
    data = {"machine": harness.machine_record(quiet), "quiet": quiet, "rounds": args.rounds, "base_overrides": BASE,
            "variants": {v: VARIANTS[v] for v in args.variants}, "results": results, "rows": rows}  # fmt: skip
    md = [
        "# Thread-placement and pipeline levers: Ant, mujoco backend, the trainer's 128 envs unless a variant sets "
        "num_envs (FPS suite per variant)",
        "",
        harness.quiet_line(quiet),
        "",
        f"{args.rounds} interleaved rounds; each figure the suite's median of 3 windows of 2 s; ratios are paired per "
        f"round. Baseline env-only: {', '.join(f'{x:.0f}' for x in env_only)} env steps/s.",
        "",
        "| variant | stage | env steps/s (per round) | share of env-only | vs baseline | share of its own env-only |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        own = f"{r['share_of_own_env_only']:.2f}x" if r["share_of_own_env_only"] else "-"
        md.append(f"| {r['variant']} | {r['stage']} | {' / '.join(f'{x:.0f}' for x in r['env_steps_per_s'])} | "
                  f"{r['share_of_env_only']:.2f}x | {r['vs_baseline']:.2f}x | {own} |")  # fmt: skip
    md.append("")
    md.append("Overrides of every run: `" + " ".join(BASE) + "`; per variant: " +
              "; ".join(f"{v}: `{' '.join(VARIANTS[v])}`" for v in args.variants) + ".")  # fmt: skip
    print(harness.write_results(args.out, args.name, data, "\n".join(md) + "\n"))


if __name__ == "__main__":
    main()
