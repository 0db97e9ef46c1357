"""The CleanRL-style PPO peer: ``benchmarks/cleanrl_ppo_atari.py`` run as a subprocess for a bounded number of env
steps, its per-update SPS lines parsed into the suite's windows.

The script is a standalone CleanRL-style baseline (torch + numpy + EnvPool, nothing of sample_fast), so it lives under
``benchmarks/`` beside the other peers' set-up; an install without the repository's ``benchmarks/`` folder skips
this peer with a line. Owns that subprocess and every process it starts (killed by pid afterwards).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

from .config import BenchmarkConfig, num_threads
from .measure import CaseResult, Skip, kill_tree

# "update 3 global_step 3072 sps 412.9 score_mean100 nan"
_UPDATE_RE = re.compile(r"^update (\d+) global_step (\d+) sps ([0-9.]+)", re.MULTILINE)
FRAME_SKIP = 4


def script_path() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "benchmarks", "cleanrl_ppo_atari.py")


def parse_updates(log: str) -> list[tuple[int, int, float]]:
    """(update, global_step, sps) of every update line in the script's output."""
    return [(int(u), int(s), float(r)) for u, s, r in _UPDATE_RE.findall(log)]


def command(env: str, cfg: BenchmarkConfig) -> list[str]:
    c = cfg.cleanrl
    return [
        sys.executable,
        script_path(),
        f"--env-id={env}",
        f"--num-envs={c.num_envs}",
        f"--num-steps={c.num_steps}",
        f"--total-timesteps={c.env_steps}",
        f"--threads={num_threads(cfg)}",
        f"--seed={cfg.seed}",
    ]


def run_cleanrl(env: str, cfg: BenchmarkConfig) -> CaseResult:
    """Run the script for ``cfg.cleanrl.env_steps`` (killed after ``timeout_s``); every update after the first (which
    includes start-up) is one window of ``num_envs * num_steps`` env steps."""
    if not os.path.exists(script_path()):
        raise Skip(f"{script_path()} is not there (the cleanrl_ppo peer runs from a checkout of the repository)")
    c = cfg.cleanrl
    t0 = time.monotonic()
    timed_out = False
    proc = subprocess.Popen(
        command(env, cfg),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: our Ctrl-C does not reach it half-way
    )
    try:
        log, _ = proc.communicate(timeout=c.timeout_s)  # SYNC: bounded by cleanrl.timeout_s
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc.pid)
        log, _ = proc.communicate(timeout=10.0)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    updates = parse_updates(log or "")
    windows = [sps for _, _, sps in updates[1:]]
    if not windows:
        tail = "\n".join((log or "").strip().splitlines()[-5:])
        why = f"timed out after {c.timeout_s:g} s" if timed_out else f"exited with code {proc.returncode}"
        raise RuntimeError(f"the CleanRL-style peer {why} with fewer than 2 updates; last lines:\n{tail}")
    notes = f"per-update SPS of {c.num_envs} envs x {c.num_steps} steps, the first update (start-up) left out"
    if timed_out:
        notes += f"; stopped by the {c.timeout_s:g} s timeout"
    extra: dict[str, Any] = {"updates": len(updates), "wall_s": time.monotonic() - t0, "num_envs": c.num_envs}
    return CaseResult(windows, FRAME_SKIP, "cpu", notes=notes, extra=extra)
