"""The Sample Factory peer: its APPO training on MuJoCo, run in its own virtualenv, FPS parsed from its log.

Sample Factory 2.1.1 pins numpy<2 and gymnasium<1, so it lives in ``.venv-sf`` (built by
``benchmarks/sample_factory/setup_venv.sh``) and runs as a subprocess for a bounded number of env steps with a
timeout. Its ``--train_for_seconds`` does not stop training in 2.1.1, so ``--train_for_env_steps`` bounds the run.
Owns that subprocess and every process it starts: they are killed by pid afterwards (a timed-out run was seen to
leave children behind). Also a CLI: ``python -m sample_fast.benchmark.sample_factory_peer --env ant``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from .config import BenchmarkConfig, num_threads
from .measure import CaseResult, Skip, kill_tree

#: sample_fast task -> Sample Factory env name (sf_examples/mujoco/mujoco_utils.py; gymnasium 0.29's v4 envs).
SF_ENVS = {
    "ant": "mujoco_ant",
    "halfcheetah": "mujoco_halfcheetah",
    "hopper": "mujoco_hopper",
    "walker2d": "mujoco_walker",
    "humanoid": "mujoco_humanoid",
}
SF_FRAME_SKIP = {"ant": 5, "halfcheetah": 5, "hopper": 4, "walker2d": 4, "humanoid": 5}
#: Sample Factory's Atari names are atari_<game in lower case> (sf_examples/atari/atari_utils.py), but for these.
_SF_ATARI_EXCEPTIONS = {"Asteroids": "atari_asteroid", "MontezumaRevenge": "atari_montezuma",
                        "KungFuMaster": "atari_kongfumaster"}  # fmt: skip
ATARI_FRAME_SKIP = 4


def sf_env(env: str) -> str | None:
    """Sample Factory's env name for a sample_fast task or Atari game (``Pong-v5`` -> ``atari_pong``), or None."""
    from sample_fast.envs.atari import is_atari_name

    if is_atari_name(env):
        game = env.removesuffix("-v5")
        return _SF_ATARI_EXCEPTIONS.get(game, f"atari_{game.lower()}")
    return SF_ENVS.get(env)


INSTALL_HINT = "bash benchmarks/sample_factory/setup_venv.sh  (builds .venv-sf)"

# "[...] Fps is (10 sec: 4812.3, 60 sec: 4700.1, 300 sec: 4650.0). Total num frames: 123456. ..."
_FPS_RE = re.compile(
    r"Fps is \(10 sec: ([0-9.]+|nan), 60 sec: ([0-9.]+|nan), 300 sec: ([0-9.]+|nan)\)\. "
    r"Total num frames: (\d+)"
)
# "Collected {0: 300032}, FPS: 4615.0" (the summary line at the end of a run)
_FINAL_RE = re.compile(r"Collected \{0: (\d+)\}, FPS: ([0-9.]+)")


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def venv_python(cfg: BenchmarkConfig) -> str:
    venv = cfg.sample_factory.venv
    if not os.path.isabs(venv):
        venv = os.path.join(repo_root(), venv)
    return os.path.join(venv, "bin", "python")


def parse_fps(log: str) -> tuple[list[float], float | None, int]:
    """Non-overlapping 10-second FPS windows from Sample Factory's log, the final average FPS, and frames.

    SF reports every 5 s the FPS of the last 10 s. A window counts only when the previous report already had
    frames (so the window lies inside training, not start-up); every other report is kept so windows do not
    overlap.
    """
    reports = [(m.group(1), int(m.group(4))) for m in _FPS_RE.finditer(log)]
    windows: list[float] = []
    prev_frames = 0
    for fps_10s, frames in reports:
        if prev_frames > 0 and fps_10s != "nan" and float(fps_10s) > 0:
            windows.append(float(fps_10s))
        prev_frames = frames
    windows = windows[::2]
    final = _FINAL_RE.findall(log)
    final_fps = float(final[-1][1]) if final else None
    total_frames = max((f for _, f in reports), default=0)
    if final:
        total_frames = max(total_frames, int(final[-1][0]))
    return windows, final_fps, total_frames


def command(env: str, cfg: BenchmarkConfig, train_dir: str) -> list[str]:
    """SF's train script for ``env``: its mujoco example, or its Atari example (NoFrameskip-v4 games with its own
    wrappers: frame skip 4, 84x84, 4 frames, no sticky actions) counting agent steps (summaries_use_frameskip off),
    as every other runner in the suite does."""
    sf = cfg.sample_factory
    workers = sf.num_workers or num_threads(cfg)
    name = sf_env(env)
    atari = name.startswith("atari_")
    per_worker = max(1, sf.atari_num_envs // workers) if atari else sf.num_envs_per_worker
    return [
        venv_python(cfg),
        "-m",
        "sf_examples.atari.train_atari" if atari else "sf_examples.mujoco.train_mujoco",
        f"--env={name}",
        "--algo=APPO",
        f"--num_workers={workers}",
        f"--num_envs_per_worker={per_worker}",
        "--device=cpu",
        f"--train_for_env_steps={sf.env_steps}",
        "--with_wandb=False",
        f"--train_dir={train_dir}",
        "--experiment=sample_fast_bench",
        "--restart_behavior=overwrite",
        f"--seed={cfg.seed}",
        *(["--summaries_use_frameskip=False"] if atari else []),
    ]


def run_sample_factory(env: str, cfg: BenchmarkConfig) -> CaseResult:
    """Run SF's training for ``cfg.sample_factory.env_steps`` steps (killed after ``timeout_s``); return its
    10-second FPS windows as the repeats."""
    if sf_env(env) is None:
        raise Skip(f"Sample Factory's examples have no {env!r}; they have {', '.join(SF_ENVS)} and Atari <Game>-v5")
    python = venv_python(cfg)
    if not os.path.exists(python):
        raise Skip(
            f"no Sample Factory virtualenv at {os.path.dirname(os.path.dirname(python))}; install with: {INSTALL_HINT}"
        )
    sf = cfg.sample_factory
    train_dir = tempfile.mkdtemp(prefix="sample_fast_sf_")
    log_path = os.path.join(train_dir, "stdout.log")
    env_vars = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env_vars.pop("PYTHONPATH", None)  # the SF venv must not see sample_fast's site-packages
    t0 = time.monotonic()
    timed_out = False
    try:
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                command(env, cfg, train_dir),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env_vars,
                cwd=train_dir,
                start_new_session=True,  # its own process group: our Ctrl-C does not reach it half-way
            )
            try:
                proc.wait(timeout=sf.timeout_s)  # SYNC: bounded by sample_factory.timeout_s
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                kill_tree(proc.pid)  # also on success: SF's workers have been seen to outlive the runner
                try:
                    proc.wait(timeout=10.0)
                except subprocess.TimeoutExpired:
                    pass
        with open(log_path, errors="replace") as f:
            log = f.read()
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)
    wall_s = time.monotonic() - t0
    windows, final_fps, frames = parse_fps(log)
    if "No module named" in log and not windows:
        missing = re.findall(r"No module named '([^']+)'", log)
        raise Skip(f"Sample Factory's venv lacks {missing[:1]}; rebuild it with: {INSTALL_HINT}")
    if not windows:
        tail = "\n".join(log.strip().splitlines()[-5:])
        why = f"timed out after {sf.timeout_s:g} s" if timed_out else f"exited with code {proc.returncode}"
        raise RuntimeError(f"Sample Factory {why} without an FPS report; last lines:\n{tail}")
    notes = "SF's 10-s FPS windows" + (f"; stopped by the {sf.timeout_s:g} s timeout" if timed_out else "")
    if len(windows) < cfg.repeats:
        notes += f"; only {len(windows)} windows (raise sample_factory.env_steps)"
    extra: dict[str, Any] = {"final_fps": final_fps, "frames": frames, "wall_s": wall_s, "sf_env": sf_env(env)}
    frame_skip = SF_FRAME_SKIP.get(env, ATARI_FRAME_SKIP)
    return CaseResult(windows[-max(cfg.repeats, 1) :], frame_skip, "cpu", notes=notes, extra=extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="ant", help=f"{', '.join(sorted(SF_ENVS))} or an Atari game <Game>-v5")
    parser.add_argument("--env-steps", type=int, default=BenchmarkConfig().sample_factory.env_steps)
    parser.add_argument("--timeout-s", type=float, default=BenchmarkConfig().sample_factory.timeout_s)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cfg = BenchmarkConfig(repeats=args.repeats)
    cfg.sample_factory.env_steps, cfg.sample_factory.timeout_s = args.env_steps, args.timeout_s
    try:
        res = run_sample_factory(args.env, cfg)
    except Skip as e:
        print(f"sample_factory skipped: {e}", file=sys.stderr)
        return 2
    print(f"sample_factory {args.env}: 10-s FPS windows {[round(r) for r in res.rates]}, final {res.extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
