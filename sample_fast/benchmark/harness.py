"""The shared benchmark harness: machine record, quiet check, timing helpers and result files, for every script.

The FPS suite (``python -m sample_fast.benchmark``) and each script of ``benchmarks/`` measure through these
functions instead of keeping their own copies:

* ``machine_record()``: where a figure was measured (CPU model, cores, memory, GPU, platform, Python, package
  versions, git revision, load average, CPU busy share);
* ``check_quiet()``: called before measuring; samples how busy the CPUs are *now* (``quiet.sample_cpu``, not the
  slow 1-minute load average), optionally waits for a quiet machine (``--wait-quiet``), warns when it is busy and
  returns the record every result file keeps under ``quiet``;
* timing: ``time_calls`` (a fixed number of calls), ``run_for`` (calls until a time is up), ``interleave`` (every
  case once per round, round-robin, so a load change hits all cases alike), ``median``, ``paired_ratio`` and
  ``share_at_least`` (per-round comparisons), ``spread`` (median, min, max, quartiles);
* ``write_results(out_dir, name, data, markdown)``: the JSON + Markdown pair, written atomically.

The suite's own window timing (warm-up, timed windows, hard timeouts) stays in ``measure``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from . import quiet as _quiet
from .measure import summarize
from .quiet import load_average  # re-exported: one copy, also used by quiet.sample_cpu

T = TypeVar("T")

#: Package versions every machine record carries (None where not installed).
PACKAGES = (
    "torch",
    "numpy",
    "numba",
    "mujoco",
    "mujoco-mjx",
    "mujoco-warp",
    "warp-lang",
    "jax",
    "jaxlib",
    "envpool",
    "gymnasium",
    "torchrl",
    "tensordict",
    "hydra-core",
    "sample_fast",
)
#: Above this non-idle share of all CPUs the machine counts as busy (another process would take a visible share
#: of a 2-core machine: 10% is a fifth of a core).
MAX_BUSY = 0.10
QUIET_WINDOW_S = 1.0  #: seconds the quiet check samples the CPUs (it blocks that long)
QUIET_TIMEOUT_S = 300.0  #: the longest ``--wait-quiet`` waits before measuring anyway


# ----- machine ----------------------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_1min() -> float | None:
    return (load_average() or [None])[0]


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for pkg in packages:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def git_revision() -> str | None:
    """The source tree's revision (``sample_fast.train.git_revision``: 12 hex digits, ``-dirty`` when modified)."""
    try:
        from sample_fast.train import git_revision as revision  # lazy: it imports torch and the trainer
    except ImportError:
        return None
    return revision()


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            return round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def _gpu() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken CUDA install must not cost the record
        return None


def machine_record(quiet_record: Mapping[str, Any] | None = None, packages: Sequence[str] = PACKAGES) -> dict:
    """Where a figure was measured. ``cpu_busy_fraction`` comes from ``quiet_record`` (``check_quiet``'s result)
    when given; otherwise the CPUs are sampled for ``QUIET_WINDOW_S`` seconds here."""
    if quiet_record is None:
        busy = _quiet.sample_cpu(QUIET_WINDOW_S).busy_fraction
    else:
        busy = quiet_record.get("busy_fraction")
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
        "memory_gib": _memory_gib(),
        "gpu": _gpu(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(packages),
        "git_revision": git_revision(),
        "load_average": load_average(),
        "cpu_busy_fraction": busy,
        "recorded_utc": now_utc(),
    }


# ----- quiet check ------------------------------------------------------------------------------------------------
def add_quiet_arguments(parser: argparse.ArgumentParser) -> None:
    """The quiet-check options every script takes (``check_quiet_from_args`` reads them)."""
    g = parser.add_argument_group("quiet check (before measuring)")
    g.add_argument("--wait-quiet", action="store_true", help="wait until the CPUs are quiet before measuring")
    g.add_argument("--max-busy", type=float, default=MAX_BUSY, help="busy share of all CPUs that counts as busy")
    g.add_argument("--quiet-window-s", type=float, default=QUIET_WINDOW_S, help="seconds each CPU sample lasts")
    g.add_argument("--quiet-timeout-s", type=float, default=QUIET_TIMEOUT_S, help="longest --wait-quiet waits")


def check_quiet(
    wait: bool = False,
    max_busy: float = MAX_BUSY,
    window_s: float = QUIET_WINDOW_S,
    timeout_s: float = QUIET_TIMEOUT_S,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Sample the CPUs (with ``wait``: until one window is at most ``max_busy`` busy, for up to ``timeout_s``),
    warn through ``log`` (default: stderr) when the machine is busy, and return the record to keep with the
    results: ``QuietCheck.as_dict()`` plus the threshold and whether it waited. Never refuses to measure: a busy
    machine gives lower-bound figures, which the record says."""
    if wait:
        check = _quiet.wait_for_quiet(max_busy=max_busy, window_s=window_s, timeout_s=timeout_s)
    else:
        sample = _quiet.sample_cpu(window_s)
        check = _quiet.QuietCheck(not sample.busy_fraction > max_busy, 0.0, sample)  # NaN: unmeasurable, quiet
    record = {**check.as_dict(), "max_busy": max_busy, "waited": wait}
    if not check.quiet:
        msg = f"warning: the machine is busy ({check.describe()}); absolute figures are lower bounds"
        if not wait:
            msg += " (--wait-quiet waits for a quiet machine)"
        (log or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
    return record


def check_quiet_from_args(args: argparse.Namespace, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    return check_quiet(args.wait_quiet, args.max_busy, args.quiet_window_s, args.quiet_timeout_s, log)


def quiet_line(record: Mapping[str, Any]) -> str:
    """One Markdown sentence for a report: how busy the CPUs were just before measuring."""
    busy = record.get("busy_fraction")
    busy_s = "unmeasurable" if busy is None or busy != busy else f"{busy:.0%}"  # busy != busy: NaN
    verdict = "quiet" if record.get("quiet") else "**busy: absolute figures are lower bounds**"
    waited = f", after waiting {record.get('waited_s', 0):g} s" if record.get("waited") else ""
    return (
        f"Quiet check before measuring: CPU busy {busy_s} over {record.get('window_s', 0):g} s "
        f"(threshold {record.get('max_busy', MAX_BUSY):.0%}){waited}, load {record.get('load_average')}: {verdict}."
    )


# ----- timing -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timed:
    """``calls`` calls took ``wall_s`` wall seconds and ``cpu_s`` seconds of the CPU clock (process or thread)."""

    calls: int
    wall_s: float
    cpu_s: float


def time_calls(
    fn: Callable[[int], object],
    calls: int,
    sync: Callable[[], None] | None = None,
    cpu_clock: Callable[[], float] = time.process_time,
) -> Timed:
    """Call ``fn(k)`` for k in 0..calls-1 and time the block; ``sync()`` (a device wait) runs before the clocks
    stop. The CPU clock is read outside the wall window, so the wall time includes only the calls and the sync."""
    c0 = cpu_clock()
    t0 = time.perf_counter()
    for k in range(calls):
        fn(k)
    if sync is not None:
        sync()  # SYNC: the block is charged for the device work it dispatched
    wall_s = time.perf_counter() - t0
    return Timed(calls, wall_s, cpu_clock() - c0)


def run_for(
    fn: Callable[[int], object],
    seconds: float,
    min_calls: int = 1,
    sync: Callable[[], None] | None = None,
    cpu_clock: Callable[[], float] = time.process_time,
) -> Timed:
    """Call ``fn(k)`` (k = 0, 1, ...) until ``seconds`` have passed and at least ``min_calls`` calls were made,
    then ``sync()``; the block's times as in ``time_calls``."""
    c0 = cpu_clock()
    t0 = time.perf_counter()
    calls = 0
    while True:
        fn(calls)
        calls += 1
        if time.perf_counter() - t0 >= seconds and calls >= min_calls:  # PERF: one clock read per call
            break
    if sync is not None:
        sync()  # SYNC: as in time_calls
    wall_s = time.perf_counter() - t0
    return Timed(calls, wall_s, cpu_clock() - c0)


def interleave(cases: Mapping[str, Callable[[int], T]], rounds: int) -> dict[str, list[T]]:
    """Run every case once per round, in order (``fn(round_index)``); each case's results, one per round.

    Round-robin rather than case after case: a load change from another process then hits every case alike,
    and the per-round results can be compared pairwise (``paired_ratio``)."""
    out: dict[str, list[T]] = {name: [] for name in cases}
    for r in range(rounds):
        for name, fn in cases.items():
            out[name].append(fn(r))
    return out


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over rounds of ``a[k] / b[k]`` (both measured in round k, so a load change hits the pair alike)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def share_at_least(a: Sequence[float], b: Sequence[float], factor: float) -> float:
    """Share of rounds in which ``a[k] >= factor * b[k]``."""
    return sum(x >= factor * y for x, y in zip(a, b, strict=True)) / len(a)


def spread(xs: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, quartiles and every value (``measure.summarize``)."""
    return summarize(list(xs))


# ----- result files -----------------------------------------------------------------------------------------------
RESULT_PREFIX = "RESULT "


def print_case_result(row: Mapping[str, Any]) -> None:
    """The child's side of ``run_case_in_subprocess``: print ``row`` as the ``RESULT <json>`` line it reads."""
    print(RESULT_PREFIX + json.dumps(row), flush=True)


def run_case_in_subprocess(script: str, case: dict[str, Any], timeout_s: float, timeout_note: str = "") -> dict:
    """Run ``python script --case <case as JSON>`` in a fresh interpreter (a case that hangs or crashes in native code
    cannot take the benchmark down) and return the dict its last ``RESULT <json>`` line printed
    (``print_case_result``), plus ``wall_s``. A timeout, a non-zero exit or no result line becomes
    ``{**case, "error": ...}``."""
    import subprocess

    cmd = [sys.executable, os.path.abspath(script), "--case", json.dumps(case)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)  # SYNC: bounded by timeout_s
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timeout after {timeout_s:.0f} s{timeout_note}"}
    rows = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not rows:
        return {**case, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    return {**json.loads(rows[-1][len(RESULT_PREFIX) :]), "wall_s": time.perf_counter() - t0}


def write_text(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` through a temporary file and a rename: a run killed mid-write leaves the old file whole."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def write_json(data: Any, path: str | os.PathLike) -> str:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_results(
    out_dir: str | os.PathLike,
    name: str,
    data: Mapping[str, Any] | None,
    markdown: str | None = None,
    merge: bool = False,
) -> dict[str, str]:
    """Write ``<out_dir>/<name>.json`` (``data``) and ``<out_dir>/<name>.md`` (``markdown``; None: no file).

    With ``merge`` the JSON's existing top-level keys that ``data`` does not set are kept (scripts that add one
    configuration's results to a shared file). Returns the paths written, by kind (``json``, ``markdown``)."""
    out_dir = os.fspath(out_dir) or "."
    os.makedirs(out_dir, exist_ok=True)
    paths: dict[str, str] = {}
    if data is not None:
        path = os.path.join(out_dir, f"{name}.json")
        if merge and os.path.exists(path):
            with open(path) as f:
                data = {**json.load(f), **data}
        paths["json"] = write_json(data, path)
    if markdown is not None:
        text = markdown if markdown.endswith("\n") else markdown + "\n"
        paths["markdown"] = write_text(os.path.join(out_dir, f"{name}.md"), text)
    return paths


def split_stem(stem: str | os.PathLike) -> tuple[str, str]:
    """``"a/b/envs"`` -> ``("a/b", "envs")``: scripts whose ``--out`` names the files without an extension."""
    head, tail = os.path.split(os.fspath(stem))
    return head or ".", tail
