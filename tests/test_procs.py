"""sample_fast.procs' /proc readers: the stat fields after a command name with spaces and parentheses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sample_fast.procs import cpu_seconds, pid_alive, proc_stat, proc_stats

# A child that renames itself (its comm, at most 15 bytes) to a name with ") (" in it, then waits.
CHILD = "import sys; open('/proc/self/comm', 'w').write('a) b (c'); print('x', flush=True); sys.stdin.readline()"


@pytest.mark.timeout(30)
def test_proc_stat_parses_after_the_last_parenthesis():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "x\n"  # renamed
        name, fields = proc_stat(child.pid)
        assert name == "a) b (c"
        assert fields[0] in "RSD" and int(fields[1]) == os.getpid()  # state, ppid
        assert int(fields[3]) == os.getsid(child.pid)  # session
        assert proc_stats()[child.pid][0] == name  # the scan of every process reads it the same way
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert proc_stat(child.pid) is None and not pid_alive(child.pid)  # reaped: gone


def test_cpu_seconds_of_this_process_grows_and_is_zero_for_a_missing_pid():
    before = cpu_seconds()
    x = 0
    for i in range(2_000_000):
        x += i
    assert cpu_seconds() > before
    assert cpu_seconds(2**22 + 12345) == 0.0  # above the default pid_max: no such process


def test_leaked_shm_counts_new_unmapped_entries_only():
    import mmap

    from sample_fast.procs import leaked_shm, mapped_shm, shm_entries

    before = shm_entries()
    name = f"psm_sftest_{os.getpid()}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    try:
        assert leaked_shm(before, ("psm_sftest_",), wait_s=0.0) == {name}  # new, nobody maps it
        assert leaked_shm(before | {name}, ("psm_sftest_",), wait_s=0.0) == set()  # there before: not new
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:
            assert name in mapped_shm()
            assert leaked_shm(before, ("psm_sftest_",), wait_s=0.0) == set()  # mapped by a live process
            mapped[0] = 1
    finally:
        os.unlink(path)
