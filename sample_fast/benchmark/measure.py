"""Timing primitives of the benchmark suite: warm-up, repeated timed windows, summary statistics, hard timeouts.

Owns how a throughput figure is produced: a warm-up (compilation, caches, thread start-up) that is never timed,
then ``repeats`` back-to-back windows of ``seconds_per_repeat`` each; a window's figure is env steps (agent actions)
divided by its wall time, measured after a device sync. It knows nothing about envs or policies.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sample_fast.procs import proc_stat, proc_stats


class Skip(Exception):  # noqa: N818 -- a control-flow signal, not an error
    """A case that cannot run here (missing package, incompatible setting). The message says how to enable it."""


class MeasureTimeout(Skip):
    """A case ran past its time budget; reported as a skip line."""


@dataclass
class Timing:
    """How each case is timed."""

    warmup_s: float = 1.0  #: untimed seconds after the first step (which may compile)
    repeats: int = 3  #: timed windows
    seconds_per_repeat: float = 3.0  #: length of each window
    timeout_s: float = 300.0  #: soft budget of one case, start-up included (hard budget for isolated cases)


@dataclass
class CaseResult:
    """What one measured case returns. ``rates`` are env steps/s, one per timed window."""

    rates: list[float]
    frame_skip: int
    device: str = "cpu"
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def summarize(rates: list[float]) -> dict[str, Any]:
    """Median, min, max and quartiles of per-window rates (the spread a reader should trust the median by)."""
    if not rates:
        raise ValueError("no rates to summarize")
    xs = sorted(float(r) for r in rates)
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1 = q3 = xs[0]
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "q1": q1,
        "q3": q3,
        "repeats": [float(r) for r in rates],
    }


def timed_windows(
    step: Callable[[], int],
    sync: Callable[[], None],
    timing: Timing,
    started_s: float | None = None,
) -> list[float]:
    """Run ``step()`` (returns env steps done) through a warm-up and ``timing.repeats`` timed windows.

    The first ``step()`` is untimed and excluded from the warm-up clock (it may JIT-compile). ``sync()`` must block
    until every dispatched step has finished (a device read): it is called before each window opens and closes, so
    asynchronous backends are charged for all the work they were given. Raises MeasureTimeout when the whole case
    (from ``started_s``) exceeds ``timing.timeout_s``.
    """
    started_s = time.perf_counter() if started_s is None else started_s
    deadline = started_s + timing.timeout_s

    def check() -> None:
        if time.perf_counter() > deadline:
            raise MeasureTimeout(f"ran past its {timing.timeout_s:g} s budget (raise measure_timeout_s)")

    step()
    sync()
    check()
    warm_end = time.perf_counter() + timing.warmup_s
    while time.perf_counter() < warm_end:
        step()
        check()
    sync()
    rates = []
    for _ in range(timing.repeats):
        num_steps = 0
        t0 = time.perf_counter()
        stop = t0 + timing.seconds_per_repeat
        while True:
            num_steps += step()  # PERF: the loop body is one step and one clock read
            if time.perf_counter() >= stop:
                break
        sync()  # SYNC: the window is charged for every step it dispatched
        elapsed = time.perf_counter() - t0
        rates.append(num_steps / elapsed)
        check()
    return rates


class WindowRecorder:
    """Turns a stream of ``(time, cumulative env steps)`` points into per-window rates (for loops we do not drive,
    e.g. the Runner's ``on_train`` hook). Windows open after ``warmup_s`` from the first point and each closes at
    the first point at least ``seconds_per_repeat`` and at least ``min_points`` points after it opened; a window's
    rate is exact between its two points, whatever the granularity of the stream. ``min_points`` bounds the
    quantisation: a window of k points is k intervals of a jittery stream (an async learner's train calls)."""

    def __init__(self, timing: Timing, min_points: int = 1):
        if min_points < 1:
            raise ValueError(f"min_points must be >= 1, got {min_points}")
        self.timing = timing
        self.min_points = min_points
        self.rates: list[float] = []
        self._first_s: float | None = None
        self._open: tuple[float, int] | None = None
        self._points = 0  # points since the open window opened

    @property
    def done(self) -> bool:
        return len(self.rates) >= self.timing.repeats

    def add(self, t_s: float, env_steps: int) -> None:
        if self.done:
            return
        if self._first_s is None:
            self._first_s = t_s
        if self._open is None:
            if t_s - self._first_s >= self.timing.warmup_s:
                self._open, self._points = (t_s, env_steps), 0
            return
        t_open, steps_open = self._open
        self._points += 1
        if t_s - t_open >= self.timing.seconds_per_repeat and self._points >= self.min_points:
            self.rates.append((env_steps - steps_open) / (t_s - t_open))
            self._open, self._points = (t_s, env_steps), 0


def format_rate(x: float | None) -> str:
    """12345.6 -> '12.3k'; None/NaN -> '—'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


# ----- hard timeouts: one case in a child process ---------------------------------------------------------------
def _child_entry(fn: Callable[..., Any], args: tuple, conn: Any) -> None:
    try:
        msg = ("ok", fn(*args))
    except Skip as e:
        msg = ("skip", str(e))
    except BaseException as e:
        msg = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}")
    try:
        conn.send(msg)
    except (BrokenPipeError, OSError):
        pass  # the parent gave up on us (timeout) and closed its end
    finally:
        conn.close()


def run_isolated(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """Run ``fn(*args)`` in a spawned child and return its result; on timeout kill the child (and its process
    group) and raise MeasureTimeout. For cases that can hang inside native code (MJX's first call has been seen
    never to return), where an in-process soft deadline cannot help. ``fn`` must be a module-level function."""
    ctx = mp.get_context("spawn")
    recv_conn, send_conn = ctx.Pipe(duplex=False)
    # Not a daemon: the case may start its own processes (the train stage's async sampler).
    proc = ctx.Process(target=_child_entry, args=(fn, args, send_conn), name="sample_fast-bench-case")
    proc.start()
    send_conn.close()
    timed_out = False
    try:
        if not recv_conn.poll(timeout_s):  # SYNC: bounded wait for the child's single message
            timed_out = True
            raise MeasureTimeout(f"did not finish within {timeout_s:g} s (hard timeout; raise measure_timeout_s)")
        try:
            status, payload = recv_conn.recv()
        except EOFError:
            proc.join(timeout=5.0)
            raise RuntimeError(f"benchmark child process died (exit code {proc.exitcode})") from None
    finally:
        if not timed_out:
            proc.join(timeout=10.0)  # SYNC: bounded; it has sent its result and is exiting
        for pid in reversed(descendants(proc.pid)) if proc.is_alive() else []:  # e.g. an async Runner's sampler
            _signal(pid, signal.SIGKILL)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=3.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=3.0)
        recv_conn.close()
        proc.close()
    if status == "ok":
        return payload
    if status == "skip":
        raise Skip(payload)
    raise RuntimeError(payload)


# ----- processes we start with subprocess (the Sample Factory peer) ---------------------------------------------
def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found through /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for child, (_, fields) in proc_stats().items():
        children.setdefault(int(fields[1]), []).append(child)  # fields[1]: ppid
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int, grace_s: float = 5.0) -> list[int]:
    """SIGTERM ``pid`` and every descendant, wait up to ``grace_s``, SIGKILL the survivors. Returns the pids that
    were signalled. Pids are collected before signalling, so children re-parented to init are not lost."""
    pids = [pid, *descendants(pid)]
    for p in pids:
        _signal(p, signal.SIGTERM)
    end = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.1)
    for p in alive:
        _signal(p, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    stat = proc_stat(pid)
    if stat is None or not stat[1]:
        return False
    if stat[1][0] == "Z":  # a zombie is dead; reap it if it is ours
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True
