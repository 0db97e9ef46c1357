"""sample_fast.benchmark.quiet: CPU busy share and busy processes from /proc, and the bounded wait for quiet."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sample_fast.benchmark import quiet

SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


@pytest.mark.timeout(60)
def test_sample_cpu_sees_a_spinning_process():
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        sample = quiet.sample_cpu(window_s=1.5)
    finally:
        child.kill()
        child.wait(timeout=10)
    shares = {p.pid: p.cpu_share for p in sample.processes}
    # One busy loop uses up to one core; on a loaded 2-core machine it still gets a good part of one.
    assert 0.2 < shares[child.pid] <= 1.1
    assert "-c" in next(p.cmdline for p in sample.processes if p.pid == child.pid)
    # The machine-wide busy share includes the spinner's: at least its share spread over all cores (some slack).
    import os

    assert sample.busy_fraction >= 0.8 * shares[child.pid] / os.cpu_count()
    assert len(sample.load_average) == 3


def test_wait_for_quiet_returns_at_the_first_quiet_window(monkeypatch):
    busy = iter([0.9, 0.5, 0.05])
    monkeypatch.setattr(quiet, "sample_cpu", lambda window_s, exclude=None: quiet.CpuSample(window_s, next(busy), []))
    check = quiet.wait_for_quiet(max_busy=0.1, window_s=0.0, timeout_s=10.0)
    assert check.quiet and check.sample.busy_fraction == 0.05
    assert check.as_dict()["quiet"] is True and "busy 5%" in check.describe()


def test_wait_for_quiet_gives_up_at_the_deadline(monkeypatch):
    calls = []

    def always_busy(window_s, exclude=None):
        calls.append(window_s)
        return quiet.CpuSample(window_s, 0.95, [1.9, 1.0, 0.5], [quiet.BusyProcess(42, "python", 1.0, "python x")])

    monkeypatch.setattr(quiet, "sample_cpu", always_busy)
    check = quiet.wait_for_quiet(max_busy=0.1, window_s=0.0, timeout_s=0.0)
    assert not check.quiet and len(calls) == 1
    assert "python[42] 1.00 cores" in check.describe()
