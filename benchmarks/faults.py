"""The fault-injection suite: each fault against a real short ``env=ant`` training run (async mode), and a memory soak.

Every case starts ``python -m sample_fast.train env=ant`` (few envs, one simulator thread, short checkpoint interval)
in its own session, applies one fault, and checks what a user would: the exit status, the messages (no traceback),
how long the fault took to be noticed, orphan processes, leaked /dev/shm entries, whether the checkpoints on disk
are intact, and the env-step counter a resume continues from. Cases (issue 16, item 6):

    signal_main / signal_group   SIGTERM or SIGINT to the main process or to its whole process group
    double_ctrl_c                SIGINT to the group twice, 0.5 / 1 / 2 s apart
    kill_sampler                 kill -9 of the sampler process: it is replaced and training goes on
    sigstop_sampler              SIGSTOP of the sampler: no heartbeat, it is replaced
    kill_main                    kill -9 of the main process: the sampler is gone within 5 s
    truncated_checkpoint         the newest checkpoint truncated: resume takes the previous intact state
    garbage_best                 best.pt overwritten with garbage: renamed aside, resume goes on
    read_only_checkpoints        the checkpoint folder bind-mounted read-only: one line per failed save, exit 1
    disk_full                    the run dir on a small tmpfs filled to the last byte: one line per save, exit 1
    nonfinite_loss               debug.inject=nonfinite_loss@update:5: one rollback, the run finishes
    sampler_crash                debug.inject=sampler_crash@slot:5: the sampler is replaced, the run finishes
    different_env                resuming an Ant run dir with env=hopper: exit 2, nothing written

The soak (``--soak-minutes``) trains for that long and samples every process's RSS, open file descriptors and the
/dev/shm entries every 15 s; it reports the RSS growth per minute after the warm-up (a least-squares slope) and the
checkpoint stall per save (``checkpoint_s``).

    nice -n 10 python benchmarks/faults.py [--repeats 5] [--cases kill_sampler,...] [--out benchmarks/results/faults]
    nice -n 10 python benchmarks/faults.py --soak-minutes 30 --cases none

Needs root for the read-only bind mount and the tmpfs (the cases say so and are skipped otherwise). Not a speed
measurement: the figures are times to detect and to stop, which a busy machine stretches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sample_fast.benchmark import harness
from sample_fast.benchmark.measure import descendants
from sample_fast.checkpoint import CheckpointManager, read_checkpoint_file
from sample_fast.logger import read_csv
from sample_fast.procs import mapped_shm, pid_alive, rss_bytes, shm_entries, unmapped_in_every_look

#: A short Ant run: 16 envs (2 splits of 8), one simulator thread, one learner thread, a checkpoint every 3 s.
BASE = (
    "env=ant",
    "env.num_envs=16",
    "env.num_threads=1",
    "runner.learner_threads=1",
    "run.total_env_steps=1e9",
    "run.checkpoint_interval_s=3",
    "logging.progress=plain",
    "logging.interval_s=0.5",
    "logging.tensorboard=false",
    "logging.plot=false",
)
STOP_TIMEOUT_S = 30.0  #: issue 16: a stop signal ends the run within 30 s


# ----- one training run -------------------------------------------------------------------------------------------
class Run:
    """``python -m sample_fast.train`` in its own session (its pid is its process-group id), output timestamped."""

    def __init__(self, rdir: Path, *overrides: str, nice: int = 10, base: tuple[str, ...] = BASE) -> None:
        self.rdir = Path(rdir)
        self.lines: list[tuple[float, str]] = []
        cmd = ["nice", "-n", str(nice), sys.executable, "-m", "sample_fast.train", *base, f"run.dir={self.rdir}",
               *overrides]  # fmt: skip
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=self.rdir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, bufsize=1,
        )  # fmt: skip
        self.pid = self.proc.pid  # nice execs python: the same pid
        self.seen_pids: set[int] = set()
        #: /dev/shm names any of the run's processes mapped: the leak check counts only these (other people's runs on
        #: the same machine create and leak their own)
        self.shm_names: set[str] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.shm_names |= mapped_shm([self.pid, *self.children()])
            time.sleep(0.5)

    def leaked(self, wait_s: float = 3.0) -> set[str]:
        """The run's /dev/shm entries (those its processes mapped) that still exist and stay unmapped: the rule of
        the tests' ``procs.leaked_shm``, with ownership by mapping instead of by name prefix."""
        return unmapped_in_every_look(lambda: {n for n in self.shm_names if os.path.exists(f"/dev/shm/{n}")}, wait_s)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first_line(self, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
        rx = re.compile(pattern)
        return next(((t, line) for t, line in list(self.lines) if t >= after and rx.search(line)), None)

    def children(self) -> list[int]:
        kids = descendants(self.pid)
        self.seen_pids.update(kids)
        return kids

    def samplers(self) -> list[int]:
        return [p for p in self.children() if "spawn_main" in _cmdline(p)]

    def rows(self) -> list[dict[str, float]]:
        return read_csv(str(self.rdir / "progress.csv"))

    def wait_for(self, what: str, pred: Callable[[], Any], timeout_s: float = 180.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = pred()
            if value:
                return value
            if self.proc.poll() is not None:
                raise CaseError(f"the run exited ({self.proc.returncode}) before {what}:\n{self.text()[-2000:]}")
            if time.monotonic() > deadline:
                raise CaseError(f"no {what} within {timeout_s:g} s:\n{self.text()[-2000:]}")
            time.sleep(0.1)

    def wait_training(self, rows: int = 2, checkpoints: int = 0, timeout_s: float = 240.0) -> None:
        """Until the CSV has ``rows`` rows, ``checkpoints`` regular checkpoints exist and a sampler runs."""
        ck = CheckpointManager(self.rdir)
        self.wait_for(
            f"{rows} progress rows and {checkpoints} checkpoints",
            lambda: len(self.rows()) >= rows and len(ck.checkpoints()) >= checkpoints and self.samplers(),
            timeout_s,
        )

    def wait_exit(self, timeout_s: float = 120.0) -> int | None:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in self.seen_pids:  # a sampler that left the group would survive killpg
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CaseError(RuntimeError):
    """The case could not be carried out as planned (the run died early, a wait timed out)."""


# ----- the result of one repeat -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: str
    fault: str
    expected: str
    observed: str = ""
    passed: bool = False
    exit_status: int | None = None
    detect_s: float | None = None  #: fault -> the run noticed it (the line saying so), or -> exit for a stop
    orphans: int = 0
    leaked: int = 0
    checkpoints_intact: bool | None = None
    resumed_step: int | None = None  #: the env step the next start resumed from
    last_step: int | None = None  #: the last env step this start logged (or checkpointed)
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)


def _intact(rdir: Path) -> tuple[bool, int]:
    """(every checkpoint file reads back with a valid checksum, the newest env step among them)."""
    ck = CheckpointManager(rdir)
    files = [*ck.checkpoints(), *([ck.best_path] if ck.best_path.exists() else [])]
    newest = -1
    for path in files:
        try:
            newest = max(newest, int(read_checkpoint_file(path)["state"]["env_steps"]))
        except Exception:
            return False, newest
    return bool(files), newest


def _finish(out: Outcome, run: Run, extra_pids: set[int] = frozenset()) -> None:
    """Orphans (every process the run ever had, still alive 5 s after it exited), leaked /dev/shm entries."""
    pids = set(run.seen_pids) | set(extra_pids)
    deadline = time.monotonic() + 5.0
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if pid_alive(p)]
    out.orphans = len(alive)
    if alive:
        out.problems.append(f"orphans {alive}")
    leaked = run.leaked()
    out.leaked = len(leaked)
    if leaked:
        out.problems.append(f"leaked {sorted(leaked)}")
    if "Traceback" in run.text():
        out.problems.append("a traceback in the output")


def _resume_check(out: Outcome, rdir: Path, expect_step: int, extra: tuple[str, ...] = ()) -> None:
    """Start again for a few more env steps: it must resume from ``expect_step`` and finish (exit 0)."""
    run = Run(rdir, f"run.total_env_steps={expect_step + 2048}", *extra)
    try:
        rc = run.wait_exit(180)
        m = re.search(r"resuming .* \(env step (\d+)\)", run.text())
        out.resumed_step = int(m[1]) if m else None
        if rc != 0:
            out.problems.append(f"the resumed run exited {rc}: {run.text()[-800:]}")
        if out.resumed_step != expect_step:
            out.problems.append(f"resumed from {out.resumed_step}, expected {expect_step}")
        steps = [int(r["env_steps"]) for r in run.rows()]
        if steps != sorted(steps):
            out.problems.append("progress.csv env_steps not increasing after the resume")
    finally:
        run.kill()


# ----- the cases --------------------------------------------------------------------------------------------------
def case_signal(work: Path, target: str, sig: signal.Signals) -> Outcome:
    """One stop signal to the main process or to the group, during training."""
    status = 128 + int(sig)
    out = Outcome(f"{sig.name.lower()}_{target}", f"{sig.name} to the {target}",
                  f"exit {status}, final checkpoint at the last step, no traceback, stops within 30 s")  # fmt: skip
    run = Run(work / "run")
    try:
        run.wait_training(rows=3)
        t = time.monotonic()
        (os.killpg if target == "group" else os.kill)(run.pid, sig)
        rc = run.wait_exit(60)
        out.exit_status, out.detect_s = rc, time.monotonic() - t
    finally:
        run.kill()
    _finish(out, run)
    ok, newest = _intact(run.rdir)
    out.checkpoints_intact = ok
    rows = run.rows()
    out.last_step = int(rows[-1]["env_steps"]) if rows else None
    if rc != status:
        out.problems.append(f"exit {rc}")
    if out.detect_s > STOP_TIMEOUT_S:
        out.problems.append(f"took {out.detect_s:.1f} s to stop")
    if newest != out.last_step:
        out.problems.append(f"newest checkpoint at {newest}, last logged step {out.last_step}")
    if f"stopped by {sig.name} at env step" not in run.text():
        out.problems.append("no 'stopped by' line")
    _resume_check(out, run.rdir, newest)
    out.observed = f"exit {rc} after {out.detect_s:.1f} s; final checkpoint at {newest}"
    return out


def case_double_ctrl_c(work: Path, gap_s: float) -> Outcome:
    out = Outcome(f"double_ctrl_c_{gap_s:g}s", f"SIGINT to the group twice, {gap_s:g} s apart",
                  "exit 130, one truthful line about the final checkpoint, no traceback")  # fmt: skip
    run = Run(work / "run")
    try:
        run.wait_training(rows=3)
        t = time.monotonic()
        os.killpg(run.pid, signal.SIGINT)
        time.sleep(gap_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGINT)
        rc = run.wait_exit(60)
        out.exit_status, out.detect_s = rc, time.monotonic() - t
    finally:
        run.kill()
    _finish(out, run)
    ok, newest = _intact(run.rdir)
    out.checkpoints_intact = ok
    if rc != 130:
        out.problems.append(f"exit {rc}")
    lines = [line for _, line in run.lines if line.startswith(("interrupted", "stopped by SIGINT"))]
    if len(lines) != 1:
        out.problems.append(f"{len(lines)} final lines")
    else:
        m = re.search(r"after the final checkpoint was written \((\S+), env step (\d+)\)", lines[0])
        n = re.search(r"without the final checkpoint; the newest checkpoint on disk is (\S+),", lines[0])
        if m:
            if int(read_checkpoint_file(m[1])["state"]["env_steps"]) != int(m[2]):
                out.problems.append("the named final checkpoint holds another step")
            what = f"final checkpoint written (step {m[2]})"
        elif n:
            newest_file = CheckpointManager(run.rdir).checkpoints()[-1]
            if Path(n[1]) != newest_file:
                out.problems.append(f"names {n[1]}, newest is {newest_file}")
            what = "stopped without the final checkpoint"
        elif lines[0].startswith("stopped by SIGINT"):  # the graceful stop: the second SIGINT did not force
            what = (
                "the second SIGINT came after the final checkpoint (already stopping)"
                if "already stopping" in run.text()
                else "the second SIGINT counted as the same stop (within 0.5 s of the first) or came after the end"
            )
        else:
            what = lines[0][:80]
            out.problems.append(f"unexpected line {lines[0]!r}")
        out.observed = f"exit {rc} after {out.detect_s:.1f} s: {what}"
    if newest >= 0:
        _resume_check(out, run.rdir, newest)
    return out


def _restarted(run: Run, after: float) -> tuple[float, str] | None:
    return run.first_line(r"sampler process .* (died|raised|sent no heartbeat|did not build).*restarting", after)


def case_sampler_fault(work: Path, how: str) -> Outcome:
    """kill -9 or SIGSTOP of the sampler: it is replaced, training continues, the counters go on."""
    sig = signal.SIGKILL if how == "kill" else signal.SIGSTOP
    name = "kill_sampler" if how == "kill" else "sigstop_sampler"
    out = Outcome(name, f"{'kill -9' if how == 'kill' else 'SIGSTOP'} of the sampler process",
                  "a new sampler within 1 s (SIGSTOP: runner.heartbeat_timeout_s=5), training goes on, "
                  "sampler_restarts 1 in progress.csv, SIGTERM then exits 143")  # fmt: skip
    overrides = ("runner.heartbeat_timeout_s=5",) if how == "stop" else ()
    run = Run(work / "run", *overrides)
    old: list[int] = []
    try:
        run.wait_training(rows=3)
        old = run.samplers()
        steps_before = int(run.rows()[-1]["env_steps"])
        t = time.monotonic()
        os.kill(old[0], sig)
        line = run.wait_for("the restart line", lambda: _restarted(run, t), 60)
        out.detect_s = line[0] - t
        run.wait_for("a new sampler", lambda: [p for p in run.samplers() if p not in old], 120)
        run.wait_for(
            "training after the restart",
            lambda: run.rows()[-1].get("sampler_restarts", 0) >= 1 and run.rows()[-1]["env_steps"] > steps_before,
            180,
        )
        os.killpg(run.pid, signal.SIGTERM)
        out.exit_status = run.wait_exit(60)
    finally:
        run.kill()
        for pid in old:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _finish(out, run)
    ok, newest = _intact(run.rdir)
    out.checkpoints_intact = ok
    rows = run.rows()
    out.last_step = int(rows[-1]["env_steps"])
    steps = [r["env_steps"] for r in rows]
    if steps != sorted(steps):
        out.problems.append("env_steps went backwards")
    if out.exit_status != 143:
        out.problems.append(f"exit {out.exit_status}")
    if rows[-1].get("sampler_restarts") != 1:
        out.problems.append(f"sampler_restarts {rows[-1].get('sampler_restarts')}")
    if newest != out.last_step:
        out.problems.append(f"newest checkpoint {newest} != last step {out.last_step}")
    _resume_check(out, run.rdir, newest)
    out.observed = f"restart after {out.detect_s:.1f} s: {line[1].strip()[:120]}"
    return out


def case_kill_main(work: Path) -> Outcome:
    out = Outcome("kill_main", "kill -9 of the main process",
                  "the sampler gone within 5 s, no leaked segment, the next start resumes")  # fmt: skip
    run = Run(work / "run")
    try:
        run.wait_training(rows=3, checkpoints=1)
        samplers = run.samplers()
        kids = run.children()
        stacks_before = set(Path(tempfile.gettempdir()).glob("sample_fast_stacks_*"))
        t = time.monotonic()
        os.kill(run.pid, signal.SIGKILL)
        out.exit_status = run.wait_exit(30)
        deadline = t + 30
        while any(pid_alive(p) for p in samplers) and time.monotonic() < deadline:
            time.sleep(0.01)
        out.detect_s = time.monotonic() - t
    finally:
        run.kill()
    _finish(out, run, set(kids))
    ok, newest = _intact(run.rdir)
    out.checkpoints_intact = ok
    if out.detect_s > 5.0:
        out.problems.append(f"the sampler outlived main by {out.detect_s:.1f} s")
    stray = set(Path(tempfile.gettempdir()).glob("sample_fast_stacks_*")) - stacks_before
    if stray:
        out.problems.append(f"stack-dump files left: {stray}")
    _resume_check(out, run.rdir, newest)
    out.observed = f"sampler gone {out.detect_s:.2f} s after the kill; resumed from {out.resumed_step}"
    return out


_PREPARED: dict[str, Path] = {}


def _prepared_run(work_root: Path) -> Path:
    """One Ant run dir with >= 2 regular checkpoints and best.pt (made once, copied by each case)."""
    if "ant" in _PREPARED:
        return _PREPARED["ant"]
    rdir = work_root / "prepared" / "run"
    rdir.parent.mkdir(parents=True, exist_ok=True)
    run = Run(rdir, "run.checkpoint_interval_s=1")
    try:
        run.wait_training(rows=2, checkpoints=3, timeout_s=300)
        # best.pt needs a finished episode (Ant: up to 1000 steps per env)
        run.wait_for("best.pt", CheckpointManager(rdir).best_path.exists, 300)
        os.killpg(run.pid, signal.SIGTERM)
        if run.wait_exit(60) != 143:
            raise CaseError(f"preparing the run dir failed:\n{run.text()[-2000:]}")
    finally:
        run.kill()
    _PREPARED["ant"] = rdir
    return rdir


def _copy_prepared(work: Path, work_root: Path) -> Path:
    rdir = work / "run"
    shutil.copytree(_prepared_run(work_root), rdir)
    return rdir


def case_corrupt(work: Path, work_root: Path, what: str) -> Outcome:
    """A truncated newest checkpoint or a garbage best.pt: resume takes the newest intact state, renames it aside."""
    rdir = _copy_prepared(work, work_root)
    ck = CheckpointManager(rdir)
    files = ck.checkpoints()
    states = {p: int(read_checkpoint_file(p)["state"]["env_steps"]) for p in files}
    best_step = int(read_checkpoint_file(ck.best_path)["state"]["env_steps"])
    if what == "truncated_checkpoint":
        victim = files[-1]
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        # best.pt of the same step is intact and as new: resume must take it (else the previous regular one)
        expect = max([best_step, *[s for p, s in states.items() if p != victim]])
        out = Outcome(what, "the newest checkpoint truncated to half its size", "a warning naming it, renamed "
                      "*.corrupt, resume from the newest intact state (best.pt included)")  # fmt: skip
    else:
        victim = ck.best_path
        victim.write_bytes(os.urandom(4096))
        expect = max(states.values())
        out = Outcome(what, "best.pt overwritten with 4 KB of random bytes",
                      "a warning, renamed best.pt.corrupt, resume from the newest regular checkpoint")  # fmt: skip
    run = Run(rdir, f"run.total_env_steps={expect + 2048}")
    t = time.monotonic()
    try:
        out.exit_status = run.wait_exit(180)
    finally:
        run.kill()
    _finish(out, run)
    warn = run.first_line(re.escape(victim.name) + r".*renamed it to")
    out.detect_s = (warn[0] - t) if warn else None
    m = re.search(r"resuming .* from (\S+) \(env step (\d+)\)", run.text())
    out.resumed_step = int(m[2]) if m else None
    out.checkpoints_intact = _intact(rdir)[0]
    if out.exit_status != 0:
        out.problems.append(f"exit {out.exit_status}: {run.text()[-600:]}")
    if not warn:
        out.problems.append("no warning naming the corrupt file")
    if not (victim.parent / (victim.name + ".corrupt")).exists():
        out.problems.append("not renamed *.corrupt")
    if out.resumed_step != expect:
        out.problems.append(f"resumed from {out.resumed_step}, expected {expect}")
    out.observed = f"exit {out.exit_status}; resumed from {m[1] if m else '?'} at step {out.resumed_step}"
    return out


@contextlib.contextmanager
def _mounted(*cmds: list[str], undo: list[list[str]]):
    try:
        for cmd in cmds:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise CaseError(f"{' '.join(cmd)} failed: {proc.stderr.strip()} (needs root or CAP_SYS_ADMIN)")
        yield
    finally:
        for cmd in undo:
            subprocess.run(cmd, capture_output=True, timeout=30)


def case_storage(work: Path, what: str) -> Outcome:
    """The checkpoint folder read-only (a read-only bind mount: root ignores chmod), or the disk full (the run dir on
    a 4 MB tmpfs, filled after the first checkpoint): one warning per failed save, the good checkpoints kept, exit 1
    after run.max_save_failures=3."""
    code = "EROFS" if what == "read_only_checkpoints" else "ENOSPC"
    out = Outcome(what, "checkpoint folder made read-only" if code == "EROFS" else "a full disk (4 MB tmpfs)",
                  f"one {code} line per failed save, earlier checkpoints intact, exit 1 after 3 failures, "
                  "no traceback")  # fmt: skip
    fs = work / "fs"
    fs.mkdir(parents=True)
    tmpfs = what == "disk_full"
    mounts = [["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)]] if tmpfs else []
    undo = [["umount", "-l", str(fs)]] if tmpfs else []
    with _mounted(*mounts, undo=undo):
        rdir = fs / "run"
        run = Run(rdir, "run.max_save_failures=3", "run.checkpoint_interval_s=2",
                  *(("logging.tensorboard=true",) if tmpfs else ()))  # fmt: skip
        ck_dir = rdir / "checkpoints"
        try:
            run.wait_training(rows=2, checkpoints=1)
            good = {
                p.name: read_checkpoint_file(p)["state"]["env_steps"] for p in CheckpointManager(rdir).checkpoints()
            }
            t = time.monotonic()
            if tmpfs:
                with contextlib.suppress(OSError), open(fs / "filler", "wb", buffering=0) as f:
                    while True:  # unbuffered: the write that fails leaves nothing for close() to fail on again
                        f.write(b"\0" * 65536)
            else:
                for cmd in (["mount", "--bind", str(ck_dir), str(ck_dir)],
                            ["mount", "-o", "remount,bind,ro", str(ck_dir)]):  # fmt: skip
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                    if proc.returncode != 0:
                        raise CaseError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
            out.exit_status = run.wait_exit(120)
            warn = run.first_line(r"checkpoint: could not write", t)
            out.detect_s = warn[0] - t if warn else None
        finally:
            run.kill()
            if not tmpfs:
                subprocess.run(["umount", "-l", str(ck_dir)], capture_output=True, timeout=30)
        _finish(out, run)
        failed = [line for _, line in run.lines if "checkpoint: could not write" in line]
        kept = {p.name: read_checkpoint_file(p)["state"]["env_steps"] for p in CheckpointManager(rdir).checkpoints()}
        out.checkpoints_intact = all(kept.get(n) == s for n, s in good.items()) and _intact(rdir)[0]
        out.last_step = max(kept.values()) if kept else None
        if out.exit_status != 1:
            out.problems.append(f"exit {out.exit_status}")
        if len(failed) != 3 or not all(code in line for line in failed):
            out.problems.append(f"{len(failed)} save warnings: {failed[:3]}")
        if not re.search(r"^error: 3 checkpoint saves in a row failed", run.text(), re.M):
            out.problems.append("no final error line")
        tmp_left = list(ck_dir.glob(".*.tmp-*"))
        if tmp_left:
            out.problems.append(f"temporary files left: {tmp_left}")
        logs = [line for _, line in run.lines if "logging: could not write" in line]
        out.observed = f"exit {out.exit_status}; {len(failed)} save warnings ({code}), {len(logs)} log-sink warnings"
        if tmpfs:
            (fs / "filler").unlink(missing_ok=True)
        _resume_check(out, rdir, out.last_step)
    return out


def case_inject(work: Path, fault: str) -> Outcome:
    """debug.inject: a non-finite loss (one rollback) or a sampler crash (one restart); the run finishes."""
    spec = {"nonfinite_loss": "nonfinite_loss@update:5", "sampler_crash": "sampler_crash@slot:5"}[fault]
    column = {"nonfinite_loss": "rollbacks", "sampler_crash": "sampler_restarts"}[fault]
    out = Outcome(fault, f"debug.inject={spec}", f"{column} 1 in progress.csv, the run finishes (exit 0), "
                  "finite weights in the final checkpoint")  # fmt: skip
    run = Run(work / "run", "run.total_env_steps=16384", f"debug.inject={spec}")
    t = time.monotonic()
    try:
        out.exit_status = run.wait_exit(240)
    finally:
        run.kill()
    _finish(out, run)
    pattern = "rolled back to the last good state" if fault == "nonfinite_loss" else r"restarting"
    seen = run.first_line(pattern)
    out.detect_s = seen[0] - t if seen else None
    ok, newest = _intact(run.rdir)
    out.checkpoints_intact = ok
    rows = run.rows()
    value = rows[-1].get(column) if rows else None
    out.last_step = int(rows[-1]["env_steps"]) if rows else None
    if out.exit_status != 0:
        out.problems.append(f"exit {out.exit_status}: {run.text()[-600:]}")
    if value != 1:
        out.problems.append(f"{column} = {value}")
    if not seen:
        out.problems.append(f"no line matching {pattern!r}")
    import torch

    state, _ = CheckpointManager(run.rdir).load_resume()
    if not all(torch.isfinite(v).all() for v in state["policy"].values() if v.is_floating_point()):
        out.problems.append("non-finite weights in the final checkpoint")
    out.resumed_step = None
    out.observed = f"exit {out.exit_status}; {column} {value}; final step {out.last_step}"
    return out


def case_different_env(work: Path, work_root: Path) -> Outcome:
    rdir = _copy_prepared(work, work_root)
    out = Outcome("different_env", "resume an Ant run dir with env=hopper",
                  "exit 2, one line naming env.name and the fix, nothing in the run dir changed")  # fmt: skip
    snapshot = {p: p.stat().st_mtime_ns for p in rdir.rglob("*")}
    run = Run(rdir, base=tuple(x if x != "env=ant" else "env=hopper" for x in BASE))
    t = time.monotonic()
    try:
        out.exit_status = run.wait_exit(120)
        out.detect_s = time.monotonic() - t
    finally:
        run.kill()
    _finish(out, run)
    out.checkpoints_intact = _intact(rdir)[0]
    lines = [line for _, line in run.lines if line.strip()]
    if out.exit_status != 2:
        out.problems.append(f"exit {out.exit_status}")
    if len(lines) != 1 or "env.name=ant" not in lines[0]:
        out.problems.append(f"output: {lines[:3]}")
    if {p: p.stat().st_mtime_ns for p in rdir.rglob("*")} != snapshot:
        out.problems.append("the run dir changed")
    out.observed = f"exit {out.exit_status}: {lines[0][:110] if lines else ''}"
    return out


def all_cases(work_root: Path) -> dict[str, Callable[[Path], Outcome]]:
    cases: dict[str, Callable[[Path], Outcome]] = {}
    for target in ("main", "group"):
        for sig in (signal.SIGTERM, signal.SIGINT):
            cases[f"{sig.name.lower()}_{target}"] = lambda w, t=target, s=sig: case_signal(w, t, s)
    for gap in (0.5, 1.0, 2.0):
        cases[f"double_ctrl_c_{gap:g}s"] = lambda w, g=gap: case_double_ctrl_c(w, g)
    cases["kill_sampler"] = lambda w: case_sampler_fault(w, "kill")
    cases["sigstop_sampler"] = lambda w: case_sampler_fault(w, "stop")
    cases["kill_main"] = case_kill_main
    cases["truncated_checkpoint"] = lambda w: case_corrupt(w, work_root, "truncated_checkpoint")
    cases["garbage_best"] = lambda w: case_corrupt(w, work_root, "garbage_best")
    cases["read_only_checkpoints"] = lambda w: case_storage(w, "read_only_checkpoints")
    cases["disk_full"] = lambda w: case_storage(w, "disk_full")
    cases["nonfinite_loss"] = lambda w: case_inject(w, "nonfinite_loss")
    cases["sampler_crash"] = lambda w: case_inject(w, "sampler_crash")
    cases["different_env"] = lambda w: case_different_env(w, work_root)
    return cases


def run_case(name: str, fn: Callable[[Path], Outcome], work_root: Path, repeat: int) -> Outcome:
    work = work_root / f"{name}-{repeat}"
    work.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        out = fn(work)
    except Exception as e:  # the case itself broke: a failed repeat, with the reason
        out = Outcome(name, name, "", observed=f"case error: {type(e).__name__}: {str(e)[:1500]}")
        out.problems.append(out.observed)
    out.case = name
    out.wall_s = time.monotonic() - t0
    out.passed = not out.problems
    shutil.rmtree(work, ignore_errors=True)
    return out


# ----- the soak ---------------------------------------------------------------------------------------------------
def _role(pid: int, main: int) -> str:
    if pid == main:
        return "main"
    cmd = _cmdline(pid)
    if "resource_tracker" in cmd:
        return "resource_tracker"
    if "spawn_main" in cmd:
        return "sampler"
    return cmd[:40] or str(pid)


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) in value per minute."""
    n = len(points)
    if n < 2:
        return math.nan
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den if den else math.nan


def soak(work_root: Path, minutes: float, every_s: float, warmup_min: float, overrides: list[str]) -> dict:
    rdir = work_root / "soak" / "run"
    rdir.parent.mkdir(parents=True)
    extra = ["env.num_envs=64", "run.checkpoint_interval_s=60", "logging.interval_s=5", "logging.tensorboard=true",
             *overrides]  # fmt: skip
    run = Run(rdir, *extra)
    effective = {o.split("=", 1)[0]: o for o in [*BASE, *extra]}  # the later override of a key wins (Hydra)
    settings = list(effective.values())
    samples: list[dict] = []
    try:
        run.wait_training(rows=1, timeout_s=300)
        t0 = time.monotonic()
        next_t = t0
        while time.monotonic() - t0 < minutes * 60:
            if run.proc.poll() is not None:
                raise CaseError(f"the soak run exited ({run.proc.returncode}):\n{run.text()[-2000:]}")
            pids = [run.pid, *run.children()]
            procs = {}
            for pid in pids:
                procs[_role(pid, run.pid)] = {"pid": pid, "rss_mb": rss_bytes(pid) / 2**20, "fds": _fds(pid)}
            rows = run.rows()
            samples.append({
                "t_s": round(time.monotonic() - t0, 1), "procs": procs, "dev_shm": len(shm_entries()),
                "run_shm": len(mapped_shm(pids)),
                "env_steps": int(rows[-1]["env_steps"]) if rows else 0,
            })  # fmt: skip
            next_t += every_s
            time.sleep(max(0.0, next_t - time.monotonic()))
        t = time.monotonic()
        os.killpg(run.pid, signal.SIGTERM)
        rc = run.wait_exit(60)
        stop_s = time.monotonic() - t
    finally:
        run.kill()
    out = Outcome("soak", f"{minutes:g} min of training", "RSS growth < 1 MB/min per process after warm-up")
    _finish(out, run)
    rows = run.rows()
    stalls = sorted({r["checkpoint_s"] for r in rows if r.get("checkpoint_s", 0) > 0})
    roles = sorted({r for s in samples for r in s["procs"]})
    growth, fd_change = {}, {}
    warm = [s for s in samples if s["t_s"] >= warmup_min * 60]
    for role in roles:
        pts = [(s["t_s"], s["procs"][role]["rss_mb"]) for s in warm if role in s["procs"]]
        growth[role] = _slope_per_min(pts)
        fds = [s["procs"][role]["fds"] for s in warm if role in s["procs"]]
        fd_change[role] = (fds[-1] - fds[0]) if fds else None
    shm = [s["run_shm"] for s in warm]
    result = {
        "settings": settings,
        "minutes": minutes,
        "sample_every_s": every_s,
        "warmup_min": warmup_min,
        "rss_growth_mb_per_min": growth,
        "rss_mb_first_last": {
            r: [warm[0]["procs"].get(r, {}).get("rss_mb"), warm[-1]["procs"].get(r, {}).get("rss_mb")] for r in roles
        },
        "fd_change_after_warmup": fd_change,
        "run_shm_min_max_after_warmup": [min(shm), max(shm)] if shm else None,
        "env_steps": samples[-1]["env_steps"] if samples else 0,
        "checkpoint_stall_s": {
            "count": len(stalls),
            "values": stalls,
            "median": harness.median(stalls) if stalls else None,
            "max": max(stalls) if stalls else None,
        },  # fmt: skip
        "exit_status": rc,
        "stop_s": stop_s,
        "orphans": out.orphans,
        "leaked": out.leaked,
        "passed": rc == 143 and not out.problems and all(g < 1.0 for g in growth.values() if not math.isnan(g)),
        "problems": out.problems,
        "samples": samples,
    }
    return result


# ----- report -----------------------------------------------------------------------------------------------------
def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(cases: dict[str, list[Outcome]], soak_result: dict | None, machine: dict, argv: list[str]) -> str:
    lines = [
        "# Fault-injection suite (`benchmarks/faults.py`)",
        "",
        f"`{' '.join(['python benchmarks/faults.py', *argv])}` at {machine.get('git_revision')}, "
        f"{machine.get('recorded_utc')}, on {machine.get('cpu_usable')} usable cores ({machine.get('cpu_model')}), "
        f"load {machine.get('load_average')}; every case against a real `env=ant` run: "
        f"`{' '.join(BASE)}` (async mode).",
        "",
    ]
    if cases:
        lines += [
            "| fault | expected | observed (last repeat) | passed | exit status | s to detect (median, max) | "
            "orphans | leaked segments | checkpoints intact | resumed step counter |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for outs in cases.values():
            det = [o.detect_s for o in outs if o.detect_s is not None]
            exits = sorted({str(o.exit_status) for o in outs})
            resumed = [o for o in outs if o.resumed_step is not None]
            res = "-"
            if resumed:
                good = sum(1 for o in resumed if not any("resumed" in p for p in o.problems))
                res = f"{good}/{len(resumed)} continued (last: {resumed[-1].resumed_step})"
            intact = sum(1 for o in outs if o.checkpoints_intact)
            lines.append(
                f"| {outs[0].fault} | {outs[0].expected} | {outs[-1].observed} | "
                f"**{sum(o.passed for o in outs)}/{len(outs)}** | {', '.join(exits)} | "
                f"{_fmt_s(harness.median(det) if det else None)}, {_fmt_s(max(det) if det else None)} | "
                f"{sum(o.orphans for o in outs)} | {sum(o.leaked for o in outs)} | {intact}/{len(outs)} | {res} |"
            )
        failed = [(n, o) for n, outs in cases.items() for o in outs if not o.passed]
        if failed:
            lines += ["", "Failed repeats:", ""]
            lines += [f"* {n}: {'; '.join(o.problems)[:600]}" for n, o in failed]
    if soak_result:
        s = soak_result
        lines += [
            "",
            f"## Memory soak ({s['minutes']:g} minutes)",
            "",
            f"Settings: `{' '.join(s['settings'])}`; every process sampled every {s['sample_every_s']:g} s; "
            f"growth is the least-squares slope after a {s['warmup_min']:g}-minute warm-up. "
            f"{s['env_steps']:,} env steps; stopped with SIGTERM: exit {s['exit_status']} in {s['stop_s']:.1f} s, "
            f"{s['orphans']} orphans, {s['leaked']} leaked segments.",
            "",
            "| process | RSS after warm-up -> end (MB) | RSS growth (MB/min) | open fds change |",
            "| --- | --- | --- | --- |",
        ]
        for role, g in s["rss_growth_mb_per_min"].items():
            a, b = s["rss_mb_first_last"][role]
            a_s = "-" if a is None else f"{a:.1f}"
            b_s = "-" if b is None else f"{b:.1f}"
            lines.append(f"| {role} | {a_s} -> {b_s} | {g:+.3f} | {s['fd_change_after_warmup'][role]} |")
        st = s["checkpoint_stall_s"]
        lines += [
            "",
            f"/dev/shm entries the run's processes map, after warm-up (min, max): "
            f"{s['run_shm_min_max_after_warmup']}. "
            f"Checkpoint stall per save (`checkpoint_s`, {st['count']} distinct values): median "
            f"{_fmt_s(st['median'])} s, max {_fmt_s(st['max'])} s. Goal RSS growth < 1 MB/min: "
            f"{'met' if s['passed'] else 'NOT met / see problems'}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="all", help="comma-separated case names, 'all' or 'none'")
    p.add_argument("--soak-minutes", type=float, default=0.0, help="0: no soak")
    p.add_argument("--soak-every-s", type=float, default=15.0)
    p.add_argument("--soak-warmup-min", type=float, default=5.0)
    p.add_argument("--soak-override", action="append", default=[], help="extra train override for the soak run")
    p.add_argument("--out", default="benchmarks/results/faults")
    p.add_argument("--name", default=None, help="result file stem (default: suite, or soak with --cases none)")
    p.add_argument("--work", default=None, help="scratch directory (default: a new temp dir, removed at the end)")
    p.add_argument(
        "--render",
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: write one table (--out/--name) from these result files (suites run in parallel)",
    )
    args = p.parse_args(argv)
    if args.render:
        return render(args.render, args.out, args.name or "suite", argv)
    work_root = Path(args.work or tempfile.mkdtemp(prefix="sample_fast_faults_"))
    work_root.mkdir(parents=True, exist_ok=True)
    table = all_cases(work_root)
    names = list(table) if args.cases == "all" else [] if args.cases == "none" else args.cases.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(table)}")
    machine = harness.machine_record()
    results: dict[str, list[Outcome]] = {}
    soak_result = None
    name = args.name or ("soak" if not names else "suite")
    try:
        for case in names:
            for i in range(args.repeats):
                out = run_case(case, table[case], work_root, i)
                results.setdefault(case, []).append(out)
                flag = "ok  " if out.passed else "FAIL"
                print(f"{flag} {case} #{i + 1}: {out.observed} ({out.wall_s:.0f} s)"
                      + ("" if out.passed else f" -- {'; '.join(out.problems)[:400]}"), flush=True)  # fmt: skip
                _write(args.out, name, results, soak_result, machine, argv)
        if args.soak_minutes > 0:
            soak_result = soak(work_root, args.soak_minutes, args.soak_every_s, args.soak_warmup_min,
                               args.soak_override)  # fmt: skip
            print(json.dumps({k: v for k, v in soak_result.items() if k != "samples"}, indent=1, default=str))
    finally:
        if results or soak_result:
            paths = _write(args.out, name, results, soak_result, machine, argv)
            print(f"wrote {', '.join(paths.values())}")
        if args.work is None:
            shutil.rmtree(work_root, ignore_errors=True)
    ok = all(o.passed for outs in results.values() for o in outs) and (soak_result is None or soak_result["passed"])
    return 0 if ok else 1


def render(paths: list[str], out_dir: str, name: str, argv: list[str]) -> int:
    """One table from several result files (``--render``); each file's machine record is kept under ``parts``."""
    results: dict[str, list[Outcome]] = {}
    parts, soak_result = [], None
    for spec in paths:  # FILE or FILE:case,case (only those cases of that file)
        path, _, only = spec.partition(":")
        with open(path) as f:
            data = json.load(f)
        parts.append({"file": path, "cases": only or "all", "argv": data["argv"], "machine": data["machine"]})
        for case, outs in data["cases"].items():
            if not only or case in only.split(","):
                results.setdefault(case, []).extend(Outcome(**o) for o in outs)
        soak_result = soak_result or data.get("soak")
    machine = {**parts[0]["machine"], "parts": parts}
    argv = [
        *argv,
        "# parts: "
        + "; ".join(f"{' '.join(p['argv'])} at {p['machine'].get('git_revision')} ({p['cases']})" for p in parts),
    ]
    _write(out_dir, name, results, soak_result, machine, argv)
    return 0 if all(o.passed for outs in results.values() for o in outs) else 1


def _write(out_dir: str, name: str, results: dict, soak_result: dict | None, machine: dict, argv: list[str]) -> dict:
    data = {
        "machine": machine,
        "argv": argv,
        "base_overrides": list(BASE),
        "cases": {n: [asdict(o) for o in outs] for n, outs in results.items()},
        "soak": soak_result,
    }
    return harness.write_results(out_dir, name, data, markdown(results, soak_result, machine, argv))


if __name__ == "__main__":
    sys.exit(main())
