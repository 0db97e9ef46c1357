"""sample_fast.procs' /proc readers: the stat fields after a command name with spaces and parentheses."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

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
    _write(path)
    try:
        assert leaked_shm(before, ("psm_sftest_",), wait_s=0.0) == {name}  # new, nobody maps it
        assert leaked_shm(before | {name}, ("psm_sftest_",), wait_s=0.0) == set()  # there before: not new
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:
            assert name in mapped_shm()
            assert leaked_shm(before, ("psm_sftest_",), wait_s=0.0) == set()  # mapped by a live process
            mapped[0] = 1
        assert leaked_shm(before, ("psm_sftest_",), wait_s=0.5) == {name}  # unmapped through the window: leaked
    finally:
        os.unlink(path)


def test_a_semaphore_its_creator_holds_is_mapped_not_leaked():
    """glibc's sem_open maps a semaphore under a temporary name before it links the real one, so the creator's
    /proc/<pid>/maps names it "(deleted)": matched by name, a live run's own locks and queues looked leaked (and a
    second xdist worker's leak check counted them). Matched by inode, they are in use."""
    import multiprocessing

    from sample_fast.procs import leaked_shm, mapped_shm, shm_entries

    before = shm_entries()
    lock = multiprocessing.get_context("spawn").Lock()  # a named POSIX semaphore: /dev/shm/sem.mp-...
    new = {n for n in shm_entries() - before if n.startswith("sem.mp-")}
    assert len(new) == 1, new
    assert new <= mapped_shm()
    assert new <= mapped_shm([os.getpid()]) and not new & mapped_shm([1])  # this process maps it, init does not
    assert leaked_shm(before, ("sem.mp-",), wait_s=0.0) == set()
    del lock  # multiprocessing unlinks it when the lock is collected
    gc.collect()
    assert not new & shm_entries()


def test_leaked_shm_counts_only_entries_there_and_unmapped_from_the_first_look_on():
    """Another program's entries (a second xdist worker's runs) come and go while the look waits: one unmapped at the
    first look that goes (being released), one that appears later and stays past the window. Neither belongs to
    the run that ended before the look; a look that kept the last poll's entries would count the second."""
    from sample_fast.procs import leaked_shm, shm_entries

    before = shm_entries()
    first, later = (f"/dev/shm/psm_sftest_{os.getpid()}_{i}" for i in (1, 2))
    _write(first)

    def others() -> None:
        time.sleep(0.3)
        _write(later)
        time.sleep(0.3)
        os.unlink(first)

    thread = threading.Thread(target=others)
    thread.start()
    try:
        assert leaked_shm(before, ("psm_sftest_",), wait_s=1.5) == set()
    finally:
        thread.join(timeout=10)
        for path in (first, later):
            if os.path.exists(path):
                os.unlink(path)


def test_unmapped_in_every_look_with_ownership_by_name():
    """The fault benchmark's rule (benchmarks/faults.py Run.leaked): the entries a run mapped that exist and stay
    unmapped through the window; an owned entry released during the window, another program's unmapped entry and an
    owned entry still mapped are not leaks."""
    import mmap

    from sample_fast.procs import unmapped_in_every_look

    pid = os.getpid()
    kept, released, mapped_one, foreign = (f"psm_sftest_{pid}_{tag}" for tag in ("kept", "released", "mapped", "x"))
    for name in (kept, released, mapped_one, foreign):
        _write(f"/dev/shm/{name}")
    owned = {kept, released, mapped_one}

    def existing() -> set[str]:
        return {n for n in owned if os.path.exists(f"/dev/shm/{n}")}

    timer = threading.Timer(0.3, os.unlink, args=(f"/dev/shm/{released}",))
    try:
        with open(f"/dev/shm/{mapped_one}", "r+b") as f, mmap.mmap(f.fileno(), 4096):
            timer.start()
            assert unmapped_in_every_look(existing, wait_s=0.8) == {kept}
        assert unmapped_in_every_look(existing, wait_s=0.0) == {kept, mapped_one}  # unmapped now
    finally:
        timer.cancel()
        timer.join(timeout=5)
        for name in (kept, released, mapped_one, foreign):
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


def _write(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)


_FAULTS_SCRIPT = r"""
import json, os, resource, sys
import torch
from sample_fast.procs import keep_freed_memory
ok = keep_freed_memory()
x = torch.zeros(256, 4 * 84 * 84, dtype=torch.uint8)  # a 256-frame Pong minibatch
for _ in range(3):  # warm-up: the first allocations fault in whatever memory they get
    x.to(torch.float32) + 1.0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # 10 x two live 29 MB float32 batches (as an out-of-place op), freed before the next
    x.to(torch.float32) + 1.0
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"ok": ok, "faults": faults, "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
                  "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_")}))
"""


def _faults(**env: str) -> dict:
    import json
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], env={**base, **env}, capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_keep_freed_memory_stops_the_page_faults_of_a_reallocated_batch():
    """glibc mmaps a block above its mmap threshold and unmaps it on free: each new batch faults in its ~7,000 pages
    again. Its default threshold starts at 128 KB and adapts to the blocks freed, so how often a process pays
    varies; pinned at that start (a user's setting, which wins over ours) every batch pays. With
    ``keep_freed_memory`` the freed blocks are reused from the heap, and spawned processes inherit the settings
    through the environment."""
    from sample_fast.procs import MALLOC_SETTINGS

    pages = 256 * 4 * 84 * 84 * 4 // 4096  # 7,056 pages per float32 batch, two batches per step
    kept = _faults()
    # The heap grows a few times, then is reused: 0 to 4 of the 20 batches faulted in fresh pages from run to run
    # (4 with the suite running on both cores, exactly 4 * pages + 1 once); 8 leaves room and is still under half
    # of the 15+ that the pinned threshold below pays.
    assert kept["ok"] is True and kept["faults"] <= 8 * pages, kept
    assert kept["mmap"] == str(MALLOC_SETTINGS["MALLOC_MMAP_THRESHOLD_"])
    assert kept["trim"] == str(MALLOC_SETTINGS["MALLOC_TRIM_THRESHOLD_"])
    user = _faults(MALLOC_MMAP_THRESHOLD_="131072")  # the user's value wins: glibc's start, pinned
    assert user["mmap"] == "131072" and user["faults"] >= 15 * pages, user  # fresh pages for ~every one of 20
    malformed = _faults(MALLOC_TRIM_THRESHOLD_="lots")  # left to glibc (which ignores it); no crash
    assert malformed["ok"] is False and malformed["trim"] == "lots", malformed
