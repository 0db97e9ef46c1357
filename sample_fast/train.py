"""``python -m sample_fast.train env=<preset> [overrides]``: the training entry point (Hydra).

Owns the run directory (config, version, checkpoints, logs), resume/restart, signal handling and the hooks that
connect the ``Runner`` to checkpoints and logs. The order is strict: compose and ``resolve()`` the config first (an
invalid config exits with status 2 and a message before anything is written or started), then prepare the run
directory, then build the components through the ``Runner``. Components are built only by ``sample_fast.wiring``
(module-level builders, so ``functools.partial`` of them pickles into the sampler process).
"""

# ruff: noqa: E402 -- the signal default below must precede the slow imports
from __future__ import annotations

import signal

if __name__ == "__main__":  # python -m sample_fast.train: until cli.main installs its handlers (after the imports
    # below, 1-3 s), a stop signal is only noted here; cli.main then exits at once with 128 + its number ("received
    # before training started"), rather than a KeyboardInterrupt traceback from inside `import torch`.
    EARLY_SIGNALS: list[int] = []
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, lambda signum, frame: EARLY_SIGNALS.append(signum))

import dataclasses
import datetime
import errno
import functools
import json
import logging
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from . import __version__, distributed
from .checkpoint import rng_state
from .config import ConfigError, TrainConfig, resolve, run_dir
from .wiring import build_env, build_learner, build_policy, check_store_fits, probe_slot_shape

log = logging.getLogger("sample_fast.train")

CONFIG_PATH = "pkg://sample_fast.configs"
CONFIG_NAME = "train"
CHECKPOINT_DIR = "checkpoints"


# ----- run directory ----------------------------------------------------------------------------------------------
def git_revision() -> str | None:
    """The source tree's git revision (with ``-dirty``), or None outside a git checkout."""
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(
            ["git", "-C", src, "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def has_checkpoints(rdir: str) -> bool:
    ckdir = os.path.join(rdir, CHECKPOINT_DIR)
    return os.path.isdir(ckdir) and any(not n.startswith(".") for n in os.listdir(ckdir))


def move_aside(rdir: str) -> str:
    """Rename an existing run dir to ``<dir>.old-<timestamp>`` (never deletes a run). Returns the new path."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dest = f"{rdir}.old-{stamp}"
    i = 1
    while os.path.exists(dest):
        dest = f"{rdir}.old-{stamp}-{i}"
        i += 1
    shutil.move(rdir, dest)
    return dest


def check_resumable(cfg: TrainConfig, rdir: str) -> None:
    """Refuse to resume a run dir trained on another env or policy architecture (its weights would not fit)."""
    path = os.path.join(rdir, "config.yaml")
    if not os.path.exists(path):
        return
    old = OmegaConf.load(path)
    for key, new in (("env.name", cfg.env.name), ("policy", OmegaConf.to_container(OmegaConf.structured(cfg.policy)))):
        prev = OmegaConf.select(old, key)
        prev = OmegaConf.to_container(prev) if OmegaConf.is_config(prev) else prev
        if prev is not None and prev != new:
            raise ConfigError(
                f"{rdir} holds a run with {key}={prev}, but this config has {key}={new}; resume it unchanged, "
                f"pick another run.name / run.dir, or pass restart=true to move the old run aside"
            )


def write_run_files(cfg: TrainConfig, rdir: str, resumed_from: int, extra: dict | None = None) -> None:
    """config.yaml (the resolved config) and meta.json (version, git revision, command line, start time; ``extra``
    joins this start's entry: the distributed group's size and per-rank seeds)."""
    os.makedirs(rdir, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(cfg), os.path.join(rdir, "config.yaml"))
    meta_path = os.path.join(rdir, "meta.json")
    meta: dict[str, Any] = {"starts": []}
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
    meta.update(
        version=__version__, git_revision=git_revision(), torch=torch.__version__, python=sys.version.split()[0]
    )
    meta.setdefault("starts", []).append(
        {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": sys.argv,
            "host": platform.node(),
            "resumed_from_env_steps": resumed_from,
            **(extra or {}),
        }
    )
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


# ----- hooks ------------------------------------------------------------------------------------------------------
class RunFailed(RuntimeError):
    """The run stopped itself after a failure it cannot train through (checkpoints that cannot be written, a learner
    that keeps rolling back): exit status 1. The message says what happened and what to change."""


def describe_os_error(e: OSError) -> str:
    """``[Errno 28] ENOSPC: No space left on device`` (the path is named by the caller)."""
    code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "?"
    return f"[Errno {e.errno}] {code}: {e.strerror or e}"


class TrainHooks:
    """Runner hooks of a training run: logs every update, checkpoints every ``checkpoint_interval_s`` and on stop.

    Called in the main (learner) process; ``runner`` is attached after the Runner is built. A failed save (read-only
    or full disk) is reported in one line and retried at the next interval; ``run.max_save_failures`` of them in a
    row, or more than ``run.max_rollbacks`` learner rollbacks in this start, stop the run (``fatal``, RunFailed).
    """

    def __init__(self, cfg: TrainConfig, ckpt, logger, start_env_steps: int, stopper=None, injector=None):
        self.cfg, self.ckpt, self.logger = cfg, ckpt, logger
        self.stopper = stopper
        self.injector = injector
        self.runner = None
        self.env_steps = start_env_steps
        self.last_saved_steps = start_env_steps
        self._last_ckpt_t = time.monotonic()
        self.stop_reason: str | None = None
        self.save_failures = 0  #: failed saves in a row
        self.fatal: str | None = None  #: why the run stopped itself (RunFailed)
        self.final_saved = False  #: on_stop's checkpoint is on disk (or the last save already was at its step)
        self.last_saved_path: str | None = None
        self._start_rollbacks: int | None = None

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        self.env_steps = env_steps
        self.logger.add_train(env_steps, metrics)
        self._check_rollbacks()
        if self.fatal is None and time.monotonic() - self._last_ckpt_t >= self.cfg.run.checkpoint_interval_s:
            self.save(env_steps)

    def on_episodes(self, env_steps: int, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        self.logger.add_episodes(returns, lengths)

    def on_sampler_restart(self, env_steps: int, cause: str, restarts: int) -> None:
        """The runner replaced a failed sampler process (it logged the cause): counted in progress.csv."""
        self.logger.add_sampler_restart()

    def on_stop(self, env_steps: int, reason: str) -> None:
        self.env_steps, self.stop_reason = env_steps, reason
        forced = self.stopper is not None and self.stopper.forced
        if forced:  # a second Ctrl-C: no new save, no plot; "stop at once"
            self.logger.close(env_steps, plot=False)
            return
        if self.save_failures >= self.cfg.run.max_save_failures:
            pass  # the saves keep failing: another try is only another warning (fatal already says so)
        elif env_steps != self.last_saved_steps or not self.ckpt.checkpoints():
            self.final_saved = self.save(env_steps)
            if not self.final_saved and self.fatal is None:
                self.fatal = (
                    f"the final checkpoint (env step {env_steps}) could not be written (see the warning above); "
                    f"{self._newest_on_disk()}"
                )
        else:
            self.final_saved = True
            if self.last_saved_path is None:  # nothing saved in this start: the state is the resumed checkpoint
                self.last_saved_path = str(self.ckpt.checkpoints()[-1])
        self.logger.close(env_steps)
        if self.stopper is not None:
            self.stopper.interruptible = False  # what is left is the bounded shutdown: a Ctrl-C must not cut it

    def on_stop_without_save(self, env_steps: int) -> None:
        """distributed: a collective failed, so the group is broken mid-update: no final checkpoint (torchrun's
        restart resumes from the last one)."""
        self.env_steps = env_steps
        self.logger.close(env_steps)

    def _check_rollbacks(self) -> None:
        rollbacks = getattr(self.runner.learner, "rollbacks", None) if self.runner is not None else None
        if rollbacks is None or self.fatal is not None:
            return
        if self._start_rollbacks is None:  # the learner's counter is cumulative (restored on resume)
            self._start_rollbacks = int(rollbacks)
        taken = int(rollbacks) - self._start_rollbacks
        limit = self.cfg.run.max_rollbacks
        if taken > limit:
            lr = self.cfg.learner.lr
            self.fatal = (
                f"the learner rolled back {taken} times in this run (more than run.max_rollbacks={limit}): its loss "
                f"keeps turning non-finite. Lower learner.lr (now {lr:g}; try learner.lr={lr / 10:g}), tighten "
                f"learner.max_grad_norm (now {self.cfg.learner.max_grad_norm}), or check the env's rewards and "
                "observations for NaN/inf; the checkpoints hold the last good weights"
            )
            self.runner.request_stop()

    def _newest_on_disk(self) -> str:
        files = self.ckpt.checkpoints()
        if not files:
            return "no checkpoint was written yet, so the same command starts over"
        return f"the newest checkpoint on disk is {files[-1]}, and the same command resumes from it"

    def interrupted_message(self) -> str:
        """The truthful line for a second Ctrl-C."""
        if self.final_saved:
            return (
                f"interrupted (second Ctrl-C) after the final checkpoint was written ({self.last_saved_path}, env step "
                f"{self.last_saved_steps}); the same command resumes from it"
            )
        return f"interrupted (second Ctrl-C): stopped at once, without the final checkpoint; {self._newest_on_disk()}"

    def save(self, env_steps: int) -> bool:
        """Write a checkpoint; False (one warning line, counted) if the file system refused it."""
        learner, policy = self.runner.learner, self.runner.policy
        ret = self.logger.episode_return_mean()
        state = {
            "env_steps": int(env_steps),
            "wall_s": self.logger.wall_s,
            "policy": policy.state_dict(),
            "learner": learner.state_dict(),
            "rng": rng_state(),
            # the sampler's action-noise stream: its own process in async mode (serial: the same as rng["torch"])
            "sampler_rng": self.runner.sampler_rng_state(),
            "episode_return_mean": ret,
            "logger": self.logger.state_dict(),  # episode/update counts and the return window continue on resume
        }
        self._last_ckpt_t = time.monotonic()  # a failed save is retried at the next interval, not at every update
        error = self.injector.save_error(self.ckpt.dir) if self.injector else None
        t0 = time.perf_counter()
        try:
            path = self.ckpt.save(
                state, env_steps=int(env_steps), metric=None if math.isnan(ret) else ret, inject_error=error
            )
        except OSError as e:
            self.save_failures += 1
            limit = self.cfg.run.max_save_failures
            log.warning(
                "checkpoint: could not write %s: %s; the checkpoints already saved are kept; %s",
                e.filename or self.ckpt.dir, describe_os_error(e),
                f"failure {self.save_failures} of run.max_save_failures={limit} in a row, retrying in "
                f"{self.cfg.run.checkpoint_interval_s:g} s" if self.save_failures < limit else "stopping the run",
            )  # fmt: skip
            if self.save_failures >= limit and self.fatal is None:
                self.fatal = (
                    f"{self.save_failures} checkpoint saves in a row failed (run.max_save_failures={limit}); "
                    f"free space in {self.ckpt.dir} or make it writable (or set run.dir elsewhere); "
                    f"{self._newest_on_disk()}"
                )
                self.runner.request_stop()
            return False
        # PERF: the save stalls training for this long (Ant's default sizes: see docs/training.md, "Checkpoints")
        self.logger.set_gauge("checkpoint_s", time.perf_counter() - t0)
        self.save_failures = 0
        self.last_saved_steps, self.last_saved_path = env_steps, str(path)
        return True


# ----- signals ----------------------------------------------------------------------------------------------------
class StopOnSignals:
    """SIGINT, SIGTERM and SIGHUP ask the runner to stop (its on_stop hook saves a final checkpoint); the exit status
    is then 128 + the first signal's number (130, 143, 129). A second SIGINT, more than ``duplicate_s`` after the
    previous signal, raises KeyboardInterrupt (a stop at once, exit status 130) unless the final checkpoint is
    already written (``interruptible`` False: the bounded shutdown is left to finish). Repeated SIGTERM/SIGHUP only
    ask again. A signal within ``duplicate_s`` of the previous one is the same stop delivered twice: ``timeout -s
    INT`` and ``kill -- -PGID`` reach the main process both directly and through its group. A SIGHUP (the terminal
    is gone) points stdout/stderr that are a terminal at /dev/null, so later writes cannot fail.

    ``install()`` before the runner exists (a signal then is remembered, and ``attach`` passes it on); previous
    handlers are restored by ``uninstall()``. Also a context manager (``with StopOnSignals(runner):``)."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self, runner=None, duplicate_s: float = 0.5):
        self.runner = runner
        self.duplicate_s = duplicate_s
        self.received: list[str] = []
        self.forced = False
        self.interruptible = True
        self._last_t = 0.0
        self._old: dict[int, Any] = {}

    def attach(self, runner) -> None:
        self.runner = runner
        if self.received:
            runner.request_stop()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.received and now - self._last_t < self.duplicate_s:
            return
        self._last_t = now
        self.received.append(name)
        if signum == getattr(signal, "SIGHUP", None):
            _detach_from_terminal()
        if len(self.received) > 1:
            if signum == signal.SIGINT and self.interruptible and not self.forced:
                self.forced = True
                raise KeyboardInterrupt
            if self.runner is not None:
                self.runner.request_stop()
            _say(f"{name} received: already stopping" + ("" if self.interruptible else " (final checkpoint written)"))
            return
        _say(
            f"\n{name} received: stopping after the current step and saving a checkpoint "
            "(Ctrl-C again stops at once, without it)"
        )
        if self.runner is not None:
            self.runner.request_stop()

    def install(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def __enter__(self) -> StopOnSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # the terminal is gone
        pass


def _detach_from_terminal() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in (1, 2):
            try:
                if os.isatty(fd):
                    os.dup2(devnull, fd)
            except OSError:
                pass
    finally:
        os.close(devnull)


def import_runner():
    """The Runner class, or a clear error naming the component that is missing from this install."""
    missing = []
    for module in ("runner", "sampler", "learner", "policy", "checkpoint"):
        try:
            __import__(f"sample_fast.{module}")
        except ImportError as e:
            missing.append(f"sample_fast.{module} ({e})")
    if missing:
        raise RuntimeError("training needs components that did not import: " + "; ".join(missing))
    from .runner import Runner

    return Runner


# ----- the run ----------------------------------------------------------------------------------------------------
def prepare(cfg_in: DictConfig | TrainConfig) -> tuple[TrainConfig, str]:
    """Resolve the config and check the run dir against it. Raises ConfigError; writes nothing."""
    from .cli import check_known_keys, check_ranges
    from .inject import parse_faults

    if isinstance(cfg_in, DictConfig):
        check_known_keys(cfg_in)  # a `+key=...` typo Hydra accepted
    cfg = resolve(cfg_in)
    check_ranges(cfg)
    if cfg.run.max_save_failures < 1:
        raise ConfigError(f"run.max_save_failures={cfg.run.max_save_failures} must be >= 1 (1: stop at the first)")
    if cfg.run.max_rollbacks < 0:
        raise ConfigError(f"run.max_rollbacks={cfg.run.max_rollbacks} must be >= 0 (0: stop at the first rollback)")
    faults = parse_faults(cfg.debug.inject)
    if cfg.run.mode == "serial" and any(f.name == "sampler_crash" for f in faults):
        raise ConfigError(
            "debug.inject=sampler_crash needs run.mode=async: serial mode has no sampler process to crash "
            "(its sampler runs in the main process)"
        )
    rdir = run_dir(cfg)
    if os.path.exists(rdir) and not os.path.isdir(rdir):
        raise ConfigError(f"run directory {rdir} exists and is not a directory; set run.dir or run.name")
    if not cfg.restart and has_checkpoints(rdir):
        check_resumable(cfg, rdir)
    return cfg, rdir


def train(cfg_in: DictConfig | TrainConfig, stopper: StopOnSignals | None = None) -> dict:
    """Run training for ``cfg_in``. Returns the runner's summary plus ``run_dir``, ``stop_signal`` (the signal that
    stopped it, or None) and ``final_checkpoint``. Raises ConfigError, RunFailed (the run stopped itself: see
    TrainHooks) or KeyboardInterrupt (a second Ctrl-C; its ``message`` says whether the final checkpoint is on disk).

    ``stopper``: the signal handlers ``cli.main`` installed before composing the config; None installs them here,
    for the duration of the call."""
    if stopper is None:
        with StopOnSignals() as own:
            return train(cfg_in, stopper=own)
    cfg, rdir = prepare(cfg_in)
    if cfg.distributed.mode == "ddp":  # a torchrun worker (resolve checked): join the group, leave it at the end
        from .distributed import setup

        sync = setup(cfg.distributed, cfg.run.device)
        try:
            return _train(cfg, rdir, stopper, sync)
        finally:
            sync.close()
    return _train(cfg, rdir, stopper, None)


def _train(cfg: TrainConfig, rdir: str, stopper: StopOnSignals, sync: Any) -> dict:
    """``train`` after the config is resolved; ``sync``: the distributed group (None: one process). Only the writer
    (rank 0) touches the run directory; the other ranks take its resume state by broadcast. The steps: open the run
    directory and find the resume state, record the start (run files, seeds), wire the components, run, report."""
    from .inject import Injector, parse_faults

    writer = sync is None or sync.rank == 0
    injector = Injector(parse_faults(cfg.debug.inject))
    if injector:
        log.warning("debug.inject=%s: these faults will be injected into this run", cfg.debug.inject)
    Runner = import_runner()
    ckpt, latest = _open_run_dir(cfg, rdir) if writer else (None, None)
    torch.set_num_threads(cfg.runner.learner_threads)
    resume_state = latest[0] if latest is not None else None
    if sync is not None:  # rank 0's resume state (or None) on every rank: the run dir need not be shared
        resume_state = sync.broadcast_object(resume_state)
    start_env_steps = int(resume_state["env_steps"]) if resume_state else 0
    _record_start(cfg, rdir, sync, resume_state, start_env_steps, latest)
    wiring = _wire(cfg, sync, resume_state, start_env_steps)
    logger, hooks = _progress(cfg, rdir, ckpt, sync, resume_state, start_env_steps, stopper, injector)
    dist_hooks = distributed.DistHooks(hooks, sync, start_env_steps, cfg.run.time_limit_s) if sync else None
    summary: dict = {"env_steps": start_env_steps, "reason": "stop_requested"}
    if start_env_steps >= cfg.run.total_env_steps:
        logger.close(None)
        print(
            f"{rdir} already has {start_env_steps} >= run.total_env_steps={cfg.run.total_env_steps} env steps; "
            "raise run.total_env_steps to train further",
            file=sys.stderr,
        )
        return {"env_steps": start_env_steps, "run_dir": rdir, "reason": "total_env_steps", "stop_signal": None}
    if stopper.received and sync is None:  # a signal during start-up (config, resume, spec probe): nothing started
        # (distributed: the ranks agree on the stop after their first update instead)
        logger.close(None)
        _say(f"{stopper.received[0]} received before training started: nothing to save")
        return {**summary, "run_dir": rdir, "stop_signal": stopper.received[0], "final_checkpoint": None}
    summary = _run(
        cfg, Runner, wiring, sync, resume_state, start_env_steps, logger, hooks, dist_hooks, stopper, injector
    )
    summary.update(run_dir=rdir, final_checkpoint=hooks.last_saved_path if hooks.final_saved else None)
    summary["stop_signal"] = (
        stopper.received[0] if summary.get("reason") == "stop_requested" and stopper.received else None
    )
    if hooks.fatal is not None:
        raise RunFailed(hooks.fatal)
    if writer:
        _report(summary, hooks, logger, rdir)
    return summary


def _open_run_dir(cfg: TrainConfig, rdir: str) -> tuple[Any, Any]:
    """The writer's checkpoint manager for ``rdir`` (moving an old run aside with ``restart``) and the newest intact
    checkpoint ``(state, path)`` to resume from, or None. RunFailed where the directory cannot be written, or where
    it holds checkpoints but none is intact."""
    from .checkpoint import CheckpointManager

    try:
        if cfg.restart and os.path.exists(rdir) and os.listdir(rdir):
            print(f"restart=true: moved the previous run to {move_aside(rdir)}", file=sys.stderr)
        ckpt = CheckpointManager(rdir, keep_last=cfg.run.keep_checkpoints)  # <rdir>/checkpoints
    except OSError as e:
        raise RunFailed(f"cannot prepare the run directory {e.filename or rdir}: {describe_os_error(e)}; "
                        "pick a writable run.dir") from None  # fmt: skip
    # the newest intact state, best.pt included; a corrupt file is renamed aside (*.corrupt) with a warning
    latest = ckpt.load_resume()
    if latest is None and (ckpt.checkpoints() or ckpt.corrupt_files()):
        raise RunFailed(
            f"no intact checkpoint in {ckpt.dir} (the unreadable ones are renamed *.corrupt); pass restart=true "
            "to start over (the old run is moved aside)"
        )
    return ckpt, latest


def _record_start(
    cfg: TrainConfig, rdir: str, sync: Any, resume_state: dict | None, start_env_steps: int, latest: Any
) -> None:  # fmt: skip
    """The writer's run files (config.yaml, meta.json with each rank's seeds), then the seeds, except on a resuming
    writer (it restores its RNGs from the checkpoint)."""
    writer = sync is None or sync.rank == 0
    if writer:
        extra = None
        if sync is not None:  # what each rank seeds (rank r computes the same from run.seed and its rank)
            extra = {"distributed": {
                "world_size": sync.world_size, "backend": sync.backend,
                "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                "rank_seeds": [distributed.rank_seed(_learner_seed(cfg, start_env_steps, resume_state), r)
                               for r in range(sync.world_size)],
                "sampler_seeds": [_sampler_seed(cfg, r, start_env_steps) for r in range(sync.world_size)],
            }}  # fmt: skip
        try:
            write_run_files(cfg, rdir, start_env_steps, extra)
        except OSError as e:
            where = e.filename or rdir
            raise RunFailed(f"cannot write {where}: {describe_os_error(e)}; pick a writable run.dir") from None
    if resume_state is not None and writer:
        print(f"resuming {rdir} from {latest[1].name} (env step {start_env_steps})", file=sys.stderr)
    else:
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)


def _sampler_seed(cfg: TrainConfig, rank: int, start_env_steps: int) -> int:
    """Rank ``rank``'s sampler seed (split i resets with it + i). A resumed run resets its envs with fresh seeds
    rather than replaying the first episodes' initial states. meta.json records the same for every rank."""
    return distributed.rank_seed(cfg.sampler.seed, rank) + start_env_steps


def _learner_seed(cfg: TrainConfig, start_env_steps: int, resume_state: dict | None) -> int:
    """The seed ``distributed.attach_learner`` gives each rank (through ``rank_seed``): fresh after a resume."""
    return cfg.run.seed + start_env_steps * bool(resume_state)


class _Wiring(NamedTuple):
    """What the Runner is built from (``_wire``)."""

    env_fn: Any
    policy_fn: Any
    learner_fn: Any
    sampler_cfg: Any
    slot_shape: Any


def _wire(cfg: TrainConfig, sync: Any, resume_state: dict | None, start_env_steps: int) -> _Wiring:
    """The component factories (``sample_fast.wiring``): the env and an acting policy copy are built wherever the
    sampler runs (a child process in async mode); the learner and its policy in this process, with the resumed
    state. One 1-env CPU probe gives the specs and slot sizes; in async mode the shared slots must fit in /dev/shm
    (RunFailed naming the fix, before any component or process exists)."""
    from .trajectory_store import SharedMemoryTooSmall

    per_split = cfg.env.num_envs // cfg.sampler.num_splits
    slot_shape = probe_slot_shape(cfg.env, per_split)  # one 1-env CPU probe: the specs and the slot sizes
    obs_spec, act_spec = slot_shape.observation_spec, slot_shape.action_spec
    if cfg.run.mode == "async":  # the shared slots must fit in /dev/shm (docker's default: 64 MiB): said now
        try:  # (a recurrent policy's state keys, a few KB, are left out: inside the check's 10% margin)
            check_store_fits(slot_shape, cfg.sampler)
        except SharedMemoryTooSmall as e:
            raise RunFailed(str(e)) from None
    env_fn = functools.partial(build_env, cfg.env, per_split)
    policy_fn = functools.partial(build_policy, obs_spec, act_spec, cfg.policy)
    sampler_seed = _sampler_seed(cfg, sync.rank if sync is not None else 0, start_env_steps)
    sampler_cfg = dataclasses.replace(cfg.sampler, seed=sampler_seed)
    learner_fn = functools.partial(
        build_learner,
        learner_cfg=cfg.learner,
        device=cfg.run.device,
        total_env_steps=cfg.run.total_env_steps,
        resume_state=resume_state,
        replay_cfg=cfg.replay,
    )
    if sync is not None:  # rank 0's weights on every rank, the collectives in the learner, per-rank seeds
        inner_fn, seed = learner_fn, _learner_seed(cfg, start_env_steps, resume_state)
        learner_fn = lambda policy: distributed.attach_learner(sync, inner_fn(policy), seed, resume_state is not None)  # noqa: E731
    return _Wiring(env_fn, policy_fn, learner_fn, sampler_cfg, slot_shape)


def _progress(
    cfg: TrainConfig, rdir: str, ckpt: Any, sync: Any, resume_state: dict | None, start_env_steps: int,
    stopper: StopOnSignals, injector: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """The writer's progress logger and hooks (checkpoints, stop handling); ranks > 0 write nothing."""
    from .logger import ProgressLogger

    if sync is not None and sync.rank > 0:
        return distributed.NullLogger(), distributed.FollowerHooks(start_env_steps)
    start_wall_s = float(resume_state.get("wall_s", 0.0)) if resume_state else 0.0
    logger = ProgressLogger(
        rdir, cfg.logging, cfg.run.total_env_steps, start_env_steps, start_wall_s,
        start_state=resume_state.get("logger") if resume_state else None,
    )  # fmt: skip
    return logger, TrainHooks(cfg, ckpt, logger, start_env_steps, stopper=stopper, injector=injector)


def _run(
    cfg: TrainConfig, Runner: Any, wiring: _Wiring, sync: Any, resume_state: dict | None, start_env_steps: int,
    logger: Any, hooks: Any, dist_hooks: Any, stopper: StopOnSignals, injector: Any,
) -> dict:  # fmt: skip
    """Build the Runner and run it; its summary. A second Ctrl-C, or a sampler that could not be replaced, comes out
    as KeyboardInterrupt / RunFailed with what is on disk; the logger is closed on every way out."""
    from .runner import SamplerError

    try:
        sampler_rng = resume_state.get("sampler_rng") if resume_state is not None else None
        if sync is not None and sync.rank > 0:
            sampler_rng = None  # rank 0's action-noise stream is rank 0's: this rank draws its own
        runner = Runner(
            wiring.env_fn, wiring.policy_fn, wiring.learner_fn, wiring.sampler_cfg, cfg.runner, mode=cfg.run.mode,
            hooks=dist_hooks or hooks, sampler_rng_state=sampler_rng, sampler_hook=injector.sampler_hook(),
            slot_shape=wiring.slot_shape,
        )  # fmt: skip
        # distributed: the stopper and the hooks ask through the proxy, so that every rank stops after one update
        hooks.runner = dist_hooks.proxy(runner) if dist_hooks else runner
        hooks._start_rollbacks = int(getattr(runner.learner, "rollbacks", 0))  # cumulative: restored on resume
        injector.wrap_learner(runner.learner)
        stopper.attach(hooks.runner)  # a signal that came during start-up stops it at once (after a final checkpoint)
        if dist_hooks is None:
            summary = runner.run(
                cfg.run.total_env_steps, time_limit_s=cfg.run.time_limit_s, start_env_steps=start_env_steps
            )
        else:  # per-rank env steps; the time limit is rank 0's, taken through the end-of-update exchange
            summary = runner.run(dist_hooks.local_target(cfg.run.total_env_steps), time_limit_s=None)
            summary = distributed.global_summary(summary, dist_hooks)
    except KeyboardInterrupt:
        interrupted = KeyboardInterrupt()
        interrupted.message = hooks.interrupted_message()
        raise interrupted from None
    except SamplerError as e:  # a sampler that could not be (or was too often) replaced: the final checkpoint is on
        # disk (on_stop ran); one message, with the sampler's own traceback or stacks where it had them, no ours
        saved = f"final checkpoint {hooks.last_saved_path} written" if hooks.final_saved else hooks._newest_on_disk()
        raise RunFailed(f"{e}\n({saved}; the same command resumes)") from None
    finally:
        # no-op when on_stop already closed it; without a runner there is no new row to write
        logger.close(hooks.env_steps if hooks.runner is not None else None, plot=not stopper.forced)
        stopper.runner = None
    return dict(summary or {})


def _report(summary: dict, hooks: Any, logger: Any, rdir: str) -> None:
    """The writer's last line: how the run ended, the mean return, and how to go on."""
    ret = logger.episode_return_mean()
    if summary["stop_signal"]:
        from .cli import exit_status_for_signal

        name = summary["stop_signal"]
        _say(
            f"stopped by {name} at env step {hooks.env_steps}: final checkpoint {hooks.last_saved_path} written, mean "
            f"return {ret:.2f}; the same command resumes from it (exit status {exit_status_for_signal(name)})"
        )
    else:
        _say(f"done: {hooks.env_steps} env steps, mean return {ret:.2f}, run dir {rdir}")


def main() -> None:
    """Console entry point (``sample-fast-train``) and ``python -m sample_fast.train``: see ``sample_fast.cli``.

    When the run is over (its last line printed, its exit status decided) the process ignores the stop signals: one
    that arrived while the interpreter shuts down (Python restores the default actions then) killed it instead, and
    a double Ctrl-C 1-2 s apart ended with "killed by SIGINT" rather than its exit status 130 (the fault suite)."""
    from .cli import main as cli_main

    try:
        cli_main()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":
    main()
