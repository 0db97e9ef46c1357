"""The CNN policies' cost on the CPU, and whether channels_last pays (issue #15: "measure before you keep it").

    python benchmarks/bench_cnn.py     # -> benchmarks/results/cnn_cpu.{json,md}

For ``nature_cnn`` (Mnih et al. 2015, [512] hidden) and ``impala_cnn`` (Espeholt et al. 2018, [256] hidden) on
Pong's frames (uint8 ``[4, 84, 84]``, 6 actions), with the frames and conv weights in channels_last (the default,
``encoders.CHANNELS_LAST``) and in the contiguous NCHW layout, at 1 and 2 torch threads (the Atari preset's learner
uses 2 on a 2-core machine), each case in a fresh interpreter, interleaved for ``--rounds`` rounds:

* ``train``: one Adam step of the PPO-shaped loss (``evaluate`` -> logp, entropy, value; backward) on a minibatch of
  ``--batch`` samples (the Atari preset's 256);
* ``act``: the sampler's no-grad ``act(with_value=False)`` on ``--act-batch`` frames (one env group of 16).

Reports microseconds per sample (median over rounds) and samples/s, and the channels_last / NCHW speed-up paired per
round. The peer here is the same network in the other layout.

    python benchmarks/bench_cnn.py --lever bf16 --name cnn_cpu_bf16   # -> benchmarks/results/cnn_cpu_bf16.{json,md}

compares instead the trunk under CPU bf16 autocast (``policy.cpu_bf16=always``) with float32 (``never``), both in
channels_last; the machine record says whether the CPU has native bf16 (``cpu_has_native_bf16``).

    python benchmarks/bench_cnn.py --lever pixnorm --name cnn_cpu_pixnorm --encoders nature_cnn --threads 2

prices ``policy.normalize_pixels`` (the Atari presets' per-pixel normalisation) against the 1/255 scale, both with
the runner's malloc settings (``procs.keep_freed_memory``; ``cnn_cpu_pixnorm.md`` predates them).

    python benchmarks/bench_cnn.py --lever malloc --name cnn_cpu_malloc --encoders nature_cnn --threads 2

prices ``procs.keep_freed_memory`` (glibc keeps freed blocks up to 32 MB in the heap; what the runner sets for the
learner and the sampler) against glibc's defaults, both with the Atari preset's policy (channels_last,
cpu_bf16=auto, normalize_pixels). Start it without MALLOC_* variables in the environment. Take /tmp/race.lock while
it runs (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sample_fast.benchmark import harness  # noqa: E402
from sample_fast.encoders import cpu_has_native_bf16  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
ENCODERS = {"nature_cnn": [512], "impala_cnn": [256]}
#: --lever: (name of the case with the lever, name of the case without it), as the result columns say.
LEVERS = {"layout": ("channels_last", "nchw"), "bf16": ("bf16", "float32"), "pixnorm": ("pixnorm", "scale255"),
          "malloc": ("keep_freed", "glibc_default")}  # fmt: skip


def run_case(case: dict) -> dict:
    import os

    if "keep_freed" in case:
        from sample_fast.procs import keep_freed_memory

        stray = sorted(k for k in os.environ if k.startswith("MALLOC_"))
        if stray and not case["keep_freed"]:
            raise RuntimeError(f"--lever malloc: unset {stray} first (the glibc_default case would inherit them)")
        if case["keep_freed"] and not keep_freed_memory():
            raise RuntimeError("--lever malloc: keep_freed_memory() failed (needs glibc on Linux)")
    import torch
    from sample_fast.envs import Spec

    from sample_fast import encoders
    from sample_fast.policy import ActorCritic, PolicyConfig

    torch.set_num_threads(case["threads"])
    encoders.CHANNELS_LAST = case["channels_last"]  # read when the trunk is built and on every forward
    torch.manual_seed(0)
    frames = Spec(shape=(4, 84, 84), dtype=torch.uint8)
    actions_spec = Spec(shape=(), dtype=torch.int64, num_actions=6)
    bf16 = {True: "always", False: "never", "auto": "auto"}[case.get("bf16", False)]
    cfg = PolicyConfig(encoder=case["encoder"], hidden_sizes=ENCODERS[case["encoder"]], activation="relu",
                       cpu_bf16=bf16, normalize_pixels=bool(case.get("pixnorm")), obs_clip=5.0)  # fmt: skip
    policy = ActorCritic(frames, actions_spec, cfg)
    conv = next(m for m in policy.modules() if isinstance(m, torch.nn.Conv2d))
    layout = "channels_last" if conv.weight.is_contiguous(memory_format=torch.channels_last) else "nchw"
    g = torch.Generator().manual_seed(0)
    n = case["batch"] if case["kind"] == "train" else case["act_batch"]
    obs = torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8)
    acts = torch.randint(0, 6, (n,), generator=g)
    adv = torch.randn(n, generator=g)
    ret = torch.randn(n, generator=g)
    opt = torch.optim.Adam(policy.parameters(), lr=2.5e-4, eps=1e-5)

    stats_rows = obs[: max(1, n // 4)]  # the learner: one statistics update per batch, then 4 epochs over it

    def train(_k: int) -> None:
        if case.get("pixnorm"):
            policy.update_normalizer(stats_rows)
        logp, entropy, values = policy.evaluate(obs, acts)
        loss = -(logp.exp() * adv).mean() - 0.01 * entropy.mean() + 0.5 * (values - ret).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def act(_k: int) -> None:
        with torch.no_grad():
            policy.act(obs, with_value=False)

    fn = train if case["kind"] == "train" else act
    harness.run_for(fn, 1.0, min_calls=2)  # warm-up (oneDNN picks its kernels on the first calls)
    timed = harness.run_for(fn, case["seconds"], min_calls=3)
    per_sample_s = timed.wall_s / (timed.calls * n)
    return {**case, "layout": layout, "calls": timed.calls, "us_per_sample": per_sample_s * 1e6,
            "samples_per_s": 1.0 / per_sample_s, "cpu_per_wall": timed.cpu_s / timed.wall_s}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per timed block")
    parser.add_argument("--batch", type=int, default=256, help="train minibatch (the Atari preset's)")
    parser.add_argument("--act-batch", type=int, default=16, help="act batch (one env group of the Atari preset)")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    parser.add_argument("--encoders", default=",".join(ENCODERS), help="comma-separated, of: " + ", ".join(ENCODERS))
    parser.add_argument("--timeout-s", type=float, default=180.0, help="per case")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="cnn_cpu")
    parser.add_argument("--lever", choices=sorted(LEVERS), default="layout",
                        help="layout: channels_last vs NCHW; bf16: bf16 trunk vs float32; pixnorm: "
                             "normalize_pixels vs the 1/255 scale; malloc: keep_freed_memory vs glibc's "
                             "defaults")  # fmt: skip
    harness.add_quiet_arguments(parser)
    args = parser.parse_args()
    if args.case:
        harness.print_case_result(run_case(json.loads(args.case)))
        return
    encs = [e.strip() for e in args.encoders.split(",") if e.strip()]
    bad = [e for e in encs if e not in ENCODERS]
    if bad or not encs:
        parser.error(f"--encoders {args.encoders!r}: choose from {', '.join(ENCODERS)}")
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads!r}: comma-separated integers, e.g. 1,2")
    if not threads or min(threads) < 1 or args.rounds < 1 or args.batch < 1 or args.act_batch < 1:
        parser.error("--threads, --rounds, --batch and --act-batch must be >= 1")
    quiet = harness.check_quiet_from_args(args, log=print)
    base = {"batch": args.batch, "act_batch": args.act_batch, "seconds": args.seconds}
    # on: the lever applied (channels_last, or bf16 trunk in channels_last); off: NCHW, or float32 in channels_last
    keys = [(e, k, t, on) for e in encs for k in ("train", "act") for t in threads for on in (True, False)]
    on_name, off_name = LEVERS[args.lever]

    def case_fn(key):
        enc, kind, t, on = key

        def run(_round: int) -> dict:
            layout = args.lever == "layout"  # layout: NCHW or channels_last; bf16: both in channels_last
            lever = {"channels_last": on or not layout, "bf16": on and not layout}
            if args.lever == "pixnorm":  # the Atari preset's policy (channels_last, cpu_bf16=auto) with and without,
                # both with the runner's malloc settings (as training runs them since a869d51)
                lever = {"channels_last": True, "bf16": "auto", "pixnorm": on, "keep_freed": True}
            if args.lever == "malloc":  # the Atari preset's policy, with and without the runner's malloc settings
                lever = {"channels_last": True, "bf16": "auto", "pixnorm": True, "keep_freed": on}
            case = {**base, "encoder": enc, "kind": kind, "threads": t, **lever}
            res = harness.run_case_in_subprocess(__file__, case, args.timeout_s)
            if "error" in res:
                raise RuntimeError(f"{key}: {res['error']}")
            name = on_name if on else off_name
            print(f"  {enc} {kind} threads={t} {name:13s} {res['us_per_sample']:8.1f} us/sample", flush=True)
            return res

        return run

    t0 = time.perf_counter()
    results = harness.interleave({key: case_fn(key) for key in keys}, args.rounds)
    rows = []
    for enc, kind, t, on in keys:
        if not on:
            continue
        fast = [r["samples_per_s"] for r in results[(enc, kind, t, True)]]
        slow = [r["samples_per_s"] for r in results[(enc, kind, t, False)]]
        rows.append({
            "encoder": enc, "kind": kind, "threads": t,
            f"{on_name}_us_per_sample": harness.median([r["us_per_sample"] for r in results[(enc, kind, t, True)]]),
            f"{off_name}_us_per_sample": harness.median([r["us_per_sample"] for r in results[(enc, kind, t, False)]]),
            f"{on_name}_samples_per_s": harness.median(fast),
            f"speedup_{on_name}": harness.paired_ratio(fast, slow),
        })  # fmt: skip
    machine = {**harness.machine_record(quiet), "cpu_has_native_bf16": cpu_has_native_bf16()}
    data = {"machine": machine, "quiet": quiet, "lever": args.lever,
            "settings": {**base, "threads": threads}, "rounds": args.rounds, "elapsed_s": time.perf_counter() - t0,
            "results": {"/".join(map(str, k)): v for k, v in results.items()}, "rows": rows}  # fmt: skip
    title = {
        "layout": "channels_last vs NCHW",
        "bf16": "bf16 trunk (CPU autocast) vs float32, both channels_last",
        "pixnorm": "per-pixel normalisation (normalize_pixels; train: plus a statistics update of a quarter of "
        "the minibatch per step, the learner's ratio over 4 epochs) vs the 1/255 scale, both "
        "channels_last with cpu_bf16=auto and the runner's malloc settings (keep_freed_memory)",
        "malloc": "glibc keeping freed blocks up to 32 MB (procs.keep_freed_memory, the runner's setting) vs "
        "glibc's defaults, both the Atari preset's policy (channels_last, cpu_bf16=auto, normalize_pixels)",
    }
    md = [
        f"# CNN policies on the CPU: {title[args.lever]} (Pong frames uint8 [4, 84, 84], 6 actions)",
        "",
        harness.quiet_line(quiet),
        "",
        f"CPU: {machine.get('cpu_model', '?')}; native bf16 (AVX512-BF16 or AMX-BF16 flags): "
        f"{'yes' if machine['cpu_has_native_bf16'] else 'no'}.",
        "",
        f"{args.rounds} interleaved rounds, each case in a fresh interpreter; medians over rounds; the speed-up is "
        f"paired per round. `train`: one Adam step of a PPO-shaped loss on {args.batch} samples (`evaluate`, "
        f"backward, step); `act`: no-grad `act(with_value=False)` on {args.act_batch} frames.",
        "",
        f"| encoder | call | torch threads | {on_name} us/sample | {off_name} us/sample | {on_name} samples/s | "
        f"{on_name} speed-up |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        md.append(f"| {r['encoder']} | {r['kind']} | {r['threads']} | {r[f'{on_name}_us_per_sample']:.0f} | "
                  f"{r[f'{off_name}_us_per_sample']:.0f} | {r[f'{on_name}_samples_per_s']:.0f} | "
                  f"{r[f'speedup_{on_name}']:.2f}x |")  # fmt: skip
    print("\n".join(md))
    print(harness.write_results(args.out, args.name, data, "\n".join(md) + "\n"))


if __name__ == "__main__":
    main()
