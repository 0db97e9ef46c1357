"""Process-lifecycle helpers for the runner: heartbeats, parent-death signals, stack dumps, /proc readings.

Owns nothing long-lived; every function here is a small, Linux-first utility used by ``runner.py`` and the
sampler's child-process entry point, and by ``benchmarks/bench_sampler.py`` to read memory and CPU time.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

import torch

# Indices into the shared ``control`` tensor (float64) the runner and the sampler child share.
CTRL_STOP = 0  # 1.0: the sampler should finish its current rollout and exit
CTRL_SAMPLER_HEARTBEAT = 1  # time.time() of the sampler's last sign of life
CTRL_LEARNER_HEARTBEAT = 2  # time.time() of the learner loop's last sign of life
CTRL_SAMPLER_STEPS = 3  # env steps the sampler has written into READY slots
CTRL_SAMPLER_WAIT_S = 4  # seconds the sampler spent waiting for a FREE slot (backpressure)
CTRL_SAMPLER_READY = 5  # 1.0 once the sampler built its envs and policy
CTRL_SIZE = 8


def new_control(shared: bool) -> torch.Tensor:
    ctrl = torch.zeros(CTRL_SIZE, dtype=torch.float64)
    now = time.time()
    ctrl[CTRL_SAMPLER_HEARTBEAT] = now
    ctrl[CTRL_LEARNER_HEARTBEAT] = now
    return ctrl.share_memory_() if shared else ctrl


class SharedRngState:
    """The async sampler process's torch (CPU) RNG state, published for the runner's checkpoints.

    One writer (the sampler process, at its slot boundaries), one reader (the runner, when it checkpoints); neither
    ever waits on the other. A sequence count guards the copy (a seqlock): the writer makes it odd, copies the state,
    makes it even; the reader copies between two reads of the count and retries if a write overlapped. A write is a
    ~5 KB memcpy, so a retry is rare and short.
    """

    def __init__(self) -> None:
        self.state = torch.zeros_like(torch.get_rng_state()).share_memory_()  # uint8 [5056] (mt19937 + extras)
        self.seq = torch.zeros(1, dtype=torch.int64).share_memory_()  # 0: nothing published yet; odd: writing

    def write(self, state: torch.Tensor) -> None:
        seq = int(self.seq[0])
        self.seq[0] = seq + 1
        self.state.copy_(state)
        self.seq[0] = seq + 2  # INVARIANT: the state is complete before the even count that publishes it

    def read(self, timeout_s: float = 1.0) -> torch.Tensor | None:
        """A consistent copy of the last published state; None if none was published (or, after ``timeout_s`` of
        overlapping writes, which a writer stopped mid-copy could cause)."""
        deadline = time.monotonic() + timeout_s
        while True:
            seq = int(self.seq[0])
            if seq == 0:
                return None
            if seq % 2 == 0:
                copy = self.state.clone()
                if int(self.seq[0]) == seq:
                    return copy
            if time.monotonic() > deadline:
                return None
            time.sleep(0.001)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (prctl PR_SET_PDEATHSIG); no-op elsewhere.

    Together with the sampler's own parent-pid check this means a kill -9 of the runner leaves no orphan."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
    except OSError:
        pass


def register_stack_dump(path: str | None, sig: int = signal.SIGUSR1) -> object | None:
    """On ``sig``, write every thread's Python stack to ``path`` (or stderr). Returns the open file to keep alive."""
    if not hasattr(faulthandler, "register"):
        return None
    handle = open(path, "w") if path else sys.stderr  # noqa: SIM115 -- must outlive this call
    faulthandler.register(sig, file=handle, all_threads=True, chain=False)
    return handle


def read_text(path: str | Path, limit: int = 20000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z"
    except (OSError, IndexError):
        return False


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of ``pid`` (default: this process) from /proc, in bytes; 0 if unavailable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) from /proc/<pid>/stat; 0.0 if unavailable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15 of stat)
    except (OSError, IndexError, ValueError):
        return 0.0


def shm_entries() -> set[str]:
    """Names in /dev/shm (shared-memory segments and POSIX semaphores); empty set where there is none."""
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()
