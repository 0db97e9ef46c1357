"""Sample Factory's Atari example on Pong to a time cap: the second peer of the Pong race (issue #15).

    bash benchmarks/sample_factory/setup_venv.sh          # once: Sample Factory 2.1.1 in .venv-sf
    .venv/bin/python benchmarks/sf_pong_race.py --time-limit-s 6506 --seed 1 --out-dir DIR
    .venv/bin/python benchmarks/pong_race.py --ours <env=pong progress.csv> --peer <CleanRL-style updates.csv> \\
        --sf DIR/curve.csv --out DIR/race

Runs ``sf_examples.atari.train_atari --env=atari_pong`` (PongNoFrameskip-v4 behind Sample Factory's own wrappers:
frame skip 4 with max-pooling, 84x84 grayscale, 4 frames, up to 30 no-ops) with the example's own hyper-parameters
and, by default, sticky actions 0.25 as ``env=pong`` plays (``--sticky``; PongNoFrameskip-v4 itself has none: the
hook ``benchmarks/sample_factory/sample_fast_sf_sticky.py``, installed in .venv-sf by setup_venv.sh, sets ALE's
repeat_action_probability in every SF process; this script checks it took effect before the launch), in the FPS
suite's process layout for this machine (``--num_workers`` = cores, the example's 8 envs spread over them: its 4 x
256-sample minibatches need one rollout of all 8) and counting agent steps (``--summaries_use_frameskip=False``), as
the FPS suite's ``sample_factory`` peer does. Before the launch it waits until no trainer is running and the CPUs
are idle; it launches SF in its own session, follows its console log (``race_ant_v4``'s parser: SF's mean episode
reward over its last ``--stats_avg`` = 100 games, which for Pong is the game score, and its learner's step counter),
stops it at ``--time-limit-s`` from launch or at the first report at or above ``--stop-at``, kills every process of
its session, and writes ``curve.csv`` (launch_s, env_steps, episode_return_mean, fps), ``stdout.log``, SF's resolved
``config.json`` and ``meta.json`` to ``--out-dir``. The clock starts at the launch, so SF's start-up (~35 s to its
first report on 2 cores) counts against it. Stopped early (Ctrl-C or SIGTERM), it still stops SF's session and
writes ``curve.csv`` and ``meta.json`` (stop_reason "interrupted"), the curve then rebuilt from ``stdout.log`` by
SF's own timestamps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import race_ant_v4 as race  # noqa: E402 (the Ant race's process and log machinery)

#: Sample Factory's Atari example runs 8 envs (8 workers x 1 env by default); the FPS suite spreads them over cores.
SF_ATARI_NUM_ENVS = 8
#: The environment variable the sticky-actions hook in .venv-sf reads (sample_fast_sf_sticky.ENV_VAR).
STICKY_ENV_VAR = "SAMPLE_FAST_SF_STICKY"
STICKY_HINT = "bash benchmarks/sample_factory/setup_venv.sh (it installs the hook sample_fast_sf_sticky.py)"


def sf_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the SF venv must not see sample_fast's site-packages
    env[STICKY_ENV_VAR] = repr(args.sticky)
    return env


def check_sticky(args: argparse.Namespace, timeout_s: float = 120.0) -> float:
    """Make PongNoFrameskip-v4 in the SF venv as SF's workers will and return its repeat_action_probability.

    A RaceError naming the fix when the hook is missing or the value differs from ``--sticky``.
    """
    code = "import sample_fast_sf_sticky as s; print('sticky', s.check())"
    try:
        out = subprocess.run(
            [race.sf_python(args.sf_venv), "-c", code], env=sf_env(args), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise race.RaceError(f"checking sticky actions in {args.sf_venv} took over {timeout_s:g} s") from e
    got = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("sticky ")]
    if out.returncode != 0 or not got:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise race.RaceError(f"{args.sf_venv} cannot set sticky actions ({tail}); run: {STICKY_HINT}")
    value = float(got[-1])
    if abs(value - args.sticky) > 1e-6:
        raise race.RaceError(
            f"SF's Pong would play with sticky actions {value:g}, not --sticky={args.sticky:g}; run: {STICKY_HINT}"
        )
    return value


def sf_command(args: argparse.Namespace, train_dir: str) -> list[str]:
    workers = args.sf_workers or os.cpu_count() or 1
    return [
        race.sf_python(args.sf_venv),
        "-m",
        "sf_examples.atari.train_atari",
        "--env=atari_pong",
        "--algo=APPO",
        f"--num_workers={workers}",
        f"--num_envs_per_worker={max(1, SF_ATARI_NUM_ENVS // workers)}",
        "--device=cpu",
        f"--seed={args.seed}",
        f"--train_for_env_steps={int(args.env_steps)}",
        "--summaries_use_frameskip=False",
        "--with_wandb=False",
        f"--train_dir={train_dir}",
        f"--experiment=race_pong_seed{args.seed}",
        "--restart_behavior=overwrite",
    ]


def contender(args: argparse.Namespace, train_dir: str, log_path: str) -> race.Contender:
    env = sf_env(args)
    command = sf_command(args, train_dir)
    return race.Contender(
        "sf", command, env, train_dir, log_path, lambda: race.SFLogFollower(log_path), None, label="sf_pong"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-limit-s", type=float, required=True, help="stop SF this long after its launch")
    p.add_argument("--out-dir", required=True, help="curve.csv, stdout.log, config.json and meta.json go here")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stop-at", type=float, default=18.0, help="stop at the first mean score >= this (default +18)")
    p.add_argument(
        "--sticky", type=float, default=0.25,
        help="ALE's repeat_action_probability for SF's Pong (default 0.25, env=pong's; 0: SF's own NoFrameskip-v4)",
    )  # fmt: skip
    p.add_argument("--env-steps", type=float, default=10e6, help="SF's --train_for_env_steps (agent steps)")
    p.add_argument("--sf-venv", default=".venv-sf", help="Sample Factory's virtualenv (relative to the repo root)")
    p.add_argument("--sf-workers", type=int, default=0, help="SF's --num_workers (0: one per core)")
    p.add_argument("--quiet-busy", type=float, default=0.10, help="CPU busy share at most this before the launch")
    p.add_argument("--quiet-timeout-s", type=float, default=300.0, help="wait at most this long for a quiet machine")
    p.add_argument("--report-every-s", type=float, default=60.0, help="print a progress line this often")
    args = p.parse_args(argv)
    if not args.time_limit_s > 0:
        p.error(f"--time-limit-s={args.time_limit_s:g} must be > 0 seconds")
    if not 0.0 <= args.sticky < 1.0:
        p.error(f"--sticky={args.sticky:g} must be in [0, 1): ALE's repeat_action_probability")
    if args.sf_workers < 0:
        p.error(f"--sf-workers={args.sf_workers} must be >= 0 (0: one per core)")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = os.path.abspath(args.out_dir)
    race.sf_python(args.sf_venv)  # a missing venv is an error before anything is written
    sticky = check_sticky(args)  # so is a venv without the sticky-actions hook
    os.makedirs(out_dir, exist_ok=True)
    train_dir = tempfile.mkdtemp(prefix="sf_pong_race_")
    log_path = os.path.join(out_dir, "stdout.log")
    try:
        quiet = race.wait_until_quiet("sf_pong", args)
        c = contender(args, train_dir, log_path)
        load = tuple(round(x, 2) for x in os.getloadavg())
        launch_unix = time.time()
        try:
            result = race.race_one(
                c, args.seed, args.stop_at, args.time_limit_s, poll_s=1.0, report_every_s=args.report_every_s
            )
        except KeyboardInterrupt:  # SF's session is already stopped; keep what it logged
            result = race.RunResult(c.name, args.seed, c.command, load, stop_reason="interrupted")
            result.wall_s = time.time() - launch_unix
            with open(log_path, "rb") as f:
                result.curve = race.parse_sf_log_timed(f.read(), launch_unix)
        result.quiet_before = quiet
        race.write_curve(os.path.join(out_dir, "curve.csv"), result.curve)
        config = os.path.join(train_dir, f"race_pong_seed{args.seed}", "config.json")
        if os.path.exists(config):
            shutil.copy(config, os.path.join(out_dir, "config.json"))
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)
    zero = race.first_crossing(result.curve, 0.0)
    meta = {
        "command": result.command,
        "sticky_actions": sticky,
        "launch_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(launch_unix)),
        "time_limit_s": args.time_limit_s,
        "stop_at": args.stop_at,
        "stop_reason": result.stop_reason,
        "returncode": result.returncode,
        "pid": result.pid,
        "wall_s": round(result.wall_s, 3),
        "time_to_0_s": None if zero is None else round(zero.launch_s, 3),
        "steps_at_0": None if zero is None else zero.env_steps,
        "time_to_stop_at_s": race._json_num(result.time_to_threshold_s),
        "best_mean_score": race._json_num(result.best_return),
        "final_env_steps": result.curve[-1].env_steps if result.curve else 0,
        "avg_env_steps_per_s": race._json_num(result.avg_fps),
        "median_sf_fps_10s": race._json_num(result.median_fps),
        "num_reports": len(result.curve),
        "load_before": list(result.load_before),
        "quiet_before": quiet,
        "machine": race.machine_facts(args),
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # run the finally blocks: stop SF's whole session

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        meta = run(args)
    except race.RaceError as e:
        print(f"sf_pong_race: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sf_pong_race: interrupted before SF's launch; nothing was started", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    if meta["stop_reason"] == "interrupted":
        print(f"sf_pong_race: interrupted; SF was stopped; curve.csv, meta.json in {args.out_dir}", file=sys.stderr)
        return 130
    last = f"{meta['final_env_steps'] / 1e6:.2f}M env steps"
    zero = "not reached" if meta["time_to_0_s"] is None else f"{meta['time_to_0_s']:,.0f} s"
    best = meta["best_mean_score"]
    print(
        f"sf_pong_race: {meta['stop_reason']} after {meta['wall_s']:,.0f} s, {last}, mean score >= 0: {zero}, "
        f"best mean score {best if best is None else f'{best:+.2f}'}, "
        f"{meta['avg_env_steps_per_s'] or math.nan:,.0f} env steps/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
