"""``python -m sample_fast.train env=<preset> [overrides]``: the training entry point (Hydra).

Owns the run directory (config, version, checkpoints, logs), resume/restart, signal handling and the hooks that
connect the ``Runner`` to checkpoints and logs. The order is strict: compose and ``resolve()`` the config first (an
invalid config exits with status 2 and a message before anything is written or started), then prepare the run
directory, then build the components through the ``Runner``. Components are built only in ``build_*`` functions
below (module level, so ``functools.partial`` of them pickles into the sampler process).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .config import ConfigError, EnvConfig, TrainConfig, resolve, run_dir

log = logging.getLogger("sample_fast.train")

CONFIG_PATH = "pkg://sample_fast.configs"
CONFIG_NAME = "train"
CHECKPOINT_DIR = "checkpoints"


# ----- component builders (picklable through functools.partial) -------------------------------------------------
def build_env(env_cfg: EnvConfig, num_envs: int, seed: int = 0):
    """``num_envs`` copies of the configured env (the runner calls it once per split, with num_envs / num_splits;
    each split is then reset with its own seed)."""
    from .envs import make

    options = dict(env_cfg.options)
    if env_cfg.backend == "mujoco" and env_cfg.num_threads:
        options.setdefault("num_threads", env_cfg.num_threads)
    return make(
        env_cfg.name,
        num_envs,
        backend=env_cfg.backend,
        device=env_cfg.device,
        seed=seed,
        **options,
    )


def on_cpu_simulator(env_cfg: EnvConfig) -> EnvConfig:
    """The same env on the CPU: an mjx config becomes the MuJoCo C one (same task definition, model options and
    specs), without its MJX-only options (precision, solver, xla_opt_level, ...), which the mujoco backend rejects."""
    cfg = EnvConfig(**{**asdict(env_cfg), "device": "cpu"})
    if env_cfg.backend == "mjx":
        from .envs.mujoco_env import BACKEND_OPTIONS
        from .envs.tasks import COMMON_OPTIONS, TASKS

        takes = {*COMMON_OPTIONS, *TASKS[env_cfg.name].options, *BACKEND_OPTIONS}
        cfg.backend = "mujoco"
        cfg.options = {k: v for k, v in env_cfg.options.items() if k in takes}
    return cfg


def probe_specs(env_cfg: EnvConfig) -> tuple[Any, Any]:
    """Observation and action specs, from a 1-env copy on the CPU simulator (``on_cpu_simulator``: MJX shares the
    task definition, so its specs are the same without paying for a JAX compile here)."""
    probe_cfg = on_cpu_simulator(env_cfg)
    probe_cfg.num_threads = 1
    env = build_env(probe_cfg, num_envs=1)
    try:
        return env.observation_spec, env.action_spec
    finally:
        env.close()


def build_policy(observation_spec, action_spec, policy_cfg):
    from .policy import ActorCritic

    # The initial weights come from the main process's RNG (seeded with run.seed); the sampler's copy is
    # overwritten from the ParamStore before it acts.
    return ActorCritic(observation_spec, action_spec, policy_cfg)


def build_learner(policy, learner_cfg, device: str, total_env_steps: int, resume_state: dict | None = None):
    """The learner, with policy weights, normaliser, optimizer, counters and RNG restored from ``resume_state``."""
    from .learner import Learner

    policy = policy.to(device)
    if resume_state is not None:
        policy.load_state_dict(resume_state["policy"])
    learner = Learner(policy, learner_cfg, torch.device(device), total_env_steps=total_env_steps)
    if resume_state is not None:
        learner.load_state_dict(resume_state["learner"])
        set_rng_state(resume_state["rng"])  # continue the random streams where the checkpoint left them
    return learner


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


def write_run_files(cfg: TrainConfig, rdir: str, resumed_from: int) -> None:
    """config.yaml (the resolved config) and meta.json (version, git revision, command line, start time)."""
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
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv,
            "host": platform.node(),
            "resumed_from_env_steps": resumed_from,
        }
    )
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


# ----- RNG --------------------------------------------------------------------------------------------------------
def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


# ----- hooks ------------------------------------------------------------------------------------------------------
class TrainHooks:
    """Runner hooks of a training run: logs every update, checkpoints every ``checkpoint_interval_s`` and on stop.

    Called in the main (learner) process; ``runner`` is attached after the Runner is built.
    """

    def __init__(self, cfg: TrainConfig, ckpt, logger, start_env_steps: int):
        self.cfg, self.ckpt, self.logger = cfg, ckpt, logger
        self.runner = None
        self.env_steps = start_env_steps
        self.last_saved_steps = start_env_steps
        self._last_ckpt_t = time.monotonic()
        self.stop_reason: str | None = None

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        self.env_steps = env_steps
        self.logger.add_train(env_steps, metrics)
        if time.monotonic() - self._last_ckpt_t >= self.cfg.run.checkpoint_interval_s:
            self.save(env_steps)

    def on_episodes(self, env_steps: int, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        self.logger.add_episodes(returns, lengths)

    def on_stop(self, env_steps: int, reason: str) -> None:
        self.env_steps, self.stop_reason = env_steps, reason
        if env_steps != self.last_saved_steps or not self.ckpt.checkpoints():
            self.save(env_steps)
        self.logger.close(env_steps)

    def save(self, env_steps: int) -> None:
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
        }
        self.ckpt.save(state, env_steps=int(env_steps), metric=None if math.isnan(ret) else ret)
        self.last_saved_steps = env_steps
        self._last_ckpt_t = time.monotonic()


# ----- signals ----------------------------------------------------------------------------------------------------
class StopOnSignals:
    """SIGINT/SIGTERM ask the runner to stop (its on_stop hook saves a final checkpoint). A second SIGINT, more than
    ``duplicate_s`` after the previous signal, falls back to Python's KeyboardInterrupt (``main`` turns it into exit
    status 130 without a traceback). A signal within ``duplicate_s`` of the previous one is the same interrupt
    delivered twice: ``timeout -s INT`` signals the command and then its whole process group, so the main process
    gets it twice within microseconds. Previous handlers are restored on exit."""

    def __init__(self, runner, duplicate_s: float = 0.5):
        self.runner = runner
        self.duplicate_s = duplicate_s
        self.received: list[str] = []
        self._last_t = 0.0
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.received and now - self._last_t < self.duplicate_s:
            return
        self.received.append(name)
        if signum == signal.SIGINT and len(self.received) > 1:
            raise KeyboardInterrupt
        self._last_t = now
        print(
            f"\n{name} received: stopping after the current step and saving a checkpoint "
            "(Ctrl-C again stops at once, without it)",
            file=sys.stderr,
        )
        self.runner.request_stop()

    def __enter__(self) -> StopOnSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


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
    cfg = resolve(cfg_in)
    rdir = run_dir(cfg)
    if os.path.exists(rdir) and not os.path.isdir(rdir):
        raise ConfigError(f"run directory {rdir} exists and is not a directory; set run.dir or run.name")
    if not cfg.restart and has_checkpoints(rdir):
        check_resumable(cfg, rdir)
    return cfg, rdir


def train(cfg_in: DictConfig | TrainConfig) -> dict:
    """Run training for ``cfg_in``. Returns the runner's summary plus ``run_dir``."""
    cfg, rdir = prepare(cfg_in)
    Runner = import_runner()
    from .logger import ProgressLogger

    if cfg.restart and os.path.exists(rdir) and os.listdir(rdir):
        print(f"restart=true: moved the previous run to {move_aside(rdir)}", file=sys.stderr)

    torch.set_num_threads(cfg.sampler.learner_threads)
    from .checkpoint import CheckpointManager

    ckpt = CheckpointManager(rdir, keep_last=cfg.run.keep_checkpoints)  # <rdir>/checkpoints
    latest = ckpt.load_latest()  # a corrupt newest file is skipped with a warning naming it
    resume_state = latest[0] if latest is not None else None
    if latest is None and has_checkpoints(rdir):
        raise RuntimeError(f"no readable checkpoint in {rdir}/{CHECKPOINT_DIR}; pass restart=true to start over")
    start_env_steps = int(resume_state["env_steps"]) if resume_state else 0
    start_wall_s = float(resume_state.get("wall_s", 0.0)) if resume_state else 0.0
    write_run_files(cfg, rdir, start_env_steps)
    if resume_state is not None:
        print(f"resuming {rdir} from {latest[1].name} (env step {start_env_steps})", file=sys.stderr)
    else:
        random.seed(cfg.run.seed)
        np.random.seed(cfg.run.seed)
        torch.manual_seed(cfg.run.seed)

    obs_spec, act_spec = probe_specs(cfg.env)
    # Wiring: the env and an acting policy copy are built wherever the sampler runs (a child process in async mode);
    # the learner and its policy are built here, in the main process, with the resumed state.
    env_fn = functools.partial(build_env, cfg.env, cfg.env.num_envs // cfg.sampler.num_splits)
    policy_fn = functools.partial(build_policy, obs_spec, act_spec, cfg.policy)
    # a resumed run resets its envs with fresh seeds rather than replaying the first episodes' initial states
    sampler_cfg = dataclasses.replace(cfg.sampler, seed=cfg.sampler.seed + start_env_steps)
    learner_fn = functools.partial(
        build_learner,
        learner_cfg=cfg.learner,
        device=cfg.run.device,
        total_env_steps=cfg.run.total_env_steps,
        resume_state=resume_state,
    )
    logger = ProgressLogger(rdir, cfg.logging, cfg.run.total_env_steps, start_env_steps, start_wall_s)
    hooks = TrainHooks(cfg, ckpt, logger, start_env_steps)
    if start_env_steps >= cfg.run.total_env_steps:
        logger.close(None)
        print(
            f"{rdir} already has {start_env_steps} >= run.total_env_steps={cfg.run.total_env_steps} env steps; "
            "raise run.total_env_steps to train further",
            file=sys.stderr,
        )
        return {"env_steps": start_env_steps, "run_dir": rdir}

    try:
        sampler_rng = resume_state.get("sampler_rng") if resume_state is not None else None
        runner = Runner(
            env_fn, policy_fn, learner_fn, sampler_cfg, mode=cfg.run.mode, hooks=hooks, sampler_rng_state=sampler_rng
        )
        hooks.runner = runner
        with StopOnSignals(runner):
            summary = runner.run(
                cfg.run.total_env_steps, time_limit_s=cfg.run.time_limit_s, start_env_steps=start_env_steps
            )
    finally:
        # no-op when on_stop already closed it; without a runner there is no new row to write
        logger.close(hooks.env_steps if hooks.runner is not None else None)
    summary = dict(summary or {})
    summary["run_dir"] = rdir
    print(
        f"done: {hooks.env_steps} env steps, mean return {logger.episode_return_mean():.2f}, run dir {rdir}",
        file=sys.stderr,
    )
    return summary


def _hydra_entry() -> None:
    import hydra

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)
    def _main(cfg: DictConfig) -> None:
        # Hydra's logging config is disabled (configs/train.yaml); warnings (e.g. a skipped corrupt checkpoint) go
        # to stderr in this plain format.
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        try:
            train(cfg)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:  # a second Ctrl-C: the runner has stopped its processes on the way out
            print(
                "interrupted: stopped without a final checkpoint; the checkpoints already saved are kept, and the "
                "same command resumes from the newest",
                file=sys.stderr,
            )
            sys.exit(130)

    _main()


def main() -> None:
    """Console entry point (``sample-fast-train``) and ``python -m sample_fast.train``."""
    _hydra_entry()


if __name__ == "__main__":
    main()
