"""Fault tolerance of the trainer on the toy env: stop signals to the main process and to its whole group (exit
status, final checkpoint, no orphan, no leaked /dev/shm entry), a double Ctrl-C's message, checkpoint saves that fail
(injected errors, a real read-only file system and a real full disk on a small tmpfs where mounting is permitted),
the fault switch (``debug.inject``) showing a rollback in a real run, the rollback limit, bad command-line input
(exit status 2 and one line), and resume (best.pt, corrupt files renamed aside, counters and TensorBoard's last
point continued)."""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

import sample_fast.train as train_mod
from sample_fast import cli
from sample_fast.benchmark.measure import descendants
from sample_fast.checkpoint import CheckpointManager, read_checkpoint_file
from sample_fast.config import ConfigError, LogConfig
from sample_fast.logger import ProgressLogger, read_csv
from sample_fast.procs import LEAK_WINDOW_S, leaked_shm, pid_alive, shm_entries

PYTHON = sys.executable
QUIET = ("logging.progress=off", "logging.interval_s=0.05", "logging.tensorboard=false", "logging.plot=false")
SERIAL = ("run.mode=serial", *QUIET)
SHM_PREFIXES = ("torch_", "sem.mp-", "mp-", "psm_")


def _cfg(*overrides: str):
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        return compose("train", overrides=["env=toy", *overrides])


def _alive_after_grace(pids, grace_s: float = 10.0) -> list[int]:
    """The ``pids`` still alive after up to ``grace_s``: every process got its signal, but may finish exiting after
    the main process, and the resource tracker (which ignores SIGTERM) exits once its pipe's last writer has gone."""
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def _leaked_shm(before: set[str]) -> set[str]:
    """Entries created since ``before`` that no live process maps (concurrent unrelated runs map theirs)."""
    return leaked_shm(before, SHM_PREFIXES, wait_s=LEAK_WINDOW_S)


def _start(tmp_path: Path, *args: str, log_name: str = "stderr.txt") -> tuple[subprocess.Popen, Path, Path]:
    rdir = tmp_path / "run"
    log_path = tmp_path / log_name
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            [PYTHON, "-m", "sample_fast.train", "env=toy", "run.total_env_steps=1e9", f"run.dir={rdir}",
             "logging.interval_s=0.3", "logging.tensorboard=false", "logging.plot=false", *args],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    return proc, rdir, log_path


def _wait_rows(proc: subprocess.Popen, rdir: Path, log_path: Path, rows: int = 2, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while len(read_csv(str(rdir / "progress.csv"))) < rows:  # training is under way
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no progress rows within {timeout:g} s"
        time.sleep(0.2)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen):
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# ----- signals ------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "sig, status",
    [(signal.SIGTERM, 143), pytest.param(signal.SIGHUP, 129, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGHUP"],
)
def test_signal_to_the_process_group_saves_and_leaves_nothing(tmp_path, sig, status):
    """``kill -TERM -- -PGID`` (docker stop, systemd, SLURM, Kubernetes) and SIGHUP to the group (a closed terminal)
    reach the sampler and multiprocessing's resource tracker too: they survive it, the runner saves a final
    checkpoint and stops them, and the run exits with 128 + the signal's number."""
    before = shm_entries()
    proc, rdir, log_path = _start(tmp_path, "run.mode=async")
    with _reaped(proc):
        _wait_rows(proc, rdir, log_path)
        procs = descendants(proc.pid)  # the sampler, multiprocessing's resource tracker
        assert len(procs) >= 2, "expected the sampler and the resource tracker"  # both are in the group
        # the sampler's stack-dump file has no name on disk: nothing to leave in /tmp after a kill -9
        dumps = [os.readlink(fd) for p in (proc.pid, *procs) for fd in glob.glob(f"/proc/{p}/fd/*")
                 if "sample_fast_stacks_" in _readlink(fd)]  # fmt: skip
        assert dumps and all(d.endswith("(deleted)") for d in dumps), dumps
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)
        rc = proc.wait(timeout=60)
        assert time.monotonic() - t0 < 30
    text = log_path.read_text()
    assert rc == status, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert f"stopped by {sig.name} at env step" in text and f"(exit status {status})" in text
    rows = read_csv(str(rdir / "progress.csv"))
    state, _ = CheckpointManager(rdir).load_resume()
    assert state["env_steps"] == rows[-1]["env_steps"] > 0  # the final checkpoint is at the last step
    assert not _alive_after_grace(procs), "orphan processes left behind"
    assert _leaked_shm(before) == set()


@pytest.mark.timeout(240)
def test_double_ctrl_c_message_is_truthful(tmp_path):
    """A second Ctrl-C stops at once with exit status 130, and what it says about the final checkpoint is what is
    on disk."""
    proc, rdir, log_path = _start(tmp_path, "run.mode=async")
    with _reaped(proc):
        _wait_rows(proc, rdir, log_path)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.7)  # past the 0.5 s in which a second delivery counts as the same Ctrl-C
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    text = log_path.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if line.startswith(("interrupted", "stopped by SIGINT"))]
    assert len(lines) == 1, text[-3000:]
    files = CheckpointManager(rdir).checkpoints()
    m = re.search(r"after the final checkpoint was written \((\S+), env step (\d+)\)", lines[0])
    if m:  # the second Ctrl-C came after the save: the named file holds that step
        assert read_checkpoint_file(m[1])["state"]["env_steps"] == int(m[2])
    elif lines[0].startswith("stopped by SIGINT"):  # the stop had finished: the graceful line, at exit status 130
        assert files
    else:
        m = re.search(r"without the final checkpoint; the newest checkpoint on disk is (\S+),", lines[0])
        assert m and Path(m[1]) == files[-1], lines[0]


def test_interrupted_message_names_what_is_on_disk(tmp_path):
    ckpt = CheckpointManager(tmp_path)
    hooks = train_mod.TrainHooks(train_mod.resolve(_cfg()), ckpt, logger=None, start_env_steps=0)
    assert "no checkpoint was written yet" in hooks.interrupted_message()
    path = ckpt.save({"x": 1}, env_steps=64)
    assert f"the newest checkpoint on disk is {path}" in hooks.interrupted_message()
    hooks.final_saved, hooks.last_saved_path, hooks.last_saved_steps = True, str(path), 64
    assert f"after the final checkpoint was written ({path}, env step 64)" in hooks.interrupted_message()


def test_sampler_child_starts_with_stop_signals_blocked():
    """What makes the group signal safe during the sampler's start-up: a child started inside
    ``stop_signals_blocked`` is born with them blocked (the mask survives fork + exec)."""
    from sample_fast.procs import stop_signals_blocked

    with stop_signals_blocked():
        proc = subprocess.Popen(["grep", "SigBlk", "/proc/self/status"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    mask = int(out.split()[1], 16)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        assert mask & (1 << (sig - 1)), f"{sig.name} not blocked in the child: {out}"
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}  # restored here


# ----- the elastic sampler ------------------------------------------------------------------------------------------
def _sampler_pids(pid: int) -> list[int]:
    out = []
    for child in descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(child)
    return out


@pytest.mark.timeout(240)
def test_killed_sampler_is_replaced_in_a_real_run(tmp_path):
    """kill -9 of the sampler of an async toy run: one warning naming the cause, a new sampler process, training
    and its counters continue (progress.csv: env_steps and num_updates increasing, sampler_restarts 1), and a
    SIGTERM afterwards still ends with exit status 143, a final checkpoint and nothing left behind."""
    before = shm_entries()
    proc, rdir, log_path = _start(tmp_path, "run.mode=async")
    with _reaped(proc):
        _wait_rows(proc, rdir, log_path)
        (old,) = _sampler_pids(proc.pid)
        tracker = [p for p in descendants(proc.pid) if p != old]
        rows_before = len(read_csv(str(rdir / "progress.csv")))
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # a new sampler, and rows written after it started training
            new = [p for p in _sampler_pids(proc.pid) if p != old]
            rows = read_csv(str(rdir / "progress.csv"))
            if new and rows[-1]["sampler_restarts"] == 1 and len(rows) >= rows_before + 3:
                break
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
    text = log_path.read_text()
    assert rc == 143, text[-3000:]
    warnings = [line for line in text.splitlines() if "restarting it" in line]
    assert len(warnings) == 1 and f"the sampler process (pid {old}) died with signal SIGKILL" in warnings[0]
    assert "Traceback" not in text
    rows = read_csv(str(rdir / "progress.csv"))
    for key in ("env_steps", "num_updates"):
        values = [r[key] for r in rows]
        assert values == sorted(values) and len(set(values)) == len(values), key  # strictly increasing
    assert rows[-1]["sampler_restarts"] == 1 and rows[0]["sampler_restarts"] == 0
    state, _ = CheckpointManager(rdir).load_resume()
    assert state["env_steps"] == rows[-1]["env_steps"] and state["logger"]["sampler_restarts"] == 1
    # The newcomer check once caught one of them (pid unidentified) still alive right after wait(): a grace period.
    procs = (old, *new, *tracker)
    assert not _alive_after_grace(procs), "orphan processes"
    assert _leaked_shm(before) == set()


@pytest.mark.timeout(240)
def test_injected_sampler_crash_is_rehearsed_and_the_run_finishes(tmp_path):
    rdir = tmp_path / "run"
    proc = subprocess.run(
        [PYTHON, "-m", "sample_fast.train", "env=toy", "run.mode=async", *QUIET, "run.total_env_steps=8192",
         f"run.dir={rdir}", "debug.inject=sampler_crash@slot:3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "debug.inject=sampler_crash@slot:3" in proc.stderr
    assert re.search(r"the sampler process \(pid \d+\) died with signal SIGKILL .*restarting it", proc.stderr)
    rows = read_csv(str(rdir / "progress.csv"))
    assert rows[-1]["sampler_restarts"] == 1 and rows[-1]["env_steps"] >= 8192  # 64 slots of 8 x 16 steps


@pytest.mark.timeout(240)
def test_sampler_restart_limit_stops_the_run_with_a_final_checkpoint(tmp_path):
    """sampler_crash at every slot from the 2nd on: the first replacement dies at its first slot too, which is
    one failure more than runner.max_sampler_restarts=1 allows: one error line, a final checkpoint, exit status 1."""
    rdir = tmp_path / "run"
    proc = subprocess.run(
        [PYTHON, "-m", "sample_fast.train", "env=toy", "run.mode=async", *QUIET, "run.total_env_steps=1e9",
         f"run.dir={rdir}", "debug.inject=sampler_crash@slot:2+", "runner.max_sampler_restarts=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "failed 2 times within runner.restart_window_s=600 s" in errors[0], errors
    assert "more than runner.max_sampler_restarts=1 allows" in errors[0]
    m = re.search(r"final checkpoint (\S+) written", proc.stderr)
    assert m and read_checkpoint_file(m[1])["state"]["env_steps"] > 0


def test_sampler_crash_needs_async_mode():
    with pytest.raises(ConfigError, match="sampler_crash needs run.mode=async"):
        train_mod.prepare(_cfg("run.mode=serial", "debug.inject=sampler_crash@slot:1"))


# ----- storage faults -----------------------------------------------------------------------------------------------
def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


@pytest.mark.timeout(120)
def test_injected_save_error_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
    rdir = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        summary = train_mod.train(_cfg(*SERIAL, "run.total_env_steps=1024", "run.checkpoint_interval_s=0.05",
                                       "debug.inject=save_error@save:1", f"run.dir={rdir}"))  # fmt: skip
    failed = _warnings(caplog, "checkpoint: could not write")
    assert len(failed) == 1 and "ENOSPC" in failed[0] and str(rdir / "checkpoints") in failed[0], failed
    assert "failure 1 of run.max_save_failures=3 in a row" in failed[0]
    assert summary["reason"] == "total_env_steps" and summary["final_checkpoint"]
    ckpt = CheckpointManager(rdir)
    assert ckpt.checkpoints() and not list(ckpt.dir.glob(".*.tmp-*"))  # the half-written temporary file is gone
    rows = read_csv(str(rdir / "progress.csv"))
    assert any(r["checkpoint_s"] > 0 for r in rows)  # the save stall is measured and logged


class _FailingOpen:
    """``open`` for sample_fast.checkpoint that fails its checkpoint writes with ``code`` once ``armed``."""

    def __init__(self, code: int):
        self.code, self.armed, self.calls = code, False, 0

    def __call__(self, path, mode="r", *args, **kwargs):
        if self.armed and "w" in mode:
            self.calls += 1
            raise OSError(self.code, os.strerror(self.code), str(path))
        return open(path, mode, *args, **kwargs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC], ids=["EROFS", "ENOSPC"])
def test_saves_that_keep_failing_stop_the_run_cleanly(tmp_path, monkeypatch, caplog, code):
    import sample_fast.checkpoint as checkpoint_mod

    rdir = tmp_path / "run"
    failing = _FailingOpen(code)
    monkeypatch.setattr(checkpoint_mod, "open", failing, raising=False)
    real_save = train_mod.TrainHooks.save

    def save_then_arm(self, env_steps):
        ok = real_save(self, env_steps)
        failing.armed = True  # the first save succeeds, every later one fails
        return ok

    monkeypatch.setattr(train_mod.TrainHooks, "save", save_then_arm)
    cfg = _cfg(*SERIAL, "run.total_env_steps=1e9", "run.checkpoint_interval_s=0.05", "run.max_save_failures=3",
               f"run.dir={rdir}")  # fmt: skip
    with caplog.at_level(logging.WARNING), pytest.raises(train_mod.RunFailed) as err:
        train_mod.train(cfg)
    assert "3 checkpoint saves in a row failed (run.max_save_failures=3)" in str(err.value)
    ckpt = CheckpointManager(rdir)
    good = ckpt.checkpoints()
    assert len(good) == 1 and f"the newest checkpoint on disk is {good[0]}" in str(err.value)
    assert read_checkpoint_file(good[0])["state"]["env_steps"] > 0  # the good one is untouched
    failed = _warnings(caplog, "checkpoint: could not write")
    assert len(failed) == 3 and failing.calls == 3
    assert all(errno.errorcode[code] in m and "ckpt_" in m for m in failed), failed
    assert not list(ckpt.dir.glob(".*.tmp-*"))


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root or CAP_SYS_ADMIN"
        )
    try:
        yield path
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True, timeout=30)
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["read_only", "disk_full"])
def test_real_read_only_or_full_file_system(tmp_path, monkeypatch, caplog, fault):
    """A tmpfs made read-only (root ignores chmod, not a read-only mount), or filled to the last byte, after the
    first checkpoint: every later save, CSV row and plot fails; the run reports each save in one line, keeps the
    good checkpoint and stops with RunFailed after run.max_save_failures; nothing raises from the logs."""
    with _tmpfs(tmp_path / "fs", "8m") as fs:
        rdir = fs / "run"
        real_save = train_mod.TrainHooks.save
        broken = []

        def save_then_break(self, env_steps):
            ok = real_save(self, env_steps)
            if not broken:
                broken.append(True)
                if fault == "read_only":
                    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True, timeout=30)
                else:
                    with open(fs / "filler", "wb") as f, contextlib.suppress(OSError):
                        while True:
                            f.write(b"\0" * 65536)
                            f.flush()
            return ok

        monkeypatch.setattr(train_mod.TrainHooks, "save", save_then_break)
        # an event file open for writing makes `mount -o remount,ro` fail (EBUSY): TensorBoard on the full disk only
        tensorboard = "true" if fault == "disk_full" else "false"
        cfg = _cfg("run.mode=serial", "logging.progress=off", "logging.interval_s=0.05",
                   f"logging.tensorboard={tensorboard}", "run.total_env_steps=1e9", "run.checkpoint_interval_s=0.05",
                   f"run.dir={rdir}")  # fmt: skip
        with caplog.at_level(logging.WARNING), pytest.raises(train_mod.RunFailed, match="3 checkpoint saves"):
            train_mod.train(cfg)
        ckpt = CheckpointManager(rdir)
        assert len(ckpt.checkpoints()) == 1 and ckpt.load_resume() is not None
        code = "EROFS" if fault == "read_only" else "ENOSPC"
        failed = _warnings(caplog, "checkpoint: could not write")
        assert len(failed) == 3 and all(code in m for m in failed), failed
        assert len(_warnings(caplog, "logging: could not write")) <= 3  # one per sink: csv, tensorboard, plot
        assert not list(ckpt.dir.glob(".*.tmp-*"))


def test_csv_and_tensorboard_failures_are_one_warning_each(tmp_path, monkeypatch, caplog):
    cfg = LogConfig(progress="off", tensorboard=True, csv=True, plot=False)
    logger = ProgressLogger(str(tmp_path), cfg, total_env_steps=100)
    boom = OSError(errno.ENOSPC, "No space left on device")

    def fail(*args, **kwargs):
        raise boom

    monkeypatch.setattr(logger, "_write_csv", fail)
    monkeypatch.setattr(logger._tb, "add_scalar", fail)
    with caplog.at_level(logging.WARNING):
        for step in (10, 20, 30):
            logger.add_train(step, {"x": 1.0})
            logger.write_row(step)
        logger.close(40)
    assert len(_warnings(caplog, "progress.csv")) == 1 and len(_warnings(caplog, "TensorBoard logging is off")) == 1
    assert logger._tb is None


# ----- the fault switch and the rollback limit ----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_injected_nonfinite_loss_rolls_back_in_a_real_run(tmp_path):
    rdir = tmp_path / "run"
    proc = subprocess.run(
        [PYTHON, "-m", "sample_fast.train", "env=toy", *SERIAL, "run.total_env_steps=1024", f"run.dir={rdir}",
         "debug.inject=nonfinite_loss@update:5"],
        cwd=tmp_path, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "debug.inject=nonfinite_loss@update:5" in proc.stderr
    assert "rolled back to the last good state" in proc.stderr
    rows = read_csv(str(rdir / "progress.csv"))
    assert rows[-1]["rollbacks"] == 1 and rows[-1]["nonfinite_skips"] >= 1
    state, _ = CheckpointManager(rdir).load_resume()
    assert state["learner"]["rollbacks"] == 1
    assert all(torch.isfinite(v).all() for v in state["policy"].values() if v.is_floating_point())


@pytest.mark.timeout(120)
def test_a_run_that_keeps_rolling_back_stops_with_advice(tmp_path):
    """learner.lr=1e30 rolls back again and again: after run.max_rollbacks the run stops, exit status 1."""
    proc = subprocess.run(
        [PYTHON, "-m", "sample_fast.train", "env=toy", *SERIAL, "run.total_env_steps=1e9", "learner.lr=1e30",
         "run.max_rollbacks=2", f"run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "rolled back 3 times" in line[0] and "Lower learner.lr (now 1e+30" in line[0], line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nan_loss@update:3", "unknown fault 'nan_loss'"),
        ("nonfinite_loss@save:3", "use nonfinite_loss@update:<n>"),
        ("nonfinite_loss", "is not <fault>@<counter>:<n>"),
        ("save_error@save:0", "with n >= 1"),
    ],
)
def test_fault_switch_rejects_what_it_does_not_know(spec, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train_mod.prepare(_cfg(f"debug.inject={spec}"))


def test_fault_switch_parses_and_counts():
    from sample_fast.inject import Injector, parse_faults

    assert parse_faults("") == [] and not Injector([])
    injector = Injector(parse_faults("save_error@save:2, nonfinite_loss@update:3+"))
    assert [injector.save_error("p") is not None for _ in range(3)] == [False, True, False]
    assert [bool(injector.tick("update")) for _ in range(5)] == [False, False, True, True, True]


# ----- bad input ----------------------------------------------------------------------------------------------------
BAD_INPUT = [
    ("learner.num_minibatchs=4", "learner.num_minibatchs is not a key of learner",
     "did you mean learner.num_minibatches?"),
    ("+run.time_limit=30", "run.time_limit is not a key of run (from +run.time_limit=30)",
     "did you mean run.time_limit_s?"),
    ("+learner.foo=1", "learner.foo is not a key of learner", "its keys: "),
    ("algo=ppo", "algo=ppo is not an option of the algo group", "did you mean algo=appo?"),
    ("foo=1", "foo is not a top-level key", "its keys: algo, restart"),
    ("+learner.rollout_len=8", "learner.rollout_len is not a key of learner", "did you mean sampler.rollout_len?"),
    ("sampler.rollout_len=abc", "sampler.rollout_len=abc: Value 'abc' of type 'str' could not be converted to Integer",
     "the value without this override is sampler.rollout_len=16"),
    ("learner.lr=1e39", "learner.lr=1e+39 is out of range", "the appo preset sets learner.lr=0.003"),
    # the runner's process settings left the sampler section (issue 14): the old spelling names the new one
    ("sampler.heartbeat_timeout_s=5", "sampler.heartbeat_timeout_s is not a key of sampler",
     "did you mean runner.heartbeat_timeout_s?"),
    ("sampler.learner_threads=1", "sampler.learner_threads is not a key of sampler",
     "did you mean runner.learner_threads?"),
    ("runner.poll_s=0", "runner.poll_s must be > 0, got 0.0", ""),
]  # fmt: skip


@pytest.mark.parametrize("override, what, hint", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_key(override, what, hint, tmp_path):
    with pytest.raises(ConfigError) as err:
        cli.preflight(["env=toy", override, f"run.dir={tmp_path / 'r'}"])
        train_mod.prepare(_cfg(override, f"run.dir={tmp_path / 'r'}"))  # the range check runs on the resolved config
    message = str(err.value)
    assert what in message and hint in message and "\n" not in message, message


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "override", ["+run.time_limit=30", "sampler.rollout_len=abc", "learner.lr=1e39", "algo=ppo", "sampler.poll_s=0.1"]
)
def test_bad_input_exits_2_with_one_line(tmp_path, override):
    proc = subprocess.run([PYTHON, "-m", "sample_fast.train", "env=toy", override, f"run.dir={tmp_path / 'r'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=110)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("config error: "), proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.timeout(120)
def test_hydra_flags_still_work(tmp_path):
    """--cfg job prints the composed config (exit 0), and a Hydra error there exits 2 as well."""
    ok = subprocess.run([PYTHON, "-m", "sample_fast.train", "env=toy", "learner.lr=1e-3", "--cfg", "job"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=110)  # fmt: skip
    assert ok.returncode == 0 and "lr: 0.001" in ok.stdout, ok.stderr
    bad = subprocess.run([PYTHON, "-m", "sample_fast.train", "env=toy", "learner.lrr=1e-3", "--cfg", "job"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=110)  # fmt: skip
    assert bad.returncode == 2 and "did you mean learner.lr?" in bad.stderr, bad.stderr
    sweep = subprocess.run([PYTHON, "-m", "sample_fast.train", "-m", "env=toy", "learner.lrr=1e-3,2e-3"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=110)  # fmt: skip
    assert sweep.returncode == 2, sweep.stderr  # multirun: Hydra's own report, with our status


# ----- resume -------------------------------------------------------------------------------------------------------
def _state(step: int) -> dict:
    return {"env_steps": step, "w": torch.full((3,), float(step))}


def test_resume_takes_an_intact_best_newer_than_every_intact_regular_one(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(_state(100), env_steps=100, metric=1.0)
    newest = mgr.save(_state(200), env_steps=200, metric=5.0)  # also best.pt
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING):
        state, path = mgr.load_resume()
    assert path.name == "best.pt" and state["env_steps"] == 200  # not ckpt_100: 100 steps retrained otherwise
    assert [p.name for p in mgr.checkpoints()] == ["ckpt_000000000100.pt"]  # the corrupt one left the kept slots
    assert (tmp_path / "checkpoints" / "ckpt_000000000200.pt.corrupt").exists()
    assert _warnings(caplog, "renamed it to ckpt_000000000200.pt.corrupt")


def test_resume_prefers_the_regular_file_on_a_tie_and_renames_a_garbage_best(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(_state(100), env_steps=100, metric=1.0)
    assert mgr.load_resume()[1].name == "ckpt_000000000100.pt"  # best.pt holds the same step
    mgr.best_path.write_bytes(b"garbage")
    state, path = CheckpointManager(tmp_path).load_resume()
    assert path.name == "ckpt_000000000100.pt" and (tmp_path / "checkpoints" / "best.pt.corrupt").exists()
    mgr2 = CheckpointManager(tmp_path)
    mgr2.load_resume()
    mgr2.save(_state(200), env_steps=200, metric=0.5)  # any metric beats no best
    assert mgr2.load_best()[0]["env_steps"] == 200


@pytest.mark.timeout(120)
def test_corrupt_files_are_renamed_aside_on_resume_in_a_run(tmp_path):
    rdir = tmp_path / "run"
    train_mod.train(_cfg(*SERIAL, "run.total_env_steps=512", "run.checkpoint_interval_s=0.001", f"run.dir={rdir}"))
    ckpt = CheckpointManager(rdir)
    for path in ckpt.checkpoints():
        path.write_bytes(b"SFCKPT1\n" + b"\0" * 10)
    ckpt.best_path.write_bytes(b"")
    with pytest.raises(train_mod.RunFailed, match="no intact checkpoint .* restart=true"):
        train_mod.train(_cfg(*SERIAL, "run.total_env_steps=1024", f"run.dir={rdir}"))
    assert not ckpt.checkpoints() and len(ckpt.corrupt_files()) == 4  # the 3 kept + best.pt, all aside


def test_tensorboard_keeps_the_previous_runs_last_point(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = LogConfig(progress="off", tensorboard=True, csv=True, plot=False)
    first = ProgressLogger(str(tmp_path), cfg, total_env_steps=100)
    for step in (10, 20):
        first.add_episodes(torch.tensor([float(step)]), torch.tensor([5]))
        first.add_train(step, {})
        first.write_row(step)
    first.close(None)
    second = ProgressLogger(str(tmp_path), cfg, total_env_steps=100, start_env_steps=20, start_state=first.state_dict())
    second.add_train(30, {})
    second.write_row(30)
    second.close(None)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("charts/num_updates")] == [10, 20, 30]  # 20: the resumed step, kept
    rows = read_csv(str(tmp_path / "progress.csv"))
    assert [r["num_updates"] for r in rows] == [1, 2, 3] and [r["num_episodes"] for r in rows] == [1, 2, 2]
    assert math.isclose(rows[-1]["episode_return_mean"], 15.0)  # the return window continued too
