"""Quiet-machine checks shared by the benchmarks: how busy the CPUs are now, who is using them, and a bounded wait.

The 1-minute load average is a poor gate between two runs: it decays with a 60-s time constant, so 10 s after a
2-core contender exits it still reads ~1.7 and says nothing about what is running *now*. These functions read
``/proc/stat`` and ``/proc/<pid>/stat`` over a short window instead: the share of CPU time that was not idle, and
the processes that used it. Linux only; elsewhere they report nothing and never block.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sample_fast.procs import proc_stats

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs since boot, from /proc/stat's first line (iowait counts as idle)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - idle, total


def _proc_cpu() -> dict[int, tuple[int, str]]:
    """pid -> (utime + stime jiffies, command name) for every live process."""
    return {pid: (int(fields[11]) + int(fields[12]), name) for pid, (name, fields) in proc_stats().items()
            if len(fields) > 12}  # fmt: skip


def cmdline(pid: int, limit: int = 160) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:limit]
    except OSError:
        return ""


@dataclass
class BusyProcess:
    pid: int
    name: str
    cpu_share: float  #: cores used over the window (1.0 = one core fully busy)
    cmdline: str


@dataclass
class CpuSample:
    """What the CPUs did over one window."""

    window_s: float
    busy_fraction: float  #: non-idle share of all CPUs' time (0..1); NaN where /proc/stat is unreadable
    load_average: list[float]
    processes: list[BusyProcess] = field(default_factory=list)  #: those above ``min_share``, busiest first

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_cpu(window_s: float = 3.0, min_share: float = 0.05, exclude: set[int] | None = None) -> CpuSample:
    """Measure CPU use over ``window_s`` seconds (blocks that long): the busy share and the busy processes."""
    exclude = {os.getpid()} | (exclude or set())
    t0, p0 = _cpu_times(), _proc_cpu()
    time.sleep(window_s)
    t1, p1 = _cpu_times(), _proc_cpu()
    busy = float("nan")
    if t0 is not None and t1 is not None and t1[1] > t0[1]:
        busy = (t1[0] - t0[0]) / (t1[1] - t0[1])
    procs = []
    for pid, (jiffies, name) in p1.items():
        if pid in exclude or pid not in p0:
            continue
        share = (jiffies - p0[pid][0]) / _CLK_TCK / window_s
        if share >= min_share:
            procs.append(BusyProcess(pid, name, round(share, 3), cmdline(pid)))
    procs.sort(key=lambda p: -p.cpu_share)
    return CpuSample(window_s, round(busy, 4), load_average(), procs)


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, rounded; [] where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


@dataclass
class QuietCheck:
    """The outcome of ``wait_for_quiet``: the last sample, how long it waited and whether the machine got quiet."""

    quiet: bool
    waited_s: float
    sample: CpuSample

    def as_dict(self) -> dict[str, Any]:
        return {"quiet": self.quiet, "waited_s": round(self.waited_s, 1), **self.sample.as_dict()}

    def describe(self) -> str:
        who = ", ".join(f"{p.name}[{p.pid}] {p.cpu_share:.2f} cores" for p in self.sample.processes[:4]) or "none"
        return (
            f"CPU busy {self.sample.busy_fraction:.0%} over {self.sample.window_s:g} s, "
            f"load {self.sample.load_average}, busy processes: {who}"
        )


def wait_for_quiet(
    max_busy: float = 0.10, window_s: float = 3.0, timeout_s: float = 300.0, exclude: set[int] | None = None
) -> QuietCheck:
    """Sample the CPUs until one window is at most ``max_busy`` busy, for at most ``timeout_s`` seconds.

    Returns a QuietCheck whose ``quiet`` is False when the deadline passed first (the caller decides whether to go
    on); a machine without /proc/stat counts as quiet (nothing can be measured there).
    """
    t0 = time.monotonic()
    while True:
        sample = sample_cpu(window_s, exclude=exclude)
        waited = time.monotonic() - t0
        if not sample.busy_fraction > max_busy:  # NaN (unmeasurable) counts as quiet
            return QuietCheck(True, waited, sample)
        if waited + window_s > timeout_s:
            return QuietCheck(False, waited, sample)
