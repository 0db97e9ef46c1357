"""Process-lifecycle helpers for the runner: heartbeats, parent-death signals, stack dumps, /proc readings.

Owns nothing long-lived; every function here is a small, Linux-first utility used by ``runner.py`` and the
sampler's child-process entry point, and by ``benchmarks/bench_sampler.py`` to read memory and CPU time.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

# Indices into the shared ``control`` tensor (float64) the runner and the sampler child share.
CTRL_STOP = 0  # 1.0: the sampler should finish its current rollout and exit
CTRL_SAMPLER_HEARTBEAT = 1  # time.time() of the sampler's last sign of life
CTRL_LEARNER_HEARTBEAT = 2  # time.time() of the learner loop's last sign of life
CTRL_SAMPLER_STEPS = 3  # env steps the sampler has written into READY slots
CTRL_SAMPLER_WAIT_S = 4  # seconds the sampler spent waiting for a FREE slot (backpressure)
CTRL_SAMPLER_READY = 5  # 1.0 once the sampler built its envs and policy
CTRL_SAMPLER_SLOTS = 6  # slots the sampler processes of this run have marked READY (continues across restarts)
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

    def reset(self) -> None:
        """Forget the published state (a writer that died mid-copy leaves the count odd); only while no writer runs."""
        self.seq[0] = 0

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


#: glibc malloc settings for the training processes (``keep_freed_memory``): heap-allocate blocks up to 32 MB (the
#: largest threshold glibc accepts on 64-bit) and never trim freed heap memory back to the OS.
MALLOC_SETTINGS = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 36}


def keep_freed_memory() -> bool:
    """Keep freed tensor memory in the process (glibc) instead of returning it to the OS after every step.

    PERF: by default glibc serves a block above its (dynamic) mmap threshold with a fresh ``mmap`` and unmaps it on
    free, so every minibatch's activations and a normalised 256-frame pixel batch (29 MB) fault their pages in
    again: an out-of-place normalisation of 256 Pong frames took 20 ms instead of ~3 ms, and with this setting the
    Nature-CNN learner step is 1.27x faster (benchmarks/results/cnn_cpu_malloc.md). This sets the thresholds in
    this process (``mallopt``) and in the environment, where the processes it spawns (the sampler) read them at
    start-up. A value the user already set in the environment wins (a malformed one is left to glibc, which ignores
    it). Returns whether ``mallopt`` took both; a no-op (False) off Linux or off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    values: dict[str, int | None] = {}
    for name, default in MALLOC_SETTINGS.items():
        try:
            values[name] = int(os.environ.setdefault(name, str(default)))
        except ValueError:
            values[name] = None
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no glibc mallopt
        return False
    took = []
    # M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3 (malloc.h); mallopt returns 1 on success
    for param, name in ((-1, "MALLOC_TRIM_THRESHOLD_"), (-3, "MALLOC_MMAP_THRESHOLD_")):
        value = values[name]
        took.append(value is not None and mallopt(param, ctypes.c_int(max(0, min(value, 2**31 - 1)))) == 1)
    return all(took)


#: The signals that ask a run to stop. Only the main (learner) process acts on them; the processes it starts (the
#: sampler, multiprocessing's resource tracker, a forkserver) must survive them, so that the runner can save a final
#: checkpoint and then stop them itself: ``kill -TERM -- -PGID``, a closed terminal (SIGHUP) and Ctrl-C reach every
#: process of the group at once.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block STOP_SIGNALS in this thread while a child process is started, so the child is born with them blocked.

    A spawned (fork + exec) child inherits the signal mask, so a group signal that arrives while it is still
    importing (before its entry point can ignore the signals) stays pending instead of killing it; the child then
    ignores the signals and unblocks them (``ignore_stop_signals``). Signals that arrive here meanwhile are delivered
    to this process when the block ends (or to another of its threads at once): none is lost."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_stop_signals() -> None:
    """In a child process: ignore STOP_SIGNALS (the parent stops us through shared state), then unblock them (a
    pending one is discarded: the parent got it too)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


#: ``runner.learner_sched`` values and the Linux scheduling policies they name (``man 7 sched``)
SCHED_POLICIES = {"normal": "SCHED_OTHER", "batch": "SCHED_BATCH", "idle": "SCHED_IDLE"}


def sched_policy(name: str) -> int:
    """The ``os`` constant of a ``SCHED_POLICIES`` name. ValueError for an unknown name, or where this OS has no
    such policy (only Linux has SCHED_BATCH and SCHED_IDLE)."""
    if name not in SCHED_POLICIES:
        raise ValueError(f"unknown scheduling policy {name!r}; choose one of: {', '.join(SCHED_POLICIES)}")
    policy = getattr(os, SCHED_POLICIES[name], None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        raise ValueError(
            f"the {name} scheduling policy ({SCHED_POLICIES[name]}) needs Linux; this is {sys.platform}: use normal"
        )
    return policy


def set_threads_sched(policy: int, skip: Collection[int] = ()) -> list[int]:
    """Move every thread of this process but those whose native ids are in ``skip`` to ``policy`` (static priority
    0). Threads started later inherit the policy of the thread that starts them, child processes that of the thread
    that forks them. An unprivileged thread may move to SCHED_BATCH or SCHED_IDLE, and from SCHED_BATCH back to
    SCHED_OTHER, but not out of SCHED_IDLE (PermissionError: that needs CAP_SYS_NICE or RLIMIT_NICE >= 20). Returns
    the ids moved; a thread that exits meanwhile is left out."""
    moved = []
    for name in sorted(os.listdir("/proc/self/task")):
        tid = int(name)
        if tid in skip:
            continue
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            continue
        moved.append(tid)
    return moved


def _block_stop_signals() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class KeptPolicyThread:
    """One worker thread to start child processes from, which keeps the scheduling policy of the thread that built
    it after the process's other threads moved to SCHED_BATCH or SCHED_IDLE (``set_threads_sched(..., skip=
    {thread.native_id})``): a child inherits its forking thread's policy, and one forked from an idle thread could
    not leave SCHED_IDLE. STOP_SIGNALS stay blocked in the thread for its whole life, so its children are born with
    them blocked (as under ``stop_signals_blocked``) and the signals are delivered to the other threads."""

    def __init__(self, name: str, timeout_s: float = 30.0) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=_block_stop_signals)
        try:
            self.native_id: int = self.call(threading.get_native_id, timeout_s)
        except BaseException:
            self.close()
            raise

    def call(self, fn: Callable[[], object], timeout_s: float) -> object:
        """``fn()`` on the thread: its result, or its exception re-raised here; TimeoutError (concurrent.futures)
        after ``timeout_s``."""
        return self._pool.submit(fn).result(timeout=timeout_s)

    def close(self) -> None:
        """Let the thread exit (it finishes a call in progress first; nothing waits for it)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (if not yet running) with STOP_SIGNALS blocked.

    The tracker unlinks the POSIX semaphores (and shared memory) of processes that die without cleaning up. CPython
    starts it with SIGINT and SIGTERM ignored, but not SIGHUP, so a hang-up of the terminal's process group killed it
    together with the run and its semaphores leaked in /dev/shm. Started here first, it inherits the block (its own
    start-up only unblocks SIGINT and SIGTERM), so SIGHUP stays blocked in it for good."""
    from multiprocessing import resource_tracker

    with stop_signals_blocked():
        resource_tracker.ensure_running()


class StackDumpFile:
    """An anonymous (already unlinked) temporary file a child process writes its stack dump into.

    Nothing of it is left on disk whatever happens to either process (kill -9 included): the file has no name once
    created, and its inode goes away with the last descriptor. The child gets a duplicate of the descriptor
    (``child_handle()``, picklable through multiprocessing's fd passing, as a Connection is); the parent reads what
    the child wrote with ``read()``."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="sample_fast_stacks_", suffix=".txt")
        os.unlink(path)
        self.fd: int | None = fd

    def child_handle(self) -> _InheritedFd:
        assert self.fd is not None, "StackDumpFile is closed"
        return _InheritedFd(self.fd)

    def read(self, limit: int = 20000) -> str:
        if self.fd is None:
            return ""
        try:
            size = os.fstat(self.fd).st_size
            return os.pread(self.fd, limit, max(0, size - limit)).decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _InheritedFd:
    """A file descriptor that crosses to a spawned/forkserver child as a duplicate (``multiprocessing.reduction.DupFd``,
    the mechanism behind pickled Connections); unpickled, it is the child's own fd number (an int)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _detach_fd, (reduction.DupFd(self.fd),)


def _detach_fd(dup) -> int:
    return dup.detach()


def register_stack_dump(target: str | int | None, sig: int = signal.SIGUSR1) -> object | None:
    """On ``sig``, write every thread's Python stack to ``target``: a path, a file descriptor (``StackDumpFile``'s
    child handle, unpickled) or None (stderr). Returns the open file to keep alive (the fd itself for an fd)."""
    if not hasattr(faulthandler, "register"):
        return None
    if isinstance(target, int):
        faulthandler.register(sig, file=target, all_threads=True, chain=False)
        return target
    handle = open(target, "w") if target else sys.stderr  # noqa: SIM115 -- must outlive this call
    faulthandler.register(sig, file=handle, all_threads=True, chain=False)
    return handle


def read_text(path: str | Path, limit: int = 20000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """``(command name, fields after it)`` of /proc/<pid>/stat, or None if the process is gone or unreadable.

    The name may contain spaces and parentheses, so the fields are those after the LAST ')': ``fields[0]`` state,
    ``[1]`` ppid, ``[2]`` pgrp, ``[3]`` session, ``[11]`` utime, ``[12]`` stime (stat(5) fields 3, 4, 5, 6, 14, 15).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, sep, tail = text.rpartition(")")
    if not sep:
        return None
    return head[head.find("(") + 1 :], tail.split()


def proc_stats() -> dict[int, tuple[str, list[str]]]:
    """``proc_stat`` of every process readable now (pid -> (name, fields)); empty where there is no /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    out = {}
    for entry in entries:
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            out[int(entry)] = stat
    return out


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and bool(stat[1]) and stat[1][0] != "Z"


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
    stat = proc_stat(pid or os.getpid())
    if stat is None or len(stat[1]) < 13:
        return 0.0
    fields = stat[1]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (stat fields 14, 15)


def shm_entries() -> set[str]:
    """Names in /dev/shm (shared-memory segments and POSIX semaphores); empty set where there is none."""
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def mapped_shm(pids: Iterable[int] | None = None) -> set[str]:
    """/dev/shm names that ``pids`` (default: every live process) have mapped: in use, so not leaked.

    Matched by inode, not by the name in /proc/<pid>/maps: glibc's ``sem_open`` creates a semaphore under a
    temporary name, maps it and only then links it to its real name, so its creator's maps show the temporary
    name, "(deleted)", for as long as it lives (every multiprocessing lock, queue and event of a spawn context).
    """
    inodes: set[int] = set()
    if pids is None:
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                inodes.update(int(line.split(maxsplit=5)[4]) for line in f if " /dev/shm/" in line)
        except (OSError, IndexError, ValueError):
            pass
    names: set[str] = set()
    for name in shm_entries():
        try:
            if os.stat(f"/dev/shm/{name}").st_ino in inodes:
                names.add(name)
        except OSError:
            pass  # removed meanwhile
    return names


#: The window the tests give ``leaked_shm`` for entries still being released. It costs time only while some new entry
#: stays unmapped.
LEAK_WINDOW_S = 5.0


def leaked_shm(before: set[str], prefixes: tuple[str, ...], wait_s: float = 2.0) -> set[str]:
    """/dev/shm entries with one of ``prefixes`` created since ``before`` that stay unmapped: leaked. Counted by
    ``unmapped_in_every_look``, so an entry that is being released, and another program's entry that is unmapped for
    a moment or that appears after the first look (a second pytest-xdist worker's runs), are not."""
    return unmapped_in_every_look(lambda: {n for n in shm_entries() - before if n.startswith(prefixes)}, wait_s)


def unmapped_in_every_look(candidates: Callable[[], set[str]], wait_s: float = 2.0) -> set[str]:
    """The /dev/shm entries of ``candidates()`` that no live process maps in every look over ``wait_s`` (one look
    every 0.1 s; the first look with nothing left returns at once). A leak stays: an entry that is being released (a
    process that just exited unlinks its entries last) drops out of a later look, and one that appears only after the
    first look is not counted."""
    deadline = time.monotonic() + wait_s
    left: set[str] | None = None
    while True:
        new = candidates() - mapped_shm()
        left = new if left is None else left & new
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
