"""The Ant-v4 learning race: wall-clock seconds to a mean return of 3000, sample_fast against Sample Factory.

    .venv/bin/python benchmarks/race_ant_v4.py --seeds 0 1 2 --threshold 3000 --timeout-s 900 \
        --out benchmarks/results/race_ant_v4 [--only sf|ours] [--ours-overrides "k=v k=v ..."]

Runs the two trainers one after the other, interleaved by seed (SF 0, ours 0, SF 1, ours 1, ...) so that machine
drift hits both alike, each as its own process group on the same task semantics (gymnasium Ant-v4: 27-dim
observation, no contact cost): Sample Factory 2.1.1's mujoco example in ``.venv-sf``, and
``python -m sample_fast.train env=ant_v4``. It reads each one's reports live (SF's console log, our progress.csv),
stamps them with its own clock (seconds since process launch, start-up included for both) and stops a run at the
first report whose mean return over the last 100 episodes reaches the threshold, or at its step cap / --timeout-s
(then the run counts as "not reached", +inf in the median). Owns those processes (every process of their sessions is
killed on exit, Ctrl-C, SIGTERM and errors) and the --out directory: per-run curve CSVs and logs, summary.json,
summary.md and curves.png.

The race proves its own fairness (issue #13): before every launch it waits until no trainer is left running and the
CPUs are idle over a few seconds of /proc/stat (the 1-minute load average still shows the previous contender for
minutes); it first runs each contender alone for --solo-s seconds with the race's settings, recording
``sf_solo_fps`` / ``ours_solo_fps``; and a race run whose average env steps/s (from its own step counter, first
to last report) falls more than --max-slowdown below its contender's solo figure is discarded and rerun.
"""

from __future__ import annotations

import argparse
import codecs
import csv
import datetime
import importlib.metadata
import io
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sample_fast.benchmark.sample_factory_peer import INSTALL_HINT, kill_tree, repo_root
from sample_fast.procs import pid_alive, proc_stats, shm_entries
from sample_fast.train import git_revision

CONTENDERS = ("sf", "ours")
LABELS = {"sf": "Sample Factory 2.1.1", "ours": "sample_fast"}
#: Ant-v4's semantics as task options (sample_fast.envs.tasks.ANT_V4_OPTIONS), for a tree without configs/env/ant_v4.
ANT_V4_OVERRIDE = (
    "+env.options={include_cfrc_ext_in_observation:false,contact_cost_weight:0.0,healthy_reward_always:true}"
)
CURVE_COLUMNS = ("launch_s", "env_steps", "episode_return_mean", "fps", "trainer_wall_s")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# runner.py print_stats: "Fps is (10 sec: 1638.4, 60 sec: ..., 300 sec: ...). Total num frames: 20480. ..."
_SF_FPS_RE = re.compile(r"Fps is \(10 sec: ([-0-9.e+]+|nan)[^)]*\)\. Total num frames: (\d+)")
# runner.py print_stats: "Avg episode reward: [(0, '-292.069')]" (policy 0's mean over its last stats_avg=100 episodes)
_SF_REWARD_RE = re.compile(r"Avg episode reward: \[\(0, '([^']+)'\)")


class RaceError(RuntimeError):
    """A setup problem the user can fix (the message says how)."""


# ----- data -------------------------------------------------------------------------------------------------------
@dataclass
class CurvePoint:
    """One report of a trainer: when we saw it, how far it was, and its mean return over the last 100 episodes."""

    launch_s: float  #: seconds since the process was launched (the race's clock), when the report was read
    env_steps: float
    episode_return_mean: float  #: NaN until the first episode has finished
    fps: float = math.nan  #: the trainer's own throughput figure (SF: last 10 s; ours: since the previous row)
    trainer_wall_s: float = math.nan  #: ours: progress.csv's wall_s (training time, start-up excluded); SF: NaN


@dataclass
class RunResult:
    """One contender x seed."""

    contender: str
    seed: int
    command: list[str]
    load_before: tuple[float, float, float]  #: os.getloadavg() just before launch
    curve: list[CurvePoint] = field(default_factory=list)
    time_to_threshold_s: float = math.inf  #: launch -> first report >= threshold; inf when never reached
    steps_at_threshold: float | None = None
    stop_reason: str = "not started"  #: threshold | timeout | exited (step cap or crash) | interrupted
    returncode: int | None = None
    wall_s: float = 0.0  #: launch -> stop requested (or exit)
    pid: int | None = None  #: the trainer's main process, also its session id
    attempt: int = 1  #: 1 for the first try of this contender x seed; more after a run was discarded as disturbed
    quiet_before: dict[str, Any] | None = None  #: sample_fast.benchmark.quiet.QuietCheck.as_dict() before launch

    @property
    def reached(self) -> bool:
        return math.isfinite(self.time_to_threshold_s)

    @property
    def median_fps(self) -> float:
        fps = [p.fps for p in self.curve if math.isfinite(p.fps) and p.fps > 0]
        return statistics.median(fps) if fps else math.nan

    @property
    def avg_fps(self) -> float:
        """The run's average env steps/s from its own reports (see ``average_fps``)."""
        return average_fps(self.curve)

    @property
    def best_return(self) -> float:
        rets = [p.episode_return_mean for p in self.curve if math.isfinite(p.episode_return_mean)]
        return max(rets) if rets else math.nan

    @property
    def lower_bound_s(self) -> float:
        """A lower bound of the true time to threshold: the time itself, or how long the run went without it."""
        return self.time_to_threshold_s if self.reached else self.wall_s


# ----- parsing ----------------------------------------------------------------------------------------------------
class SFLogParser:
    """Incremental parser of Sample Factory's console output: bytes in, curve points out.

    Every report is an "Fps is ... Total num frames: N" line followed by an "Avg episode reward" line once some
    episode has finished; a point is emitted at the reward line, with the frames and 10-s FPS of the line before.
    Lines may arrive split across reads (kept until their newline) and carry colorlog's ANSI codes (stripped).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._frames: float = 0.0
        self._fps: float = math.nan

    def feed(self, data: bytes, launch_s: float) -> list[CurvePoint]:
        """Parse the complete lines in ``data`` (plus what was pending); stamp new points with ``launch_s``."""
        text = self._pending + self._decoder.decode(data)
        *lines, self._pending = text.split("\n")
        points = []
        for line in lines:
            point = self._parse_line(_ANSI_RE.sub("", line), launch_s)
            if point is not None:
                points.append(point)
        return points

    def _parse_line(self, line: str, launch_s: float) -> CurvePoint | None:
        m = _SF_FPS_RE.search(line)
        if m:
            self._fps, self._frames = float(m.group(1)), float(m.group(2))
            return None
        m = _SF_REWARD_RE.search(line)
        if m:
            return CurvePoint(launch_s, self._frames, float(m.group(1)), self._fps)
        return None


_SF_TIME_RE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def parse_sf_log_timed(text: str | bytes, launch_unix: float) -> list[CurvePoint]:
    """All points of a complete SF log, each stamped by SF's own clock: its line's time minus ``launch_unix``.

    SF stamps every console line with local wall time to the millisecond; this rebuilds a curve from the log alone
    (after an interruption, when the follower's in-memory curve is gone). Lines without a stamp, and every line when
    ``launch_unix`` is NaN, get NaN.
    """
    parser = SFLogParser()
    data = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    points = []
    for line in data.split("\n"):
        m = _SF_TIME_RE.search(_ANSI_RE.sub("", line))
        launch_s = math.nan
        if m:
            stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1e3
            launch_s = stamp - launch_unix
        points += parser.feed((line + "\n").encode(), launch_s)
    return points


def parse_sf_log(text: str | bytes) -> list[CurvePoint]:
    """All points of a complete SF log (launch_s unknown: NaN)."""
    return parse_sf_log_timed(text, math.nan)


class ProgressCsvReader:
    """Reads the rows ``sample_fast.train`` appends to <run_dir>/progress.csv, each once, while it is written.

    The trainer appends one row per report (logging.interval_s); a row is taken only once its newline is there, so a
    half-written row is read on the next poll.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._num_read = 0

    def poll(self, launch_s: float) -> list[CurvePoint]:
        try:
            with open(self.path, newline="") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        complete = text[: text.rfind("\n") + 1]
        rows = list(csv.DictReader(io.StringIO(complete)))
        new = rows[self._num_read :]
        self._num_read = len(rows)
        return [
            CurvePoint(
                launch_s,
                _float(row.get("env_steps")),
                _float(row.get("episode_return_mean")),
                _float(row.get("fps")),
                _float(row.get("wall_s")),
            )
            for row in new
        ]

    def close(self) -> None:
        pass


class SFLogFollower:
    """Follows SF's console log file while SF writes it (reads what was appended since the last poll)."""

    def __init__(self, path: str) -> None:
        self.parser = SFLogParser()
        self._file = open(path, "rb")  # noqa: SIM115 (kept open while following; close() closes it)

    def poll(self, launch_s: float) -> list[CurvePoint]:
        return self.parser.feed(self._file.read(), launch_s)

    def close(self) -> None:
        self._file.close()


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def average_fps(curve: Sequence[CurvePoint], min_span_s: float = 5.0) -> float:
    """Average env steps/s between a run's first and last report: (steps_last - steps_first) / (t_last - t_first).

    Both contenders are measured the same way, by the race's own clock on their own step counters, with start-up
    (before the first report) left out. Sample Factory's 10-s FPS figure is no substitute: it moves in steps of
    4096 frames, so short runs all show the same value. NaN when the reports span less than ``min_span_s``.
    """
    pts = [p for p in curve if math.isfinite(p.env_steps) and math.isfinite(p.launch_s)]
    if len(pts) < 2 or pts[-1].launch_s - pts[0].launch_s < min_span_s:
        return math.nan
    return (pts[-1].env_steps - pts[0].env_steps) / (pts[-1].launch_s - pts[0].launch_s)


# ----- the threshold, medians and the verdict -----------------------------------------------------------------------
def first_crossing(curve: Sequence[CurvePoint], threshold: float) -> CurvePoint | None:
    """The first point whose mean return is >= ``threshold`` (NaN never counts), or None."""
    for point in curve:
        if point.episode_return_mean >= threshold:
            return point
    return None


def median_time(times: Sequence[float]) -> float:
    """Median over seeds with "never reached" as +inf (so it is inf once half or more never got there)."""
    if not times:
        return math.nan
    return statistics.median(sorted(times))


def verdict(ours: Sequence[RunResult], sf: Sequence[RunResult], max_ratio: float = 0.5) -> dict[str, Any]:
    """Median times, their ratio (ours/SF) and whether ours' median is at most ``max_ratio`` x SF's.

    A run that never reached the threshold took longer than it ran, so each median lies between the median of the
    lower bounds (time, or run length when not reached: the median is monotone in every argument) and the median
    with +inf. The bar is "met" when even ours' upper bound is <= max_ratio x SF's lower bound, "not met" when
    ours' lower bound is above max_ratio x SF's upper bound, and "undetermined" otherwise (e.g. neither reached).
    """
    out: dict[str, Any] = {"max_ratio": max_ratio}
    for name, runs in (("ours", ours), ("sf", sf)):
        out[f"{name}_median_s"] = median_time([r.time_to_threshold_s for r in runs])
        out[f"{name}_median_lower_bound_s"] = median_time([r.lower_bound_s for r in runs])
        out[f"{name}_num_reached"] = sum(r.reached for r in runs)
        out[f"{name}_num_runs"] = len(runs)
    if not ours or not sf:
        out.update(ratio=None, met=None, verdict="undetermined (one contender has no runs)")
        return out
    ours_hi, ours_lo = out["ours_median_s"], out["ours_median_lower_bound_s"]
    sf_hi, sf_lo = out["sf_median_s"], out["sf_median_lower_bound_s"]
    both_finite = math.isfinite(ours_hi) and math.isfinite(sf_hi)
    out["ratio"] = ours_hi / sf_hi if both_finite else None
    if ours_hi <= max_ratio * sf_lo:
        out["met"], out["verdict"] = True, "met"
    elif ours_lo > max_ratio * sf_hi:
        out["met"], out["verdict"] = False, "not met"
    else:
        out["met"], out["verdict"] = None, "undetermined (too many runs never reached the threshold)"
    return out


# ----- processes --------------------------------------------------------------------------------------------------
def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (our children run in their own session, so this finds grandchildren
    that were re-parented to init as well)."""
    # fields after the command name: state ppid pgrp session ...
    return [pid for pid, (_, fields) in proc_stats().items() if fields[0] != "Z" and int(fields[3]) == sid]


_TORCH_SHM = re.compile(r"torch_(\d+)_")  # torch's shared-memory files: /dev/shm/torch_<creator pid>_<...>


def remove_orphan_shm(before: set[str], root: str = "/dev/shm") -> list[str]:
    """Delete torch's shared-memory files that appeared in ``root`` since ``before`` and whose creating process is
    gone; returns their names. A contender killed with its session can leave them (under torch's ``file_system``
    sharing strategy its ``torch_shm_manager`` dies with it; an earlier race left 15 per run). Entries without a pid
    in the name are left alone: they cannot be told apart from another program's."""
    try:
        names = set(os.listdir(root)) - before
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        m = _TORCH_SHM.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(root, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def kill_session(sid: int, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process of session ``sid``, SIGKILL those left after ``grace_s``. Returns those signalled."""
    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = session_pids(sid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        signalled += pids
        end = time.monotonic() + grace_s
        while time.monotonic() < end and session_pids(sid):
            time.sleep(0.1)
    return signalled


@dataclass
class Contender:
    """How to launch one trainer and read its reports."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    make_reader: Callable[[], SFLogFollower | ProgressCsvReader]  #: called once the log file exists
    stop_signal: int | None  #: sent to the main process to stop it gracefully (None: kill the session at once)
    label: str = ""  #: the name in progress lines (default ``<name>_seed<seed>``; solo runs are ``solo_<name>``)


def race_one(
    c: Contender,
    seed: int,
    threshold: float,
    timeout_s: float,
    poll_s: float = 0.25,
    stop_grace_s: float = 60.0,
    report_every_s: float = 30.0,
) -> RunResult:
    """Launch ``c``, follow its reports until the threshold, its exit or ``timeout_s``; stop it; return a RunResult."""
    result = RunResult(c.name, seed, c.command, tuple(round(x, 2) for x in os.getloadavg()))
    label = c.label or run_name(c.name, seed)
    proc = None
    shm_before = shm_entries()
    with open(c.log_path, "wb") as log_file:
        reader = c.make_reader()
        t0 = time.monotonic()
        next_report = report_every_s
        try:
            proc = subprocess.Popen(
                c.command, stdout=log_file, stderr=subprocess.STDOUT, env=c.env, cwd=c.cwd, start_new_session=True
            )
            result.pid = proc.pid
            while True:
                now = time.monotonic() - t0
                exited = proc.poll() is not None  # checked before reading, so the last reports are not missed
                new_points = reader.poll(now)
                result.curve += new_points
                hit = first_crossing(new_points, threshold)
                if hit is not None:
                    result.time_to_threshold_s, result.steps_at_threshold = hit.launch_s, hit.env_steps
                if result.reached or exited or now >= timeout_s:
                    result.stop_reason = "threshold" if result.reached else "exited" if exited else "timeout"
                    break
                if now >= next_report:
                    last = result.curve[-1] if result.curve else CurvePoint(now, 0.0, math.nan)
                    print(
                        f"race: {label}: {now:.0f} s, {last.env_steps / 1e6:.2f}M env steps, "
                        f"mean return {last.episode_return_mean:.0f}",
                        flush=True,
                    )
                    next_report += report_every_s
                time.sleep(poll_s)
        except BaseException:
            result.stop_reason = "interrupted"
            raise
        finally:
            result.wall_s = time.monotonic() - t0
            if proc is not None:
                _stop(proc, c.stop_signal, stop_grace_s)
                result.returncode = proc.returncode
                leaked = remove_orphan_shm(shm_before)
                if leaked:
                    print(f"race: {label}: removed {len(leaked)} shared-memory files its processes left in /dev/shm")
            reader.close()
    return result


def _stop(proc: subprocess.Popen, stop_signal: int | None, grace_s: float) -> None:
    """Ask the main process to stop (``stop_signal``), wait ``grace_s``, then kill every process of its session."""
    try:
        if proc.poll() is None and stop_signal is not None:
            try:
                os.kill(proc.pid, stop_signal)
                proc.wait(timeout=grace_s)  # SYNC: ours writes a final checkpoint and exits
            except subprocess.TimeoutExpired:
                sig = signal.Signals(stop_signal).name
                print(f"race: pid {proc.pid} did not exit {grace_s:g} s after {sig}; killing it", file=sys.stderr)
            except ProcessLookupError:
                pass
    finally:  # also when a second Ctrl-C cuts the grace period short
        # Also after a clean exit: SF's workers have been seen to outlive their parent. The tree first while the
        # main process lives (its pid is ours until reaped), then whatever is left of its session (orphans).
        if proc.poll() is None:
            kill_tree(proc.pid)
        kill_session(proc.pid)
        try:
            proc.wait(timeout=10.0)  # SYNC: reap it
        except subprocess.TimeoutExpired:
            print(f"race: pid {proc.pid} still there after SIGKILL", file=sys.stderr)


def ant_v4_preset_available() -> bool:
    """Whether this tree has configs/env/ant_v4.yaml (the lead's preset); otherwise the options are passed inline."""
    from importlib.resources import files  # noqa: PLC0415 (only needed here)

    try:
        return files("sample_fast.configs").joinpath("env", "ant_v4.yaml").is_file()
    except ModuleNotFoundError:
        return False


def ours_contender(seed: int, args: argparse.Namespace, run_dir: str, log_path: str) -> Contender:
    env_args = ["env=ant_v4"] if ant_v4_preset_available() else ["env=ant", ANT_V4_OVERRIDE]
    command = [
        sys.executable,
        "-m",
        "sample_fast.train",
        *env_args,
        f"run.seed={seed}",
        f"run.dir={run_dir}",
        f"run.time_limit_s={args.timeout_s:g}",  # a backstop: the race stops it at --timeout-s from launch
        "logging.progress=plain",
    ]
    if args.ours_env_steps:
        command.append(f"run.total_env_steps={args.ours_env_steps:g}")
    command += shlex.split(args.ours_overrides)
    csv_path = os.path.join(run_dir, "progress.csv")
    return Contender(
        "ours",
        command,
        dict(os.environ, PYTHONUNBUFFERED="1"),
        os.path.dirname(run_dir),
        log_path,
        lambda: ProgressCsvReader(csv_path),
        signal.SIGINT,  # the trainer stops after the current step and writes a final checkpoint
    )


def sf_contender(seed: int, args: argparse.Namespace, train_dir: str, log_path: str) -> Contender:
    command = [
        sf_python(args.sf_venv),
        "-m",
        "sf_examples.mujoco.train_mujoco",
        "--env=mujoco_ant",
        "--algo=APPO",
        f"--num_workers={args.sf_workers}",
        f"--num_envs_per_worker={args.sf_envs_per_worker}",
        "--device=cpu",
        f"--seed={seed}",
        f"--train_for_env_steps={int(args.sf_env_steps)}",
        "--with_wandb=False",
        f"--train_dir={train_dir}",
        f"--experiment=race_ant_v4_seed{seed}",
        "--restart_behavior=overwrite",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the SF venv must not see sample_fast's site-packages

    return Contender("sf", command, env, train_dir, log_path, lambda: SFLogFollower(log_path), None)


def sf_python(venv: str) -> str:
    """The SF venv's python; a clear error with the install command when it is missing."""
    if not os.path.isabs(venv):
        venv = os.path.join(repo_root(), venv)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        raise RaceError(f"no Sample Factory virtualenv at {venv}; build it with: {INSTALL_HINT}")
    return python


# ----- outputs ----------------------------------------------------------------------------------------------------
def run_name(contender: str, seed: int) -> str:
    return f"{contender}_seed{seed}"


def write_curve(path: str, curve: Sequence[CurvePoint]) -> None:
    """One row per report: ``CURVE_COLUMNS`` (launch_s is the race's clock; trainer_wall_s is ours' own, or NaN)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CURVE_COLUMNS)
        for p in curve:
            writer.writerow(
                [
                    f"{p.launch_s:.3f}",
                    f"{p.env_steps:.0f}",
                    f"{p.episode_return_mean:.3f}",
                    f"{p.fps:.1f}",
                    f"{p.trainer_wall_s:.3f}",
                ]
            )


def read_curve(path: str) -> list[CurvePoint]:
    with open(path, newline="") as f:
        return [CurvePoint(*(_float(row[c]) for c in CURVE_COLUMNS)) for row in csv.DictReader(f)]


def run_record(r: RunResult, csv_name: str | None = None) -> dict[str, Any]:
    """A run as JSON (inf becomes null; its curve is in <run>.csv beside summary.json)."""
    return {
        "contender": r.contender,
        "seed": r.seed,
        "reached": r.reached,
        "time_to_threshold_s": _json_num(r.time_to_threshold_s),
        "steps_at_threshold": r.steps_at_threshold,
        "trainer_wall_s_at_threshold": _json_num(_trainer_wall_at_threshold(r)),
        "stop_reason": r.stop_reason,
        "returncode": r.returncode,
        "wall_s": round(r.wall_s, 3),
        "avg_fps": _json_num(r.avg_fps),
        "median_fps": _json_num(r.median_fps),
        "best_return": _json_num(r.best_return),
        "num_reports": len(r.curve),
        "load_before": list(r.load_before),
        "quiet_before": r.quiet_before,
        "attempt": r.attempt,
        "command": r.command,
        "curve_csv": csv_name or run_name(r.contender, r.seed) + ".csv",
    }


def run_from_record(rec: dict[str, Any], out_dir: str) -> RunResult:
    """Inverse of run_record (the curve read back from its CSV), for --only runs that keep the other contender's."""
    r = RunResult(rec["contender"], rec["seed"], rec["command"], tuple(rec["load_before"]))
    r.time_to_threshold_s = math.inf if rec["time_to_threshold_s"] is None else rec["time_to_threshold_s"]
    r.steps_at_threshold, r.stop_reason = rec["steps_at_threshold"], rec["stop_reason"]
    r.returncode, r.wall_s = rec["returncode"], rec["wall_s"]
    r.attempt, r.quiet_before = rec.get("attempt", 1), rec.get("quiet_before")
    curve_path = os.path.join(out_dir, rec["curve_csv"])
    r.curve = read_curve(curve_path) if os.path.exists(curve_path) else []
    return r


def _trainer_wall_at_threshold(r: RunResult) -> float:
    point = next((p for p in r.curve if p.launch_s == r.time_to_threshold_s), None) if r.reached else None
    return point.trainer_wall_s if point is not None else math.nan


def _json_num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 3)


def build_summary(
    runs: Sequence[RunResult],
    args: argparse.Namespace,
    machine: dict[str, Any],
    solo: dict[str, RunResult] | None = None,
    discarded: Sequence[RunResult] = (),
) -> dict[str, Any]:
    """summary.json's content. ``solo``: each contender's solo run (its ``avg_fps`` is the reference a race run is
    checked against); ``discarded``: race runs thrown away for running more than ``--max-slowdown`` below it."""
    by = {c: sorted((r for r in runs if r.contender == c), key=lambda r: r.seed) for c in CONTENDERS}
    solo = solo or {}
    v = verdict(by["ours"], by["sf"])
    out = {
        "threshold": args.threshold,
        "timeout_s": args.timeout_s,
        "sf_env_steps": args.sf_env_steps,
        "ours_env_steps": args.ours_env_steps,
        "ours_overrides": args.ours_overrides,
        "seeds": sorted({r.seed for r in runs}),
        "solo_s": args.solo_s,
        "max_slowdown": args.max_slowdown,
    }
    for c in CONTENDERS:
        out[f"{c}_solo_fps"] = _json_num(solo[c].avg_fps) if c in solo else None
    out.update(
        runs=[run_record(r) for c in CONTENDERS for r in by[c]],
        solo_runs=[run_record(solo[c], f"solo_{c}.csv") for c in CONTENDERS if c in solo],
        discarded_runs=[run_record(r, f"{run_name(r.contender, r.seed)}_attempt{r.attempt}.csv") for r in discarded],
        contenders={
            c: {
                "label": LABELS[c],
                "median_time_to_threshold_s": _json_num(v[f"{c}_median_s"]),
                "median_lower_bound_s": _json_num(v[f"{c}_median_lower_bound_s"]),
                "num_reached": v[f"{c}_num_reached"],
                "num_runs": v[f"{c}_num_runs"],
                "median_fps": _json_num(median_time([r.median_fps for r in by[c] if math.isfinite(r.median_fps)])),
                "median_avg_fps": _json_num(median_time([r.avg_fps for r in by[c] if math.isfinite(r.avg_fps)])),
                "solo_fps": out[f"{c}_solo_fps"],
            }
            for c in CONTENDERS
        },
        ratio_ours_over_sf=None if v["ratio"] is None else round(v["ratio"], 4),
        max_ratio=v["max_ratio"],
        bar_met=v["met"],
        verdict=v["verdict"],
        machine=machine,
    )
    return out


def _fmt_s(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.0f} s"


def _fmt_num(x: float | None, fmt: str = ".0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _share_of_solo(fps: float | None, solo: float | None) -> str:
    return "" if fps is None or not solo else f" ({fps / solo:.0%} of solo)"


def _quiet_cell(q: dict[str, Any] | None) -> str:
    if not q:
        return ""
    busy = q.get("busy_fraction")
    cell = "n/a" if busy is None or not math.isfinite(busy) else f"{busy:.0%}"
    return cell + ("" if q.get("quiet") else " (not quiet)")


def summary_markdown(summary: dict[str, Any]) -> str:
    """summary.md: the verdict, the solo figures, a table per contender and per run, the commands and the machine."""
    lines = [
        f"# Ant-v4 learning race: wall-clock seconds to a mean return >= {summary['threshold']:g}",
        "",
        f"Verdict: **{summary['verdict']}** (the bar: sample_fast's median <= {summary['max_ratio']:g} x Sample "
        "Factory's median; a run that never reached the threshold counts as +inf).",
        "",
        "Fairness: each contender ran alone, one after the other, after the race waited for the CPUs to be idle "
        "(busy share over a few seconds of /proc/stat, and no leftover trainer processes). Each was first measured "
        f"solo for {summary.get('solo_s') or 0:g} s with the race's settings; a race run whose average env steps/s "
        f"fell more than {summary.get('max_slowdown', 0):.0%} below its contender's solo figure was discarded and "
        "rerun (discarded runs are listed below). Average env steps/s = (steps at the last report - steps at the "
        "first) / (time between them), from each trainer's own step counter.",
        "",
        "| contender | median time to threshold | reached | ratio ours/SF | median avg env steps/s | "
        "solo env steps/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    ratio = summary["ratio_ours_over_sf"]
    for c, s in summary["contenders"].items():
        med = _fmt_s(s["median_time_to_threshold_s"])
        if s["median_time_to_threshold_s"] is None and s["median_lower_bound_s"] is not None and s["num_runs"]:
            med += f" (> {s['median_lower_bound_s']:.0f} s)"
        r = "" if c == "sf" else ("n/a" if ratio is None else f"{ratio:.2f}")
        avg, solo_fps = _fmt_num(s.get("median_avg_fps")), _fmt_num(s.get("solo_fps"))
        lines.append(f"| {s['label']} | {med} | {s['num_reached']}/{s['num_runs']} | {r} | {avg} | {solo_fps} |")
    lines += [
        "",
        "| run | time to threshold | env steps then | trainer wall_s then | stopped by | best mean return | "
        "avg env steps/s | attempt | CPU busy before | load before (1/5/15 min) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    solo_fps = {c: s.get("solo_fps") for c, s in summary["contenders"].items()}
    tables = [("", summary["runs"]), ("solo ", summary.get("solo_runs", [])),
              ("discarded ", summary.get("discarded_runs", []))]  # fmt: skip
    for prefix, records in tables:
        for r in records:
            steps = "" if r["steps_at_threshold"] is None else f"{r['steps_at_threshold'] / 1e6:.2f}M"
            tw = "" if r["trainer_wall_s_at_threshold"] is None else f"{r['trainer_wall_s_at_threshold']:.0f} s"
            avg = r.get("avg_fps")
            fps = _fmt_num(avg) + _share_of_solo(avg, solo_fps.get(r["contender"]))
            load = "/".join(f"{x:.2f}" for x in r["load_before"])
            lines.append(
                f"| {prefix}{run_name(r['contender'], r['seed'])} | {_fmt_s(r['time_to_threshold_s'])} | {steps} | "
                f"{tw} | {r['stop_reason']} (after {r['wall_s']:.0f} s) | {_fmt_num(r['best_return'])} | {fps} | "
                f"{r.get('attempt', 1)} | {_quiet_cell(r.get('quiet_before'))} | {load} |"
            )
    m = summary["machine"]
    lines += ["", "Commands (the race's clock starts at launch, so start-up counts for both):", ""]
    lines += [f"    {shlex.join(r['command'])}" for r in summary["runs"]]
    lines += ["", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    return "\n".join(lines) + "\n"


def plot_curves(runs: Sequence[RunResult], threshold: float, path: str) -> str | None:
    """curves.png: mean return against wall seconds since launch, every run, threshold crossings marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"race: no curves.png ({e})", file=sys.stderr)
        return None
    colors = {"sf": "tab:orange", "ours": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in runs:
        pts = [p for p in r.curve if math.isfinite(p.episode_return_mean)]
        label = f"{LABELS[r.contender]} seed {r.seed}" + ("" if r.reached else " (not reached)")
        ax.plot(
            [p.launch_s for p in pts],
            [p.episode_return_mean for p in pts],
            styles[r.seed % len(styles)],
            color=colors[r.contender],
            label=label,
            linewidth=1.4,
        )
        if r.reached:
            ax.plot([r.time_to_threshold_s], [threshold], "o", color=colors[r.contender])
    ax.axhline(threshold, color="gray", linewidth=0.8)
    ax.set_xlabel("wall seconds since launch")
    ax.set_ylabel("mean return (last 100 episodes)")
    ax.set_title(f"Ant-v4: time to mean return {threshold:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def machine_facts(args: argparse.Namespace) -> dict[str, Any]:
    """CPU count, load now, versions on both sides (SF's asked of its own venv)."""
    facts: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_at_write": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    for pkg in ("sample-fast", "torch", "mujoco", "numpy"):
        facts[f"ours_{pkg}"] = _version(pkg)
    facts["ours_git_revision"] = git_revision()
    try:
        out = subprocess.run(
            [
                sf_python(args.sf_venv),
                "-c",
                "import importlib.metadata as m\n"
                "for p in ('sample-factory', 'torch', 'gymnasium', 'mujoco', 'numpy'): print(p, m.version(p))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        for line in out.stdout.splitlines():
            name, version = line.split()
            facts[f"sf_{name}"] = version
    except (RaceError, OSError, subprocess.TimeoutExpired, ValueError) as e:
        facts["sf_versions"] = f"unavailable: {e}"
    return facts


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def write_outputs(
    runs: Sequence[RunResult],
    args: argparse.Namespace,
    out_dir: str,
    solo: dict[str, RunResult] | None = None,
    discarded: Sequence[RunResult] = (),
) -> dict[str, Any]:
    """summary.json, summary.md and curves.png in ``out_dir`` (the per-run CSVs are written as runs finish)."""
    summary = build_summary(runs, args, machine_facts(args), solo, discarded)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = summary_markdown(summary)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    plot_curves(runs, args.threshold, os.path.join(out_dir, "curves.png"))
    return summary


# ----- the race ---------------------------------------------------------------------------------------------------
def plan(seeds: Sequence[int], only: str | None) -> list[tuple[str, int]]:
    """(contender, seed) in launch order: SF then ours for each seed, so drift over the race hits both alike."""
    contenders = [only] if only else list(CONTENDERS)
    return [(c, s) for s in seeds for c in contenders]


def previous_runs(out_dir: str, threshold: float, skip: set[tuple[str, int]]) -> list[RunResult]:
    """Runs recorded in ``out_dir``/summary.json at the same threshold that this invocation does not redo."""
    old = _previous_summary(out_dir, threshold)
    if old is None:
        return []
    return [run_from_record(rec, out_dir) for rec in old["runs"] if (rec["contender"], rec["seed"]) not in skip]


def previous_solo(out_dir: str, threshold: float, skip: set[str]) -> dict[str, RunResult]:
    """Solo runs recorded in ``out_dir``/summary.json for contenders this invocation does not measure again."""
    old = _previous_summary(out_dir, threshold)
    if old is None:
        return {}
    return {rec["contender"]: run_from_record(rec, out_dir) for rec in old.get("solo_runs", [])
            if rec["contender"] not in skip}  # fmt: skip


def _previous_summary(out_dir: str, threshold: float) -> dict[str, Any] | None:
    path = os.path.join(out_dir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        old = json.load(f)
    if old.get("threshold") != threshold:
        print(f"race: ignoring {path}: its threshold {old.get('threshold')} is not {threshold:g}", file=sys.stderr)
        return None
    return old


#: Command-line fragments of trainer processes that must not be running when a run starts (leftovers of a
#: contender, or a trainer someone else started).
TRAINER_PATTERNS = ("sample_fast.train", "sf_examples.", "sample_factory")


def leftover_trainers() -> list[tuple[int, str]]:
    """Live processes (not this one) whose command line looks like a trainer of either contender."""
    from sample_fast.benchmark.quiet import cmdline  # noqa: PLC0415 (Linux-only helpers)

    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            cmd = cmdline(int(entry), limit=400)
            if any(p in cmd for p in TRAINER_PATTERNS) and "race_ant_v4" not in cmd and "pytest" not in cmd:
                out.append((int(entry), cmd))
    return out


def wait_until_quiet(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Before a run: no leftover trainer, and the CPUs idle (at most ``--quiet-busy``) over one sampling window.

    Waits up to ``--quiet-timeout-s``; then goes on with a warning (the run's record says it was not quiet, and a
    run slowed by the noise is discarded by the solo check anyway). Returns the check as a dict for the record.
    """
    from sample_fast.benchmark.quiet import wait_for_quiet  # noqa: PLC0415

    deadline = time.monotonic() + args.quiet_timeout_s
    while (left := leftover_trainers()) and time.monotonic() < deadline:
        print(f"race: {name}: waiting for leftover trainer processes: {left[:3]}", file=sys.stderr, flush=True)
        time.sleep(5.0)
    check = wait_for_quiet(max_busy=args.quiet_busy, timeout_s=max(1.0, deadline - time.monotonic()))
    record = {**check.as_dict(), "leftover_trainers": [pid for pid, _ in leftover_trainers()]}
    if record["leftover_trainers"]:
        record["quiet"] = False
    status = "quiet" if record["quiet"] else "NOT quiet (going on; see the record)"
    print(f"race: {name}: machine {status} after {check.waited_s:.0f} s: {check.describe()}", flush=True)
    return record


def too_slow(r: RunResult, solo: RunResult | None, max_slowdown: float) -> bool:
    """Whether a race run averaged more than ``max_slowdown`` below its contender's solo figure (then it was
    disturbed, or the machine changed, and it is rerun). False without a solo figure or an average."""
    if solo is None or not math.isfinite(solo.avg_fps) or not math.isfinite(r.avg_fps):
        return False
    return r.avg_fps < (1.0 - max_slowdown) * solo.avg_fps


def run_race(args: argparse.Namespace) -> dict[str, Any]:
    """Solo runs first (one per contender in the plan), then the plan; each run after a quiet check, each race run
    checked against its solo figure and rerun (at most ``--max-attempts`` tries) when it fell too far below it."""
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    todo = plan(args.seeds, args.only)
    contenders = list(dict.fromkeys(c for c, _ in todo))
    if "sf" in contenders:
        sf_python(args.sf_venv)  # fail before anything runs when SF's venv is missing
    summary: dict[str, Any] = {}
    runs = [] if args.fresh else previous_runs(out_dir, args.threshold, set(todo))
    solo: dict[str, RunResult] = {} if args.fresh else previous_solo(out_dir, args.threshold, set(contenders))
    discarded: list[RunResult] = []
    if runs:
        print(
            f"race: keeping {len(runs)} run(s) from {out_dir}/summary.json: "
            f"{', '.join(run_name(r.contender, r.seed) for r in runs)} (--fresh drops them)"
        )
    try:
        if args.solo_s > 0:
            for c in contenders:
                name = f"solo_{c}"
                quiet = wait_until_quiet(name, args)
                r = run_and_keep(c, args.seeds[0], args, out_dir, name=name, threshold=math.inf, timeout_s=args.solo_s)
                r.quiet_before = quiet
                solo[c] = r
                print(f"race: {name}: {r.avg_fps:.0f} env steps/s over {r.wall_s:.0f} s (seed {r.seed})", flush=True)
        for contender, seed in todo:
            for attempt in range(1, args.max_attempts + 1):
                name = run_name(contender, seed)
                quiet = wait_until_quiet(name, args)
                r = run_and_keep(contender, seed, args, out_dir)
                r.attempt, r.quiet_before = attempt, quiet
                slow = too_slow(r, solo.get(contender), args.max_slowdown)
                solo_fps = _json_num(solo[contender].avg_fps) if contender in solo else None
                print(
                    f"race: {name}: {_fmt_s(_json_num(r.time_to_threshold_s))} (stopped by {r.stop_reason} after "
                    f"{r.wall_s:.0f} s, best {r.best_return:.0f}, avg {r.avg_fps:.0f} env steps/s"
                    f"{_share_of_solo(_json_num(r.avg_fps), solo_fps)})"
                    + (" -- too far below solo: discarded" if slow else ""),
                    flush=True,
                )
                if slow and attempt < args.max_attempts:
                    _keep_discarded(out_dir, r)
                    discarded.append(r)
                    continue
                runs.append(r)  # the last attempt is kept even when slow; its record shows the share of solo
                break
    finally:
        # also after Ctrl-C or an error: the finished runs are recorded
        if runs or solo:
            summary = write_outputs(runs, args, out_dir, solo, discarded)
    return summary


def _keep_discarded(out_dir: str, r: RunResult) -> None:
    """Rename a discarded run's curve CSV and folder so that its rerun does not overwrite them."""
    name = run_name(r.contender, r.seed)
    for old, new in ((f"{name}.csv", f"{name}_attempt{r.attempt}.csv"), (name, f"{name}_attempt{r.attempt}")):
        src, dst = os.path.join(out_dir, old), os.path.join(out_dir, new)
        if os.path.exists(src):
            shutil.rmtree(dst, ignore_errors=True)
            os.replace(src, dst)


def run_and_keep(
    contender: str,
    seed: int,
    args: argparse.Namespace,
    out_dir: str,
    *,
    name: str | None = None,
    threshold: float | None = None,
    timeout_s: float | None = None,
) -> RunResult:
    """One run in a temporary directory; its curve CSV, log and config files are copied into ``out_dir``.

    ``name`` (default ``<contender>_seed<seed>``) names the kept files; ``threshold``/``timeout_s`` default to
    the race's (a solo run passes an unreachable threshold and the solo duration)."""
    name = name or run_name(contender, seed)
    keep_dir = os.path.join(out_dir, name)
    os.makedirs(keep_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"race_{name}_")
    log_path = os.path.join(keep_dir, "stdout.log")
    try:
        if contender == "ours":
            run_dir = os.path.join(work, "run")
            c = ours_contender(seed, args, run_dir, log_path)
            keep = [os.path.join(run_dir, n) for n in ("progress.csv", "config.yaml", "meta.json")]
        else:
            c = sf_contender(seed, args, work, log_path)
            keep = [os.path.join(work, f"race_ant_v4_seed{seed}", "config.json")]
        c.label = name
        print(f"race: {name}: {shlex.join(c.command)}", flush=True)
        r = race_one(
            c,
            seed,
            args.threshold if threshold is None else threshold,
            args.timeout_s if timeout_s is None else timeout_s,
            args.poll_s,
            args.stop_grace_s,
            args.report_every_s,
        )
        for path in keep:
            if os.path.exists(path):
                shutil.copy(path, keep_dir)
        write_curve(os.path.join(out_dir, name + ".csv"), r.curve)
        return r
    finally:
        shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, each run by both (default 0 1 2)")
    p.add_argument("--threshold", type=float, default=3000.0, help="mean return over the last 100 episodes")
    p.add_argument("--timeout-s", type=float, default=900.0, help="a run not there by then counts as not reached")
    p.add_argument(
        "--out",
        default=os.path.join(repo_root(), "benchmarks", "results", "race_ant_v4"),
        help="output directory (default: benchmarks/results/race_ant_v4 in the repository)",
    )
    p.add_argument("--only", choices=CONTENDERS, help="run one contender (the other's runs in --out are kept)")
    p.add_argument("--ours-overrides", default="", help='extra sample_fast.train overrides: "k=v k=v"')
    p.add_argument(
        "--sf-env-steps",
        type=float,
        default=1e7,
        help="SF's --train_for_env_steps (default 1e7, SF's mujoco default); also its linear lr decay's horizon",
    )
    p.add_argument(
        "--ours-env-steps", type=float, default=None, help="ours' run.total_env_steps (default: the preset's, 5e6)"
    )
    p.add_argument("--sf-venv", default=".venv-sf", help="Sample Factory's virtualenv (relative to the repo root)")
    p.add_argument("--sf-workers", type=int, default=2)
    p.add_argument("--sf-envs-per-worker", type=int, default=8)
    p.add_argument("--poll-s", type=float, default=0.25, help="how often the reports are read")
    p.add_argument(
        "--solo-s", type=float, default=120.0, help="seconds of each contender's solo run (0: no solo check)"
    )
    p.add_argument(
        "--max-slowdown",
        type=float,
        default=0.10,
        help="a race run averaging more than this fraction below its solo env steps/s is discarded and rerun",
    )
    p.add_argument("--max-attempts", type=int, default=3, help="tries per contender x seed (the last one is kept)")
    p.add_argument("--quiet-busy", type=float, default=0.10, help="CPU busy share at most this before a run")
    p.add_argument("--quiet-timeout-s", type=float, default=300.0, help="wait at most this long for a quiet machine")
    p.add_argument("--stop-grace-s", type=float, default=60.0, help="wait for ours to exit after SIGINT")
    p.add_argument("--report-every-s", type=float, default=30.0, help="print a progress line this often")
    p.add_argument("--fresh", action="store_true", help="ignore the runs already recorded in --out")
    args = p.parse_args(argv)
    if args.timeout_s <= 0 or args.poll_s <= 0:
        p.error("--timeout-s and --poll-s must be > 0")
    if args.solo_s < 0 or not 0 <= args.max_slowdown < 1 or args.max_attempts < 1 or args.quiet_timeout_s <= 0:
        p.error("need --solo-s >= 0, 0 <= --max-slowdown < 1, --max-attempts >= 1 and --quiet-timeout-s > 0")
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds has duplicates: {args.seeds}")
    # Hydra rejects a key given twice; these are the race's own (run.dir is a temporary directory per run).
    owned = {
        "env": "the race always trains the Ant-v4 preset",
        "run.seed": "use --seeds",
        "run.dir": "each run has a temporary one; its files are copied into --out",
        "run.time_limit_s": "use --timeout-s",
        "run.total_env_steps": "use --ours-env-steps",
        "logging.progress": "the race needs plain",
    }
    for item in shlex.split(args.ours_overrides):
        key = item.split("=", 1)[0].lstrip("+~")
        if key in owned:
            p.error(f"--ours-overrides sets {key}, which the race sets itself ({owned[key]})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # run the finally blocks: stop the trainer, write what was measured

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run_race(args)
    except RaceError as e:
        print(f"race: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("race: interrupted; the finished runs are in summary.json", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    with open(os.path.join(os.path.abspath(args.out), "summary.md")) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
