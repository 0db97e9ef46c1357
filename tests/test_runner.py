"""Runner: serial and async batches, policy lag, hooks, and the lifecycle guarantees (dead, failing and stalled
sampler processes; SIGTERM; no orphaned process and no shared-memory segment left behind).

Process start-up with spawn costs ~2-6 s here, so each async test starts exactly one sampler process.
"""

import functools
import gc
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from sample_fast.envs.toy import ToyEnv
from test_sampler import ACTION_STEP, LOG_STD, VersionPolicy, check_batch, toy_env

from sample_fast import trajectory_store
from sample_fast.procs import LEAK_WINDOW_S, SharedRngState, leaked_shm, pid_alive, shm_entries
from sample_fast.runner import Runner, RunnerConfig, SamplerError, SamplerRestartLimit
from sample_fast.sampler import SamplerConfig
from sample_fast.trajectory_store import TrajectoryStore

OUR_SHM_PREFIXES = ("sem.mp-", "torch_", "psm_")
multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "sample_fast.runner", "test_runner"])


class CheckingLearner:
    """Learner stand-in: checks every batch independently, then "updates" to the next version's weights."""

    def __init__(self, policy: VersionPolicy, delay_s: float = 0.0) -> None:
        self.policy, self.delay_s = policy, delay_s
        self.policy_version = 0
        self.lags: list[torch.Tensor] = []
        self.policy.set_version(0)

    def train(self, batch) -> dict[str, float]:
        assert batch["rewards"].shape == torch.Size([8, 6])  # [T, B] (obs: [T + 1, B])
        check_batch(batch)  # continuity, terminated/truncated, version-encoding actions (see test_sampler)
        self.lags.append(self.policy_version - batch["policy_version"])
        self.policy_version += 1
        self.policy.set_version(self.policy_version)
        time.sleep(self.delay_s)
        return {"batch_steps": float(batch["rewards"].numel())}


class RecordingHooks:
    def __init__(self) -> None:
        self.trains, self.episodes, self.stops = [], [], []
        self.runner = None
        self.on_train_extra = None
        self.alive_at_stop = None

    def on_train(self, env_steps, metrics):
        self.trains.append((env_steps, metrics))
        if self.on_train_extra is not None:
            self.on_train_extra(self, env_steps)

    def on_episodes(self, env_steps, returns, lengths):
        self.episodes.append((returns.clone(), lengths.clone()))

    def on_stop(self, env_steps, reason):
        self.stops.append((env_steps, reason))
        proc = self.runner.process
        self.alive_at_stop = proc is not None and proc.is_alive()


class FailingToy(ToyEnv):
    """Toy env that raises (or hangs) at its ``fail_at``-th step."""

    def __init__(self, num_envs: int, fail_at: int, how: str) -> None:
        super().__init__("toy", num_envs, terminate_on_miss=True, miss_threshold=0.5, max_episode_steps=8)
        self.fail_at, self.how, self.num_steps = fail_at, how, 0

    def _step(self, actions):
        self.num_steps += 1
        if self.num_steps == self.fail_at:
            if self.how == "raise":
                raise RuntimeError(f"boom at step {self.num_steps}")
            time.sleep(120)  # a hung simulator
        return super()._step(actions)


def _cfg(**kw) -> SamplerConfig:
    return SamplerConfig(**{"rollout_len": 8, "num_splits": 2, "num_slots": 4, "seed": 0, **kw})


def _rcfg(**kw) -> RunnerConfig:
    # forkserver with torch and these test modules preloaded: after the first start, a sampler process starts in
    # ~0.2 s instead of a fresh spawn's several seconds. The SIGTERM test's runner uses spawn, the default.
    return RunnerConfig(**{"poll_s": 0.05, "shutdown_timeout_s": 5.0, "mp_start_method": "forkserver", **kw})


def _runner(mode: str, env_fn=None, delay_s: float = 0.0, **rcfg_kw) -> tuple[Runner, RecordingHooks]:
    hooks = RecordingHooks()
    env_fn = env_fn or functools.partial(toy_env, 6)
    runner = Runner(env_fn, VersionPolicy, functools.partial(CheckingLearner, delay_s=delay_s), _cfg(),
                    _rcfg(**rcfg_kw), mode=mode, hooks=hooks)  # fmt: skip
    hooks.runner = runner
    return runner, hooks


def _new_shm(before: set[str]) -> set[str]:
    """Entries created since ``before`` that nobody maps: leaked (concurrent test runs map their own)."""
    gc.collect()
    return leaked_shm(before, OUR_SHM_PREFIXES, wait_s=LEAK_WINDOW_S)


def _check_run(runner, hooks, summary, total, start=0):
    assert summary["reason"] == "total_env_steps" and summary["env_steps"] == runner.env_steps
    steps = [s for s, _ in hooks.trains]
    assert steps == list(range(start + 48, summary["env_steps"] + 1, 48))  # one slot = 8 steps x 6 envs
    assert summary["env_steps"] >= total and runner.learner.policy_version == len(steps)
    for (_, metrics), lag in zip(hooks.trains, runner.learner.lags, strict=True):
        # the runner's lag metrics agree with the learner's own count, computed from the batch independently
        assert metrics["policy_lag_min"] == lag.min().item() and metrics["policy_lag_max"] == lag.max().item()
        assert metrics["policy_lag_mean"] == pytest.approx(lag.double().mean().item())
        assert metrics["batch_steps"] == 48.0 and metrics["fps"] > 0
    returns = torch.cat([r for r, _ in hooks.episodes])
    lengths = torch.cat([n for _, n in hooks.episodes])
    assert returns.numel() > 10 and 1 <= lengths.min() and lengths.max() <= 8
    assert (returns <= lengths.float() + 1e-5).all()  # reward <= 1 per step
    assert hooks.stops == [(summary["env_steps"], "total_env_steps")]


def test_serial_mode_acts_on_the_learners_device_only():
    # serial: the learner's own policy acts, so another sampler.device would be silently ignored: rejected instead
    with pytest.raises(ValueError, match=r"sampler\.device='cuda', but serial mode acts with the learner's policy on"):
        Runner(functools.partial(toy_env, 6), VersionPolicy, CheckingLearner, _cfg(device="cuda"), _rcfg(),
               mode="serial")  # fmt: skip
    for device in ("cpu", "auto"):  # the learner's device, or auto, is what serial mode does anyway
        runner = Runner(functools.partial(toy_env, 6), VersionPolicy, CheckingLearner, _cfg(device=device), _rcfg(),
                        mode="serial")  # fmt: skip
        assert runner.run(total_env_steps=48)["env_steps"] == 48


@pytest.mark.timeout(60)
def test_serial_runner_trains_on_correct_batches():
    runner, hooks = _runner("serial")
    summary = runner.run(total_env_steps=480, start_env_steps=0)
    _check_run(runner, hooks, summary, 480)
    lags = torch.stack(runner.learner.lags)  # [num_trains, T, B]
    # Serial with 2 splits, slots trained in pairs A, B: steps 1..T-1 of a round act with the weights after both
    # trains of the previous round -> lag 0 (A) and 1 (B). Step 0 was acted (and sent) before those two trains,
    # right when the previous slot ended -> lag 2 (A) and 3 (B).
    assert torch.equal(lags[2::2, 1:], torch.zeros_like(lags[2::2, 1:]))
    assert torch.equal(lags[3::2, 1:], torch.ones_like(lags[3::2, 1:]))
    assert (lags[2::2, 0] == 2).all() and (lags[3::2, 0] == 3).all()


@pytest.mark.timeout(90)
def test_async_runner_trains_on_correct_batches_and_leaves_nothing_behind():
    before = shm_entries()
    runner, hooks = _runner("async", delay_s=0.01)
    child = {}

    def record_child(h, env_steps):
        proc = h.runner.process
        if not child:
            child["pid"] = proc.pid
            close = proc.close

            def close_recording_exitcode():  # Process.exitcode is unreadable once closed: record it just before
                child["exitcode"] = proc.exitcode
                close()

            proc.close = close_recording_exitcode

    hooks.on_train_extra = record_child
    summary = runner.run(total_env_steps=48 * 30, start_env_steps=96)
    _check_run(runner, hooks, summary, 48 * 30, start=96)
    assert hooks.alive_at_stop  # on_stop ran before shutdown: the trainer can still checkpoint with a live sampler
    lags = torch.cat([lag.flatten() for lag in runner.learner.lags])
    assert lags.min() >= 0 and lags.max() > 0  # the sampler really ran ahead of the learner, and versions say so
    assert runner.process is None  # joined and closed
    # The child exited by itself through CTRL_STOP (exit code 0), not terminate() (-SIGTERM) or kill() (-SIGKILL),
    # and it is gone: no process, not even a zombie.
    assert child["exitcode"] == 0
    assert not pid_alive(child["pid"]) and not os.path.exists(f"/proc/{child['pid']}")
    del runner, hooks
    assert _new_shm(before) == set()


@pytest.mark.timeout(90)
def test_killed_sampler_is_detected_within_seconds():
    runner, hooks = _runner("async", max_sampler_restarts=0)  # no restart: the first failure stops the run
    killed = {}

    def kill_on_second_train(h, env_steps):
        if len(h.trains) == 2:
            killed["pid"] = h.runner.process.pid
            killed["t"] = time.monotonic()
            os.kill(killed["pid"], signal.SIGKILL)

    hooks.on_train_extra = kill_on_second_train
    with pytest.raises(SamplerError, match="died with signal SIGKILL"):
        runner.run(total_env_steps=10**9)
    # Detection is the next poll_s=0.05 wait plus a join: measured 0.05-0.3 s. The bound leaves a loaded 2-core
    # machine ~30x that, and still fails a runner that only notices a dead child through the 3 s heartbeat or later.
    assert time.monotonic() - killed["t"] < 10.0
    assert not pid_alive(killed["pid"])
    assert len(hooks.stops) == 1 and hooks.stops[0][1].startswith("error: SamplerRestartLimit")


@pytest.mark.timeout(90)
def test_a_sampler_killed_inside_the_stores_lock_is_reported_as_killed():
    """The sampler dies holding the store's lock (a kill -9 inside its microseconds, seen once in CI): the learner's
    release of its slot times out on the lock, and the error must name the death and its signal, not only the lock.
    Staged from the learner's side: during its second train() the learner takes the store's lock itself and kills
    the sampler, so the release that follows meets a lock nobody will give back; a timer thread frees it afterwards
    (a multiprocessing Lock has no owner) so that shutdown can use the store."""
    runner, hooks = _runner("async", max_sampler_restarts=0)
    train, killed = runner.learner.train, {}

    def train_then_kill_inside_the_lock(batch):
        out = train(batch)
        if not killed:
            killed["pid"] = runner.process.pid
            assert runner.store._lock.acquire(timeout=5.0)
            os.kill(killed["pid"], signal.SIGKILL)
            threading.Timer(trajectory_store.LOCK_TIMEOUT_S + 2.0, runner.store._lock.release).start()
        return out

    runner.learner.train = train_then_kill_inside_the_lock
    with pytest.raises(SamplerError, match=r"died with signal SIGKILL") as err:
        runner.run(total_env_steps=10**9)
    assert f"pid {killed['pid']}" in str(err.value) and "held the store's lock" not in str(err.value)
    assert not pid_alive(killed["pid"])


@pytest.mark.timeout(90)
def test_sampler_exception_traceback_reaches_the_parent_and_nothing_leaks():
    before = shm_entries()
    runner, hooks = _runner("async", env_fn=functools.partial(FailingToy, 6, 30, "raise"), max_sampler_restarts=0)
    pids = []
    hooks.on_train_extra = lambda h, s: pids.append(h.runner.process.pid)
    with pytest.raises(SamplerError, match="boom at step 30") as err:
        runner.run(total_env_steps=10**9)
    assert "Traceback (most recent call last)" in str(err.value) and "in _step" in str(err.value)
    assert runner.process is None
    assert all(not pid_alive(pid) for pid in pids)
    del runner, hooks, err
    assert _new_shm(before) == set()


@pytest.mark.timeout(90)
def test_stalled_sampler_is_reported_with_its_stack():
    runner, _ = _runner(
        "async", env_fn=functools.partial(FailingToy, 6, 30, "hang"), heartbeat_timeout_s=3.0, shutdown_timeout_s=1.0,
        max_sampler_restarts=0,
    )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(SamplerError, match="sent no heartbeat") as err:
        runner.run(total_env_steps=10**9)
    message = str(err.value)
    # faulthandler's dump of the child: the hung frame and the sampler loop that called it
    assert "in _step" in message and "in advance" in message and "test_runner.py" in message
    # heartbeat_timeout_s (3) + the dump wait (<= 2) + shutdown (1, then terminate): measured 4.4 s; a bound ~14x
    # that, far below the child's 120 s hang, so a runner that waited for the hang to end fails here.
    assert time.monotonic() - t0 < 60


# ----- the elastic sampler --------------------------------------------------------------------------------------------
def _logging_toy(path: str, num_envs: int) -> ToyEnv:
    """toy_env that appends the pid of the process building it to ``path`` (who built which env groups)."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return toy_env(num_envs)


class RestartHooks(RecordingHooks):
    def __init__(self) -> None:
        super().__init__()
        self.restarts = []

    def on_sampler_restart(self, env_steps, cause, restarts):
        self.restarts.append((env_steps, cause, restarts, len(self.trains)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_failed_sampler_is_replaced_and_training_goes_on(tmp_path, monkeypatch, how):
    """kill -9 (or SIGSTOP: no heartbeat) of the sampler process mid-run: a new process rebuilds its envs, the
    dead one's partial slots go back to FREE re-poisoned, the learner keeps its state and counters, the run reaches
    its total, and nothing is left behind."""
    before = shm_entries()
    built = tmp_path / "built.txt"
    hooks = RestartHooks()
    runner = Runner(functools.partial(_logging_toy, str(built), 6), VersionPolicy, CheckingLearner, _cfg(),
                    _rcfg(heartbeat_timeout_s=2.0), mode="async", hooks=hooks)  # fmt: skip
    hooks.runner = runner
    freed = []
    replace_writer = TrajectoryStore.replace_writer

    def recording_replace_writer(store):  # the slots it frees must hold poison again, every key
        slots = replace_writer(store)
        freed.append({i: store.find_poison(i) for i in slots})
        return slots

    monkeypatch.setattr(TrajectoryStore, "replace_writer", recording_replace_writer)

    def fault_on_third_train(h, env_steps):
        if len(h.trains) == 3:
            h.killed = h.runner.process.pid
            os.kill(h.killed, signal.SIGKILL if how == "kill" else signal.SIGSTOP)

    hooks.on_train_extra = fault_on_third_train
    summary = runner.run(total_env_steps=48 * 24)
    _check_run(runner, hooks, summary, 48 * 24)  # every batch checked, versions and env steps continuous
    assert summary["sampler_restarts"] == 1 and runner.sampler_restarts == 1
    ((steps, cause, count, trains_at),) = hooks.restarts
    what = "died with signal SIGKILL" if how == "kill" else "sent no heartbeat for"
    assert f"the sampler process (pid {hooks.killed}) {what}" in cause and count == 1 and trains_at >= 3
    assert trains_at < len(hooks.trains)  # training went on after the restart
    # env groups: 2 built by the first sampler process, 2 by its replacement (the parent's probe too)
    pids = [int(x) for x in built.read_text().split()]
    children = [p for p in pids if p != os.getpid()]
    assert len(children) == 4 and len(set(children)) == 2 and hooks.killed == children[0]
    # the dead process's partial slots were freed, each fully poisoned (every key, all rows) when freed
    # (the learner here is faster than the toy sampler, so the sampler always holds a slot FILLING)
    assert len(freed) == 1 and len(freed[0]) >= 1
    T, B, OBS = 8, 6, 3
    for bad in freed[0].values():
        assert bad["rewards"] == T * B and bad["obs"] == (T + 1) * B * OBS and bad["final_count"] == 1
    assert not pid_alive(hooks.killed)
    del runner, hooks
    assert _new_shm(before) == set()


@pytest.mark.timeout(120)
def test_restart_limit_stops_the_run():
    """An env that fails in every process: after runner.max_sampler_restarts restarts within the window, the next
    failure stops the run (on_stop runs: the trainer's final checkpoint) with a message naming the limit."""
    hooks = RestartHooks()
    runner = Runner(functools.partial(FailingToy, 6, 30, "raise"), VersionPolicy, CheckingLearner, _cfg(),
                    _rcfg(max_sampler_restarts=2, restart_window_s=600.0), mode="async", hooks=hooks)  # fmt: skip
    hooks.runner = runner
    with pytest.raises(SamplerRestartLimit) as err:
        runner.run(total_env_steps=10**9)
    message = str(err.value)
    assert "failed 3 times within runner.restart_window_s=600 s, more than runner.max_sampler_restarts=2" in message
    assert "boom at step 30" in message  # the last failure's own traceback
    assert [r[2] for r in hooks.restarts] == [1, 2] and runner.sampler_restarts == 2
    assert len(hooks.stops) == 1 and hooks.stops[0][1].startswith("error: SamplerRestartLimit")
    assert runner.process is None


@pytest.mark.timeout(60)
def test_first_sampler_that_cannot_start_is_not_restarted():
    """An exception while the first process builds its envs (a broken env or policy) would only repeat: no
    restart, the SamplerError at once."""

    hooks = RestartHooks()
    runner = Runner(_failing_build, VersionPolicy, CheckingLearner, _cfg(), _rcfg(), mode="async", hooks=hooks)
    hooks.runner = runner
    with pytest.raises(SamplerError, match="no env here") as err:
        runner.run(total_env_steps=10**9)
    assert not isinstance(err.value, SamplerRestartLimit) and hooks.restarts == []


def _slow_build(delay_s: float) -> ToyEnv:
    if multiprocessing.parent_process() is not None:  # the sampler process builds slowly (an MJX compile, a load)
        time.sleep(delay_s)
    return toy_env(6)


@pytest.mark.timeout(90)
def test_a_start_up_longer_than_the_heartbeat_timeout_is_no_stall():
    """The heartbeat timeout counts from READY on: a sampler that takes 2 x 1.5 s to build its envs, with
    runner.heartbeat_timeout_s=1, is not taken for a stalled one (the suite's SIGSTOP case restarted it 3 times)."""
    hooks = RestartHooks()
    runner = Runner(functools.partial(_slow_build, 1.5), VersionPolicy, CheckingLearner, _cfg(),
                    _rcfg(heartbeat_timeout_s=1.0), mode="async", hooks=hooks)  # fmt: skip
    hooks.runner = runner
    summary = runner.run(total_env_steps=48 * 6)
    assert summary["reason"] == "total_env_steps" and hooks.restarts == [] and summary["sampler_restarts"] == 0


def _failing_build() -> ToyEnv:
    if multiprocessing.parent_process() is not None:  # the sampler process (the parent's probe must succeed)
        raise RuntimeError("no env here")
    return toy_env(6)


class NoiseRecordingLearner(CheckingLearner):
    """Also keeps each batch's action noise, recovered from the actions: VersionPolicy acts with
    ``mean(version) + exp(LOG_STD) * torch.randn(num_envs, 2)`` and the mean is ``ACTION_STEP * version``."""

    def __init__(self, policy: VersionPolicy) -> None:
        super().__init__(policy)
        self.noise: list[torch.Tensor] = []

    def train(self, batch) -> dict[str, float]:
        mean = ACTION_STEP * batch["policy_version"].unsqueeze(-1).double()
        self.noise.append((batch["actions"].double() - mean) / math.exp(LOG_STD))
        return super().train(batch)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["serial", "async"])
def test_sampler_rng_starts_from_the_given_state_and_is_published(mode):
    """The sampler's action noise (VersionPolicy: torch.randn in the sampler's process) continues from the RNG
    state a resumed run passes in, and ``sampler_rng_state()`` returns a state of that same stream."""
    start = torch.Generator().manual_seed(1234).get_state()
    hooks = RecordingHooks()
    runner = Runner(functools.partial(toy_env, 6), VersionPolicy, NoiseRecordingLearner, _cfg(), _rcfg(), mode=mode,
                    hooks=hooks, sampler_rng_state=start)  # fmt: skip
    hooks.runner = runner
    published_during_run = []
    hooks.on_train_extra = lambda h, steps: published_during_run.append(h.runner.sampler_rng_state())
    runner.run(total_env_steps=48 * 6)
    # Expected: the stream from `start`. The splits act in turn, each drawing randn(6, 2): the first slot of split 0
    # holds draws 0, 2, ..., 14 and the first slot of split 1 draws 1, 3, ..., 15.
    gen = torch.Generator()
    gen.set_state(start)
    draws = torch.stack([torch.randn(6, 2, generator=gen) for _ in range(16)]).double()
    first_two = runner.learner.noise[:2]
    expected = [draws[0::2], draws[1::2]]
    assert any(torch.allclose(first_two[0], e, atol=1e-3) for e in expected), "the first slot's noise is not the stream"
    assert any(torch.allclose(first_two[1], e, atol=1e-3) for e in expected)
    assert not torch.allclose(first_two[0], first_two[1], atol=1e-3)  # two different slots (one per split)
    # Each published state lies on the same stream: k whole act() draws of randn(6, 2) after `start`.
    gen.set_state(start)
    reachable = {bytes(start.numpy())}
    for _ in range(2000):
        torch.randn(6, 2, generator=gen)
        reachable.add(bytes(gen.get_state().numpy()))
    published = [*published_during_run, runner.sampler_rng_state()]
    assert all(state is not None and state.dtype == torch.uint8 for state in published)
    assert all(bytes(state.numpy()) in reachable for state in published)
    assert not torch.equal(published[-1], start)  # it advanced: the state is read from the sampler, not echoed


def test_shared_rng_state_reads_only_complete_writes():
    shared = SharedRngState()
    assert shared.read() is None  # nothing published yet
    state = torch.Generator().manual_seed(5).get_state()
    shared.write(state)
    assert torch.equal(shared.read(), state) and int(shared.seq[0]) == 2
    shared.seq[0] = 3  # a writer stopped mid-copy: the reader gives up after its timeout instead of a torn state
    t0 = time.monotonic()
    assert shared.read(timeout_s=0.05) is None and time.monotonic() - t0 < 5.0


#: the start of the runner scripts below, run as their own processes
_SCRIPT_HEAD = """
import functools, json, math, os, signal, sys, time
import torch
from sample_fast.envs import make
from sample_fast.runner import Runner, RunnerConfig
from sample_fast.sampler import SamplerConfig

class Policy(torch.nn.Module):  # a minimal ActorCritic stand-in (self-contained: the child imports only this file)
    def __init__(self):
        super().__init__()
        self.mean = torch.nn.Parameter(torch.zeros(2))
    @torch.no_grad()
    def act(self, obs, deterministic=False):
        noise = torch.randn(obs.shape[0], 2)
        return self.mean + 0.1 * noise, (-0.5 * noise.square()).sum(-1), obs.sum(-1)
"""

_SIGTERM_SCRIPT = (
    _SCRIPT_HEAD
    + """
class Learner:
    def __init__(self, policy):
        self.policy, self.policy_version = policy, 0
    def train(self, batch):
        self.policy_version += 1
        time.sleep(0.01)
        return {}

class Hooks:
    def on_train(self, env_steps, metrics):
        if env_steps == 48:
            print("CHILD_PID", runner.process.pid, flush=True)
    def on_stop(self, env_steps, reason):
        print("ON_STOP", reason, runner.process.is_alive(), flush=True)

if __name__ == "__main__":
    cfg = SamplerConfig(rollout_len=8, num_splits=2, num_slots=4, seed=0)
    runner = Runner(functools.partial(make, "toy", 6), Policy, Learner, cfg, RunnerConfig(poll_s=0.05), mode="async",
                    hooks=Hooks())
    summary = runner.run(total_env_steps=10**9)
    print("SUMMARY", summary["reason"], flush=True)
"""
)


@pytest.mark.timeout(300)  # ~20 s on an idle machine; two fresh interpreters under heavy load take far longer
def test_sigterm_stops_a_runner_cleanly(tmp_path):
    before = shm_entries()
    script = tmp_path / "run_until_sigterm.py"
    script.write_text(_SIGTERM_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        child_pid = None
        deadline = time.monotonic() + 240
        while child_pid is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("CHILD_PID"):
                child_pid = int(line.split()[1])
        assert child_pid is not None, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, "".join(lines) + out
    assert "ON_STOP stop_requested True" in out and "SUMMARY stop_requested" in out
    assert not pid_alive(child_pid)
    assert _new_shm(before) == set()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_runner_takes_its_sampler_down(tmp_path):
    """kill -9 of the runner (the learner process): the sampler exits within seconds (PR_SET_PDEATHSIG, and its
    own check of the runner's pid), and multiprocessing's resource tracker unlinks the semaphores."""
    before = shm_entries()
    script = tmp_path / "run_until_killed.py"
    script.write_text(_SIGTERM_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    child_pid = None
    try:
        deadline = time.monotonic() + 240
        while child_pid is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("CHILD_PID"):
                child_pid = int(line.split()[1])
        assert child_pid is not None
        proc.kill()
        proc.wait(timeout=10)
        t0 = time.monotonic()
        # PR_SET_PDEATHSIG delivers SIGTERM at once (measured < 0.2 s); 30 s tolerates a loaded machine, and a
        # sampler that relied on noticing the dead parent by itself, or never exited, still fails.
        while pid_alive(child_pid) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert not pid_alive(child_pid), "the sampler outlived its runner by 30 s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert _new_shm(before) == set()


def _only_in_the_sampler_process() -> ToyEnv:
    if multiprocessing.parent_process() is None:
        raise AssertionError("an env was built in the main process")
    return toy_env(6)


@pytest.mark.timeout(90)
def test_async_runner_with_a_slot_shape_builds_envs_only_in_the_sampler_process():
    """``slot_shape`` (what ``wiring.probe_slot_shape`` gives the trainer) sizes the shared store: no split of envs
    (for MJX a compile) is built in the main process, and the slots are laid out as a real split's would be."""
    from sample_fast.wiring import SlotShape, build_store

    real = toy_env(6)
    shape = SlotShape(real.observation_spec, real.action_spec, real.num_envs, real.truncation_limit, real.device)
    reference = build_store(real, _cfg())
    real.close()
    hooks = RecordingHooks()
    runner = Runner(_only_in_the_sampler_process, VersionPolicy, CheckingLearner, _cfg(), _rcfg(), mode="async",
                    hooks=hooks, slot_shape=shape)  # fmt: skip
    hooks.runner = runner
    summary = runner.run(total_env_steps=48 * 4)
    assert summary["reason"] == "total_env_steps" and len(hooks.trains) == 4
    ours, theirs = runner.store.slot(0), reference.slot(0)
    assert sorted(ours.keys()) == sorted(theirs.keys())
    for key in theirs.keys():
        assert (ours[key].shape, ours[key].dtype) == (theirs[key].shape, theirs[key].dtype), key


# ----- learner scheduling (runner.learner_sched) ----------------------------------------------------------------------
def test_learner_sched_bad_values_name_the_fix(monkeypatch):
    with pytest.raises(ValueError, match=r"runner\.learner_sched must be one of normal, batch, idle, got 'nice'"):
        RunnerConfig(learner_sched="nice")
    with pytest.raises(ValueError, match=r"learner_sched=idle needs mode=async: .*use runner\.learner_sched=normal"):
        Runner(functools.partial(toy_env, 6), VersionPolicy, CheckingLearner, _cfg(), _rcfg(learner_sched="idle"),
               mode="serial")  # fmt: skip
    monkeypatch.delattr(os, "SCHED_IDLE")  # an OS without Linux's policies (macOS)
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ValueError, match=r"idle scheduling policy \(SCHED_IDLE\) needs Linux; this is darwin: use"):
        RunnerConfig(learner_sched="idle")
    assert RunnerConfig(learner_sched="normal").learner_sched == "normal"


_SCHED_SCRIPT = (
    _SCRIPT_HEAD
    + """
def recording_env(path, num_envs):  # built in each sampler process (and once here, the probe): who, at which policy
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {os.sched_getscheduler(0)}\\n")
    return make("toy", num_envs)

def thread_policies(skip):
    seen = set()
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in skip:
            try:
                seen.add(os.sched_getscheduler(int(tid)))
            except ProcessLookupError:
                pass
    return seen

class Learner:
    def __init__(self, policy):
        self.policy, self.policy_version, self.seen = policy, 0, set()
    def train(self, batch):
        self.policy_version += 1
        self.seen |= thread_policies({runner._spawner.native_id})  # every thread of this process but the spawner
        return {}

class Hooks:
    def __init__(self):
        self.trains, self.restarts = 0, []
    def on_train(self, env_steps, metrics):
        self.trains += 1
        if self.trains == 3:  # the replacement is started by the runner while the learner's threads are moved
            os.kill(runner.process.pid, signal.SIGKILL)
    def on_sampler_restart(self, env_steps, cause, restarts):
        self.restarts.append(restarts)

if __name__ == "__main__":
    out = {}
    for sched in sys.argv[2:]:
        path = f"{sys.argv[1]}.{sched}"
        hooks = Hooks()
        runner = Runner(functools.partial(recording_env, path, 6), Policy, Learner,
                        SamplerConfig(rollout_len=8, num_splits=2, num_slots=4, seed=0),
                        RunnerConfig(poll_s=0.05, learner_sched=sched), mode="async", hooks=hooks)
        summary = runner.run(total_env_steps=48 * 12)
        samplers = [tuple(map(int, line.split())) for line in open(path).read().split("\\n") if line]
        after = os.sched_getscheduler(0)
        try:  # what the runner's restore at shutdown could do
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            may_leave = True
        except PermissionError:
            may_leave = False
        out[sched] = {"reason": summary["reason"], "restarts": hooks.restarts, "learner": sorted(runner.learner.seen),
                      "samplers": [s for s in samplers if s[0] != os.getpid()], "after": after,
                      "may_leave": may_leave, "threads_after": sorted(thread_policies(set()))}
    print("RESULT", json.dumps(out), flush=True)
"""
)


@pytest.mark.timeout(300)  # two runs of a few seconds, each with a spawned replacement sampler
def test_learner_sched_moves_the_learner_and_keeps_every_sampler_normal(tmp_path):
    """runner.learner_sched=batch/idle: while training, every thread of the learner process (but the spawner) is at
    that policy; both sampler processes, the first and the replacement of a kill -9'd one, are born SCHED_OTHER (a
    child inherits its forking thread's policy, and none could leave SCHED_IDLE without CAP_SYS_NICE); afterwards
    batch is undone, and idle too unless the OS forbids leaving it. In a process of its own: idle may be one-way."""
    script = tmp_path / "sched.py"
    script.write_text(_SCHED_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "built"), "batch", "idle"], capture_output=True,
                          text=True, timeout=280)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    for sched, policy in (("batch", os.SCHED_BATCH), ("idle", os.SCHED_IDLE)):
        r = result[sched]
        assert r["reason"] == "total_env_steps" and r["restarts"] == [1]
        assert r["learner"] == [policy]
        pids = [pid for pid, _ in r["samplers"]]
        assert len(pids) == 4 and len(set(pids)) == 2  # 2 splits built by each of the 2 sampler processes
        assert {p for _, p in r["samplers"]} == {os.SCHED_OTHER}
    assert result["batch"]["after"] == os.SCHED_OTHER and result["batch"]["threads_after"] == [os.SCHED_OTHER]
    idle = result["idle"]
    # restored where allowed; left idle only where leaving idle is refused
    assert idle["after"] == (os.SCHED_OTHER if idle["may_leave"] else os.SCHED_IDLE)
