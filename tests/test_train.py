"""Trainer tests on the toy env: the CLI end to end (serial and async) with a learning threshold, resume round trip,
a corrupt newest checkpoint, and SIGTERM/SIGINT shutdown with a final checkpoint and no orphan processes."""

from __future__ import annotations

import copy
import glob
import json
import logging
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
from omegaconf import OmegaConf
from sample_fast.envs import make

import sample_fast
import sample_fast.train as train_mod
from sample_fast.checkpoint import CheckpointManager, read_checkpoint_file
from sample_fast.logger import read_csv

PYTHON = sys.executable


def _cfg(*overrides: str):
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        return compose("train", overrides=["env=toy", *overrides])


def _toy_returns() -> tuple[float, float]:
    """(optimal, random) episode return of the toy preset's env, from the env itself."""
    options = dict(OmegaConf.to_container(_cfg().env.options))
    with make("toy", 1, **options) as env:
        return float(env.optimal_return), float(env.random_return)


def _cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "sample_fast.train", "env=toy", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _assert_same(a, b, path: str = "") -> None:
    """Recursive equality of (nested) state dicts with tensors."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"tensor {path} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"keys of {path} differ: {set(a) ^ set(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"length of {path} differs"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


def _check_run_dir(rdir: Path, mode: str, total: int) -> list[dict]:
    """Everything a finished run must leave behind; returns the CSV rows."""
    rows = read_csv(str(rdir / "progress.csv"))
    assert len(rows) >= 2
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and steps[-1] >= total
    for col in ("wall_s", "fps", "episode_return_mean", "policy_lag_mean", "policy_lag_max"):
        assert col in rows[-1], f"progress.csv lacks {col}"
    # the final checkpoint is at the last logged step; best.pt exists beside the last K
    state, path = CheckpointManager(rdir).load_latest()
    assert state["env_steps"] == steps[-1] and Path(path).name == f"ckpt_{int(steps[-1]):012d}.pt"
    assert (rdir / "checkpoints" / "best.pt").exists()
    cfg = OmegaConf.load(rdir / "config.yaml")
    assert (cfg.env.name, cfg.run.mode, cfg.run.total_env_steps) == ("toy", mode, total)
    meta = json.loads((rdir / "meta.json").read_text())
    assert meta["version"] == sample_fast.__version__ and meta["git_revision"]
    png = rdir / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # TensorBoard: read the events back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(rdir / "tb"))
    events.Reload()
    returns = events.Scalars("charts/episode_return_mean")
    assert returns and returns[-1].step == int(steps[-1])
    return rows


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["serial", pytest.param("async", marks=pytest.mark.slow)])
def test_toy_learns_end_to_end(tmp_path, mode):
    """The CI learning test: `python -m sample_fast.train env=toy` reaches 75% of the optimal return."""
    optimal, random_return = _toy_returns()
    total = 12_000
    rdir = tmp_path / "run"
    t0 = time.monotonic()
    proc = _cli(
        f"run.mode={mode}",
        f"run.total_env_steps={total}",
        f"run.dir={rdir}",
        "logging.interval_s=0.5",
        cwd=tmp_path,
        timeout=220,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _check_run_dir(rdir, mode, total)
    final = rows[-1]["episode_return_mean"]
    # toy: reward 1 - mean((a - target)^2) per step, 16 steps; random actions score ~1/3 per step
    assert random_return < 0.75 * optimal
    assert final >= 0.75 * optimal, f"{mode}: mean return {final:.2f} < 0.75 x optimal {optimal} after {total} steps"
    # measured 7.4 s (serial) on this 2-core machine: the budget is ~16x that, for a loaded CI runner, and still
    # catches a learner or sampler that became an order of magnitude slower
    assert elapsed < 120, f"learning test took {elapsed:.0f} s (budget: 2 minutes)"
    assert set(os.listdir(tmp_path)) == {"run"}  # nothing written outside the run dir (no hydra outputs/)
    # not a TTY (as in CI): plain progress lines instead of rich's live bar
    assert re.search(r"^steps \S+/\S+  fps \S+  return \S+  lag ", proc.stdout, re.M), proc.stdout[-2000:]
    assert "\x1b[" not in proc.stdout


def _recording_runner(seen: dict):
    from sample_fast.runner import Runner as base

    class RecordingRunner(base):
        """Records what the runner starts from: the resumed counters, weights, learner state and RNGs, and the
        number of learner updates it ran."""

        def run(self, total_env_steps, time_limit_s=None, start_env_steps=0):
            seen["start_env_steps"] = start_env_steps
            seen["policy"] = copy.deepcopy(self.policy.state_dict())
            seen["learner"] = copy.deepcopy(self.learner.state_dict())
            seen["torch_rng"] = torch.get_rng_state()
            seen["sampler_rng"] = self._initial_sampler_rng
            try:
                return super().run(total_env_steps, time_limit_s=time_limit_s, start_env_steps=start_env_steps)
            finally:
                seen["num_trains"] = self._num_trains

    return RecordingRunner


_QUIET = ("run.mode=serial", "logging.progress=off", "logging.interval_s=0.05", "logging.tensorboard=false")


@pytest.mark.timeout(120)
def test_resume_continues_counters_weights_and_csv(tmp_path, monkeypatch):
    rdir = tmp_path / "run"
    train_mod.train(_cfg(*_QUIET, "run.total_env_steps=1024", f"run.dir={rdir}"))
    saved, _ = CheckpointManager(rdir).load_latest()
    rows1 = read_csv(str(rdir / "progress.csv"))
    assert saved["env_steps"] == rows1[-1]["env_steps"] >= 1024

    seen: dict = {}
    monkeypatch.setattr(train_mod, "import_runner", lambda: _recording_runner(seen))
    train_mod.train(_cfg(*_QUIET, "run.total_env_steps=2048", f"run.dir={rdir}"))
    assert seen["start_env_steps"] == saved["env_steps"]
    _assert_same(seen["policy"], saved["policy"], "policy")  # weights + normaliser buffers
    _assert_same(seen["learner"], saved["learner"], "learner")  # optimizer, counters, reward scaler, RNG
    assert torch.equal(seen["torch_rng"], saved["rng"]["torch"])

    rows2 = read_csv(str(rdir / "progress.csv"))
    assert rows2[: len(rows1)] == rows1  # the CSV continues: old rows kept, new ones appended
    new = rows2[len(rows1) :]
    assert new and new[0]["env_steps"] > saved["env_steps"] and new[-1]["env_steps"] >= 2048
    assert new[0]["wall_s"] >= rows1[-1]["wall_s"]  # wall-clock time continues too
    meta = json.loads((rdir / "meta.json").read_text())
    assert [s["resumed_from_env_steps"] for s in meta["starts"]] == [0, saved["env_steps"]]


_QUIET_ASYNC = ("run.mode=async", *_QUIET[1:])


@pytest.fixture(scope="module")
def async_resumed_run(tmp_path_factory):
    """An async toy run to 1024 env steps, stopped, then resumed to 2048: (run dir, first checkpoint, the second
    run's record, its final checkpoint, the CSV rows after each run)."""
    rdir = tmp_path_factory.mktemp("async_resume") / "run"
    train_mod.train(_cfg(*_QUIET_ASYNC, "run.total_env_steps=1024", f"run.dir={rdir}"))
    saved, _ = CheckpointManager(rdir).load_latest()
    rows1 = read_csv(str(rdir / "progress.csv"))
    seen: dict = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_mod, "import_runner", lambda: _recording_runner(seen))
        train_mod.train(_cfg(*_QUIET_ASYNC, "run.total_env_steps=2048", f"run.dir={rdir}"))
    final, _ = CheckpointManager(rdir).load_latest()
    return rdir, saved, seen, final, rows1, read_csv(str(rdir / "progress.csv"))


@pytest.mark.timeout(240)
def test_async_resume_continues_counters_learner_and_sampler_rng(async_resumed_run):
    rdir, saved, seen, final, rows1, rows2 = async_resumed_run
    assert saved["env_steps"] == rows1[-1]["env_steps"] >= 1024
    # the second run starts exactly where the checkpoint is, with its weights, learner state and both RNGs
    assert seen["start_env_steps"] == saved["env_steps"]
    _assert_same(seen["policy"], saved["policy"], "policy")
    _assert_same(seen["learner"], saved["learner"], "learner")  # optimizer, counters, reward scaler, generator
    assert torch.equal(seen["torch_rng"], saved["rng"]["torch"])
    sampler_rng = saved["sampler_rng"]
    assert sampler_rng.dtype == torch.uint8 and sampler_rng.shape == torch.get_rng_state().shape
    assert not torch.equal(sampler_rng, saved["rng"]["torch"])  # async: the sampler process's own stream
    assert torch.equal(seen["sampler_rng"], sampler_rng)
    # counters continue: env steps (one slot per train), and the learner's by exactly the second run's trains
    trains = seen["num_trains"]
    slot_steps = (final["env_steps"] - saved["env_steps"]) // trains
    assert trains > 0 and final["env_steps"] == saved["env_steps"] + trains * slot_steps >= 2048
    old, new = saved["learner"], final["learner"]
    assert new["policy_version"] == old["policy_version"] + trains
    assert new["env_steps"] == old["env_steps"] + trains * slot_steps
    learner_cfg = train_mod.resolve(_cfg(*_QUIET_ASYNC)).learner
    updates_per_train = learner_cfg.num_epochs * learner_cfg.num_minibatches  # no update was skipped on the toy
    assert new["num_updates"] - old["num_updates"] == trains * updates_per_train
    assert not torch.equal(final["sampler_rng"], sampler_rng)  # the resumed sampler drew from it
    # the CSV continues: old rows kept, new ones appended, later steps and wall-clock time
    assert rows2[: len(rows1)] == rows1
    new_rows = rows2[len(rows1) :]
    assert new_rows and new_rows[0]["env_steps"] > saved["env_steps"] and new_rows[-1]["env_steps"] >= 2048
    assert new_rows[0]["wall_s"] >= rows1[-1]["wall_s"]
    meta = json.loads((rdir / "meta.json").read_text())
    assert [s["resumed_from_env_steps"] for s in meta["starts"]] == [0, saved["env_steps"]]


@pytest.mark.timeout(240)
def test_async_resume_continues_the_csv_episode_and_update_counts(async_resumed_run):
    _, _, seen, _, rows1, rows2 = async_resumed_run
    new_rows = rows2[len(rows1) :]
    assert new_rows[-1]["num_updates"] == rows1[-1]["num_updates"] + seen["num_trains"]
    assert new_rows[0]["num_episodes"] >= rows1[-1]["num_episodes"]


@pytest.mark.timeout(120)
def test_corrupt_newest_checkpoint_resumes_from_previous(tmp_path, monkeypatch, caplog):
    rdir = tmp_path / "run"
    train_mod.train(_cfg(*_QUIET, "run.total_env_steps=1024", "run.checkpoint_interval_s=0.01", f"run.dir={rdir}"))
    files = CheckpointManager(rdir).checkpoints()
    assert len(files) >= 2
    newest, previous = files[-1], files[-2]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a crash mid-copy / a full disk
    prev_state = read_checkpoint_file(previous)["state"]
    seen: dict = {}
    monkeypatch.setattr(train_mod, "import_runner", lambda: _recording_runner(seen))
    best = read_checkpoint_file(rdir / "checkpoints" / "best.pt")
    with caplog.at_level(logging.WARNING):
        train_mod.train(_cfg(*_QUIET, "run.total_env_steps=1536", f"run.dir={rdir}"))
    assert any(newest.name in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert newest.with_name(newest.name + ".corrupt").exists()  # renamed aside: it no longer takes a kept slot
    prev_steps = int(previous.name[len("ckpt_") : -len(".pt")])
    assert prev_steps == prev_state["env_steps"]
    # the newest intact state: best.pt when it is newer than the previous regular checkpoint (the toy's return
    # rises, so best.pt is usually the truncated newest one's copy)
    expected = best["state"] if best["meta"]["env_steps"] > prev_steps else prev_state
    assert seen["start_env_steps"] == expected["env_steps"]
    _assert_same(seen["policy"], expected["policy"], "policy")


def _children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal_run(tmp_path: Path, mode: str, sig: signal.Signals, group: bool = False) -> None:
    """Signal a training run once under way. ``group``: as ``timeout -s SIG`` does, signal the main process and then
    its whole process group (the sampler included), so the main process gets the signal twice at once."""
    rdir = tmp_path / "run"
    log_path = tmp_path / "stderr.txt"
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            [PYTHON, "-m", "sample_fast.train", "env=toy", f"run.mode={mode}", "run.total_env_steps=1e9",
             f"run.dir={rdir}", "logging.interval_s=0.3", "logging.tensorboard=false"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err, start_new_session=group,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 150
            while len(read_csv(str(rdir / "progress.csv"))) < 2:  # training is under way
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no progress rows within 150 s"
                time.sleep(0.2)
            children = _children(proc.pid)
            if mode == "async":
                assert children, "the async sampler process is missing"
            proc.send_signal(sig)
            if group:
                os.killpg(proc.pid, sig)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    text = log_path.read_text()
    assert rc == 128 + sig, text[-3000:]  # stopped by a signal: 128 + its number (docs/training.md, exit statuses)
    assert f"{sig.name} received" in text and f"stopped by {sig.name} at env step" in text
    assert "Traceback" not in text, text[-3000:]
    rows = read_csv(str(rdir / "progress.csv"))
    state, _ = CheckpointManager(rdir).load_latest()
    assert state["env_steps"] == rows[-1]["env_steps"] > 0  # the final checkpoint is at the last step
    assert state["logger"]["num_updates"] == rows[-1]["num_updates"]  # the counters the next start continues
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if _alive(c)], "orphan processes left behind"
    assert (rdir / "learning_curve.png").exists()


@pytest.mark.timeout(240)
def test_sigterm_saves_final_checkpoint_async(tmp_path):
    _signal_run(tmp_path, "async", signal.SIGTERM)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigint_saves_final_checkpoint_serial(tmp_path):
    _signal_run(tmp_path, "serial", signal.SIGINT)


@pytest.mark.timeout(240)
def test_sigint_to_the_process_group_is_one_stop_request(tmp_path):
    """``timeout -s INT`` (and Ctrl-C in a terminal) reach every process of the group: still a graceful stop."""
    _signal_run(tmp_path, "async", signal.SIGINT, group=True)


class _FakeRunner:
    def __init__(self) -> None:
        self.stop_requests = 0

    def request_stop(self) -> None:
        self.stop_requests += 1


def test_stop_on_signals_duplicate_then_second_sigint():
    runner = _FakeRunner()
    before = signal.getsignal(signal.SIGINT)
    with train_mod.StopOnSignals(runner, duplicate_s=60.0) as stopper:
        assert signal.getsignal(signal.SIGINT) == stopper._handle
        stopper._handle(signal.SIGINT, None)
        stopper._handle(signal.SIGINT, None)  # the same interrupt delivered twice: ignored
        assert runner.stop_requests == 1 and stopper.received == ["SIGINT"]
        stopper.duplicate_s = 0.0
        stopper._handle(signal.SIGTERM, None)  # a later SIGTERM asks again, never forces
        assert runner.stop_requests == 2
        with pytest.raises(KeyboardInterrupt):  # a real second Ctrl-C stops at once
            stopper._handle(signal.SIGINT, None)
        assert runner.stop_requests == 2
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_second_ctrl_c_exits_130_without_traceback(monkeypatch, capsys):
    def interrupted(cfg, stopper=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod, "train", interrupted)
    monkeypatch.setattr(sys, "argv", ["sample_fast.train", "env=toy"])
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.getsignal(sig) for sig in stop_signals}
    try:
        with pytest.raises(SystemExit) as exc:
            train_mod.main()
        # the entry point leaves the process ignoring late stop signals: its status is decided
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in stop_signals)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert exc.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted (second Ctrl-C)" in err and "Traceback" not in err


def test_restart_moves_the_old_run_aside(tmp_path):
    rdir = tmp_path / "run"
    (rdir / "checkpoints").mkdir(parents=True)
    (rdir / "checkpoints" / "ckpt_000000000001.pt").write_bytes(b"old")
    moved = train_mod.move_aside(str(rdir))
    assert not rdir.exists() and (Path(moved) / "checkpoints" / "ckpt_000000000001.pt").read_bytes() == b"old"
    assert Path(moved).name.startswith("run.old-")


def test_resume_refuses_another_env_or_architecture(tmp_path):
    rdir = tmp_path / "run"
    cfg = train_mod.resolve(_cfg(f"run.dir={rdir}"))
    train_mod.write_run_files(cfg, str(rdir), 0)
    (rdir / "checkpoints").mkdir()
    (rdir / "checkpoints" / "ckpt_000000000001.pt").write_bytes(b"x")
    with pytest.raises(train_mod.ConfigError, match=r"policy=.*restart=true"):
        train_mod.prepare(_cfg(f"run.dir={rdir}", "policy.hidden_sizes=[8]"))
    train_mod.prepare(_cfg(f"run.dir={rdir}"))  # the same config resumes
    train_mod.prepare(_cfg(f"run.dir={rdir}", "restart=true", "policy.hidden_sizes=[8]"))  # restart is allowed


def test_slots_too_big_for_dev_shm_stop_the_run_before_any_process(tmp_path, monkeypatch):
    # docker's default /dev/shm is 64 MiB: a store that does not fit failed deep in torch's share_memory_ ("No space
    # left on device"); the trainer says so first, with the fix, and starts nothing (no sampler, no checkpoint)
    from sample_fast import trajectory_store

    monkeypatch.setattr(trajectory_store, "_free_bytes", lambda path: 1024)
    runner_cls = lambda *args, **kwargs: pytest.fail("a Runner was built")  # noqa: E731
    monkeypatch.setattr(train_mod, "import_runner", lambda: runner_cls)
    rdir = tmp_path / "run"
    with pytest.raises(train_mod.RunFailed, match=r"needs \d MiB of shared memory, but /dev/shm has 0 MiB free: give "
                       r"it more \(docker run --shm-size=1g"):  # fmt: skip
        train_mod.train(_cfg(*_QUIET_ASYNC, f"run.dir={rdir}"))
    assert not list((rdir / "checkpoints").glob("*"))
    # serial mode keeps its slots in the process's own memory: nothing to check there
    monkeypatch.undo()
    monkeypatch.setattr(trajectory_store, "_free_bytes", lambda path: 1024)
    assert train_mod.train(_cfg(*_QUIET, "run.total_env_steps=256", f"run.dir={tmp_path / 's'}"))["env_steps"] >= 256
