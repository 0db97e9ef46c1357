"""Structured training configs: the schema behind ``configs/*.yaml`` and the one place sizes are derived.

Owns the root ``TrainConfig`` (registered in Hydra's ConfigStore as ``train_schema``), the trainer's own sections
(``EnvConfig``, ``RunConfig``, ``LogConfig``) and ``resolve()``, which fills every ``auto`` value for the machine it
runs on (backend, device, mode, num_envs, threads) and rejects inconsistent settings with a ``ConfigError`` that says
what to change -- before any process starts or any file is written. Component sections (``PolicyConfig``,
``LearnerConfig``, ``ReplayConfig``, ``SamplerConfig``, ``RunnerConfig``) are defined by their components and
only composed here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from .distributed import DistributedConfig
from .envs.atari import is_atari_name
from .learner import LearnerConfig
from .policy import PolicyConfig
from .replay_config import ReplayConfig
from .runner import RunnerConfig
from .sampler import SamplerConfig

__all__ = [
    "ConfigError",
    "EnvConfig",
    "RunConfig",
    "LogConfig",
    "DebugConfig",
    "TrainConfig",
    "resolve",
    "to_train_config",
    "batch_size",
    "run_dir",
    "cpu_cores",
    "register_configs",
]

ALGOS = ("appo",)
MODES = ("auto", "serial", "async")
PROGRESS = ("auto", "rich", "plain", "off")


_NAME_NOT_SET = (
    "env.name is not set; pick a preset with env=<name>, or with env=atari a game: env.name=<Game>-v5 "
    "(e.g. env=atari env.name=SpaceInvaders-v5)"
)


class ConfigError(ValueError):
    """An invalid or inconsistent training config. The message names the field and says what to change."""


@dataclass
class EnvConfig:
    """Which environment, how many copies, and where it simulates."""

    #: a task (ant, halfcheetah, hopper, walker2d, humanoid), toy, gymnasium:<id>, gymnasium:<module>:<id>, or an
    #: Atari game <Game>-v5 (Pong-v5, Breakout-v5, SpaceInvaders-v5, ...)
    name: str = MISSING
    #: auto (MuJoCo tasks: mujoco on CPU; with CUDA warp when it imports, else mjx; Atari: envpool if installed,
    #: else ale), mujoco, mjx, warp, envpool, ale, gymnasium, toy
    backend: str = "auto"
    #: where env tensors live: auto (cuda for mjx/warp when available, else cpu), cpu, cuda[:i]
    device: str = "auto"
    num_envs: int = 0  #: parallel envs in total; 0 = fitted to the machine (see resolve)
    num_threads: int = 0  #: simulator threads (mujoco backend); 0 = fitted to the cores
    #: task and backend options, e.g. {max_episode_steps: 500}; checked by the backend's own check_options in resolve
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunConfig:
    """One training run: its directory, length, mode, seed and checkpoints."""

    name: str = "default"  #: run name; the run directory is runs/<env.name>/<name> unless run.dir is set
    dir: str | None = None  #: run directory (overrides runs/<env>/<name>); resumes when it holds checkpoints
    #: stop after this many env steps (agent actions, all envs together); a float so 1e6 works on the command line
    total_env_steps: float = 10_000_000
    time_limit_s: float | None = None  #: also stop after this many seconds of training (None: no limit)
    mode: str = "auto"  #: auto (async on CPU, serial when the simulator is on the GPU), serial, async
    seed: int = 0  #: seeds envs, policy init and the learner
    device: str = "auto"  #: learner/policy device: auto (cuda when available), cpu, cuda[:i]
    checkpoint_interval_s: float = 300.0  #: seconds between checkpoints (one is always written at the end)
    keep_checkpoints: int = 3  #: newest checkpoints kept (the best one is kept besides)
    #: checkpoint saves that may fail in a row (read-only or full disk) before the run stops with exit status 1
    max_save_failures: int = 3
    #: learner rollbacks (after repeated non-finite losses) this run may take before it stops with exit status 1
    max_rollbacks: int = 5


@dataclass
class LogConfig:
    """Terminal progress, TensorBoard, progress.csv and the learning-curve plot."""

    progress: str = "auto"  #: auto (rich on a TTY, plain lines otherwise), rich, plain, off
    interval_s: float = 5.0  #: seconds between progress rows (terminal line, CSV row, TensorBoard scalars)
    return_window: int = 100  #: finished episodes averaged into episode_return_mean
    tensorboard: bool = True  #: write TensorBoard event files under <run_dir>/tb
    csv: bool = True  #: write <run_dir>/progress.csv
    plot: bool = True  #: write <run_dir>/learning_curve.png at the end


@dataclass
class DebugConfig:
    """Fault injection, to rehearse recovery in a real run (docs/training.md, "Rehearsing faults"). Off by default."""

    #: comma-separated faults, each <fault>@<counter>:<n>, e.g. nonfinite_loss@update:20 or save_error@save:1;
    #: empty: none (an unknown fault or counter is a config error)
    inject: str = ""


@dataclass
class TrainConfig:
    """Root config of ``python -m sample_fast.train``. Groups: env, algo, sampler, runner, replay, logging,
    distributed."""

    algo: str = "appo"  #: the algorithm (APPO with V-trace targets); the algo group sets learner/policy values
    restart: bool = False  #: start over in an existing run dir (the old one is moved aside, never deleted)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    #: prioritized trajectory replay (sample_fast.replay, docs/replay.md); off unless replay.ratio > 0
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LogConfig = field(default_factory=LogConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


def register_configs() -> None:
    """Register the schema so ``configs/train.yaml`` can list ``train_schema`` first in its defaults."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


register_configs()


# ----- helpers ---------------------------------------------------------------------------------------------------
def default_learner_threads(env_name: str, learner_device: str, num_cores: int) -> int:
    """``runner.learner_threads=0`` fitted to ``num_cores`` (the trainer's ``resolve`` and the FPS suite's train
    stage). An Atari game with the learner on the CPU: every core, since the CNN learner, not the emulator, sets the
    pace (FPS suite, Pong at 32 envs on 2 cores: 511 env steps/s with 2 learner threads against 337 with 1,
    benchmarks/results/atari_learner_threads/README.md). Otherwise half the cores: torch's OpenMP pool degrades
    badly when it shares cores with the simulator threads or other jobs (on Ant 2 learner threads train 28% slower
    than 1, benchmarks/results/levers_cpu.md)."""
    if is_atari_name(env_name) and torch.device(learner_device).type != "cuda":
        return num_cores
    return max(1, num_cores // 2)


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """A composed DictConfig as the ``TrainConfig`` object (dataclass instances all the way down)."""
    if isinstance(cfg, TrainConfig):
        return cfg
    try:
        obj = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:  # a ??? left in a preset: env=atari's env.name
        if e.full_key == "env.name":
            raise ConfigError(_NAME_NOT_SET) from None
        raise ConfigError(f"{e.full_key} is not set; set it with {e.full_key}=<value>") from None
    except (ValueError, TypeError) as e:  # a component's __post_init__ rejecting a value
        raise ConfigError(str(e)) from e
    if not isinstance(obj, TrainConfig):
        raise ConfigError(f"expected a TrainConfig, got {type(obj).__name__}; compose with configs/train.yaml")
    return obj


def batch_size(cfg: TrainConfig) -> int:
    """Env steps in one learner batch: rollout_len x the envs of one split (one TrajectoryStore slot)."""
    return cfg.sampler.rollout_len * (cfg.env.num_envs // max(1, cfg.sampler.num_splits))


def run_dir(cfg: TrainConfig) -> str:
    """The run directory: ``run.dir`` if set, else ``runs/<env.name>/<run.name>`` (relative to the cwd)."""
    if cfg.run.dir:
        return os.path.abspath(os.path.expanduser(cfg.run.dir))
    env_part = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name)
    return os.path.abspath(os.path.join("runs", env_part, cfg.run.name))


def _round_up(n: int, k: int) -> int:
    return int(math.ceil(n / k) * k)


def _check_device(key: str, value: str, cuda: bool) -> None:
    if value == "auto":
        return
    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{key}={value!r} is not a device; use auto, cpu or cuda[:index]") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"{key}={value!r}: only cpu and cuda are supported; use auto, cpu or cuda[:index]")
    if dev.type == "cuda" and not cuda:
        raise ConfigError(f"{key}={value!r} but torch sees no CUDA device; use {key}=cpu (or auto)")


def _positive(key: str, value: Any, allow_zero: bool = False, integer: bool = True) -> None:
    kind = int if integer else (int, float)
    ok = isinstance(value, kind) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        what = "a non-negative" if allow_zero else "a positive"
        extra = " (0 = fitted to the machine)" if allow_zero else ""
        raise ConfigError(f"{key}={value!r} must be {what} {'int' if integer else 'number'}{extra}")


def _check_env(env: EnvConfig, cuda: bool) -> tuple[str, str]:
    """Validate name/backend/options without building an env; return (backend, device) resolved.

    The options are checked by the chosen backend's own check (``sample_fast.envs.check_options``, which its
    constructor calls too), so a config is rejected here for exactly what ``make()`` would reject later.
    """
    from .envs import BACKENDS, TASKS, EnvError, OptionError, UnknownOptionError, check_options, resolve_backend
    from .envs.atari import is_atari_name, rom_id

    known = ", ".join([*sorted(TASKS), "toy", "gymnasium:<id>", "gymnasium:<module>:<id>", "<Game>-v5 (Atari)"])
    if not env.name or env.name == MISSING:
        raise ConfigError(f"{_NAME_NOT_SET} ({known})")
    atari = is_atari_name(env.name)
    if env.name not in TASKS and env.name != "toy" and not env.name.startswith("gymnasium:") and not atari:
        raise ConfigError(f"env.name={env.name!r} is unknown; use env=<preset> or env.name=<name> with one of: {known}")
    if atari:  # the game exists: the env layer's message lists the closest names
        try:
            rom_id(env.name)
        except EnvError as e:
            raise ConfigError(f"env.name={env.name!r}: {e}") from None
    if env.backend not in (*BACKENDS, "auto"):
        raise ConfigError(f"env.backend={env.backend!r} is unknown; choose one of: auto, {', '.join(BACKENDS)}")
    _check_device("env.device", env.device, cuda)
    if env.device == "auto":
        device = "cuda" if (cuda and env.backend in ("auto", "mjx", "warp") and env.name in TASKS) else "cpu"
    else:
        device = env.device
    try:
        backend = resolve_backend(env.name, env.backend, torch.device(device))
    except EnvError as e:
        raise ConfigError(f"env.backend: {e}") from None
    if backend in ("mjx", "warp") and env.device == "auto" and not cuda:
        device = "cpu"
    if "model_params" in env.options:
        raise ConfigError(
            "env.options.model_params is not supported by the trainer: its rows are one per env, but the trainer "
            "builds each sampler split (env.num_envs / sampler.num_splits envs) and a 1-env spec probe from the same "
            "options; drop it (per-env model fields work with sample_fast.envs.make(..., model_params=...))"
        )
    if backend == "gymnasium":  # the id is env.name's part: name it, not the options
        from .envs.gymnasium_env import find_spec

        try:
            find_spec(env.name)
        except EnvError as e:
            raise ConfigError(f"env.name={env.name!r}: {e}") from None
    try:
        check_options(env.name, backend, dict(env.options))
    except OptionError as e:
        raise ConfigError(e.config_message()) from None
    except UnknownOptionError as e:
        owners = "".join(
            f"; {key} is an option of the {' and '.join(b)} backend: use env.backend={b[0]}, or drop {key}"
            for key, b in e.owners.items()
        )
        hint = f" ({e.hint})" if e.hint else ""
        raise ConfigError(
            f"env.options has unknown key(s) {e.unknown} for env {env.name!r} on the {backend} backend{hint}{owners}; "
            f"valid: {', '.join(e.valid)}"
        ) from None
    except EnvError as e:
        raise ConfigError(f"env.options ({backend} backend): {e}") from None
    return backend, device


def _env_specs(env: EnvConfig) -> tuple[Any, Any] | None:
    """The (observation, action) specs ``env`` will have, where the config alone gives them without building a
    simulator or starting a process: Atari (fixed preprocessing) and toy (pure torch, built in microseconds).
    None otherwise (MuJoCo tasks are checked by name; gymnasium ids only when the policy is built)."""
    from .envs import Spec, make
    from .envs.atari import FRAME_SHAPE, STACK_NUM, is_atari_name

    if is_atari_name(env.name):
        # The game's own action count needs its ROM loaded; the check only needs the space to be discrete.
        num_actions = 18
        return Spec((STACK_NUM, *FRAME_SHAPE), torch.uint8), Spec((), torch.int64, num_actions=num_actions)
    if env.name == "toy":
        with make("toy", 1, **env.options) as toy:
            return toy.observation_spec, toy.action_spec
    return None


def _check_policy(cfg: TrainConfig) -> str | None:
    """The policy settings fit the env's observations and actions (``PolicyConfig.check_specs``: a CNN encoder on
    image frames only, no Gaussian settings on discrete actions). Returns the encoder the policy will have
    (``auto`` resolved), or None where the config alone does not tell (an ``auto`` encoder on a gymnasium id)."""
    from .encoders import CNN_ENCODERS
    from .envs import TASKS
    from .policy import PolicyConfigError

    env, policy = cfg.env, cfg.policy
    if env.name in TASKS and policy.encoder in CNN_ENCODERS:
        raise ConfigError(
            f"policy.encoder={policy.encoder} needs image observations [C, H, W]; {env.name!r} observes a state "
            "vector: use policy.encoder=mlp (or auto)"
        )
    specs = _env_specs(env)
    try:
        if specs is None:
            encoder = "mlp" if env.name in TASKS else (policy.encoder if policy.encoder != "auto" else None)
            if encoder is not None:
                policy.check_encoder(encoder, prefix="policy.")
            return encoder
        return policy.check_specs(*specs, prefix="policy.")
    except PolicyConfigError as e:
        raise ConfigError(f"{e} (env {env.name})") from None


def _fit_sampler_device(cfg: TrainConfig, encoder: str | None, cuda: bool) -> None:
    """``sampler.device``: checked, and ``auto`` fitted. Async: the learner's CUDA device for a CNN policy (a
    Nature CNN forward of a few hundred frames on the sampler's one CPU thread would set the pace of a GPU run), else
    the CPU (an MLP acts in microseconds there, with no copies). Serial: the learner's policy acts, on run.device."""
    from .encoders import CNN_ENCODERS

    sampler, run = cfg.sampler, cfg.run
    _check_device("sampler.device", sampler.device, cuda)
    if run.mode == "serial":
        if sampler.device != "auto" and torch.device(sampler.device).type != torch.device(run.device).type:
            raise ConfigError(
                f"sampler.device={sampler.device} but run.mode=serial acts with the learner's policy on "
                f"run.device={run.device}: drop sampler.device (or use run.mode=async for a separate acting copy)"
            )
        sampler.device = run.device
    elif sampler.device == "auto":
        on_cuda = torch.device(run.device).type == "cuda"
        sampler.device = run.device if on_cuda and encoder in CNN_ENCODERS else "cpu"


def _check_distributed(dist_cfg: DistributedConfig, environ: Any):
    """The torchrun worker's LaunchInfo for distributed=ddp (None for none); ConfigError saying how to launch."""
    from .distributed import launch_info

    try:
        dist_cfg.validate()
    except ValueError as e:
        raise ConfigError(f"distributed.{e}") from None
    try:
        return launch_info(environ) if dist_cfg.mode == "ddp" else None
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _fit_distributed(cfg: TrainConfig, launch: Any) -> None:
    """This rank's devices and the collective backend (resolve, distributed=ddp)."""
    from .distributed import rank_device

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
    cfg.run.device = rank_device(cfg.run.device, launch.local_rank, gpus)
    cfg.env.device = rank_device(cfg.env.device, launch.local_rank, gpus)
    cfg.sampler.device = rank_device(cfg.sampler.device, launch.local_rank, gpus)
    dist_cfg, on_cuda = cfg.distributed, torch.device(cfg.run.device).type == "cuda"
    if dist_cfg.backend == "auto":
        dist_cfg.backend = "nccl" if on_cuda else "gloo"
    elif dist_cfg.backend == "nccl" and not on_cuda:
        raise ConfigError(
            f"distributed.backend=nccl needs the learner on CUDA (run.device={cfg.run.device}); use "
            "distributed.backend=gloo (or auto)"
        )


def _check_replay(replay: ReplayConfig, columns: int) -> None:
    """Replayed segments are ``[T, replay.segment_envs]`` column chunks of a batch of ``columns`` env columns."""
    if replay.ratio and replay.segment_envs > 0 and columns % replay.segment_envs:
        near = min((d for d in range(1, columns + 1) if columns % d == 0), key=lambda d: abs(d - replay.segment_envs))
        raise ConfigError(
            f"replay.segment_envs={replay.segment_envs} must divide the batch's {columns} env columns "
            f"(env.num_envs/sampler.num_splits); try replay.segment_envs={near}"
        )


def _check_recurrent(cfg: TrainConfig) -> None:
    """A recurrent policy's layout (docs/recurrent.md): minibatches of whole env columns, a burn-in that fits the
    replayed segment, trial memory only on an env that has trials."""
    policy, replay, sampler = cfg.policy, cfg.replay, cfg.sampler
    columns = cfg.env.num_envs // sampler.num_splits
    if replay.burn_in:
        if not policy.recurrent:
            raise ConfigError(f"replay.burn_in={replay.burn_in} refreshes a recurrent state, and policy.rnn=none; "
                              "set policy.rnn=gru (or lstm), or replay.burn_in=0")  # fmt: skip
        if not replay.ratio:
            raise ConfigError(f"replay.burn_in={replay.burn_in} applies to replayed segments, and replay is off "
                              "(replay.ratio=0); set replay.ratio (e.g. 0.5), or replay.burn_in=0")  # fmt: skip
        if replay.burn_in >= sampler.rollout_len:
            raise ConfigError(
                f"replay.burn_in={replay.burn_in} must be shorter than the segment it burns in (sampler.rollout_len="
                f"{sampler.rollout_len} steps), or nothing is left to train on; try replay.burn_in="
                f"{max(1, sampler.rollout_len // 4)}"
            )
    if not policy.recurrent:
        return
    num_minibatches = cfg.learner.num_minibatches
    if columns % num_minibatches:
        near = min((d for d in range(1, columns + 1) if columns % d == 0), key=lambda d: (abs(d - num_minibatches), -d))
        raise ConfigError(
            f"learner.num_minibatches={num_minibatches} must divide the batch's {columns} env columns "
            f"(env.num_envs/sampler.num_splits): a recurrent policy's minibatches are whole env columns (each re-run "
            f"from its stored state); try learner.num_minibatches={near}"
        )
    if policy.memory == "trial" and not _env_has_trials(cfg.env):
        raise ConfigError(
            f"policy.memory=trial keeps the state across the episodes of a trial, and env {cfg.env.name!r} has no "
            "trials (it never marks a trial end); use an env with trials (env=toy env.options.kind=bandit) or "
            "policy.memory=episode"
        )


def _env_has_trials(env: EnvConfig) -> bool:
    """Whether the env marks trial ends (``info["trial_end"]``): the toy bandit does, no other env here."""
    if env.name != "toy":
        return False
    from .envs import make

    with make("toy", 1, **env.options) as toy:
        return bool(getattr(toy, "has_trials", False))


# ----- resolve ---------------------------------------------------------------------------------------------------
def resolve(
    cfg: DictConfig | TrainConfig, num_cores: int | None = None, cuda: bool | None = None, environ: Any = None
) -> TrainConfig:
    """Check ``cfg`` and return a copy with every ``auto``/0 value fitted to this machine.

    Raises ``ConfigError`` (naming the field and the fix) on any invalid or inconsistent setting. It starts no
    process and writes no file. ``num_cores``/``cuda`` default to this machine (tests pass others).

    Derived values:
      * env.backend/env.device: mujoco on the CPU; on CUDA warp when it imports, else mjx
        (``sample_fast.envs.resolve_backend``).
      * run.mode: serial when the simulator runs on the GPU (sim, inference and learning share the device), async
        otherwise (the sampler process simulates while the learner trains).
      * env.num_envs: 4096 on the GPU; on the CPU 64 per core (enough for each mujoco thread to amortise the
        Python overhead of a step), rounded up to a multiple of sampler.num_splits. Atari games (emulated on the
        CPU whatever the devices): 16 per core with the learner on the CPU, where the CNN, not the emulator, sets
        the pace (design.md section 6: ~0.25 ms per agent step against ~0.5 ms per sample to train), 32 per core
        with the learner on CUDA, where the emulator does.
      * env.num_threads: every core; runner.learner_threads: half the cores (torch's thread pool slows down
        many-fold when it competes with the simulator threads for cores), every core for an Atari game with the
        learner on the CPU (the CNN learner is the bottleneck there).
      * learner.seed and sampler.seed (when null) follow run.seed.
      * distributed=ddp (a torchrun worker; ``environ`` defaults to os.environ): the sizes above are fitted to this
        rank's share of the cores (cores / LOCAL_WORLD_SIZE), cuda devices become the rank's own GPU
        (cuda:<LOCAL_RANK mod GPUs>), distributed.backend auto is nccl with the learner on CUDA, else gloo.
    """
    cfg = to_train_config(cfg)
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, options=dict(cfg.env.options)),
        run=dataclasses.replace(cfg.run),
        sampler=dataclasses.replace(cfg.sampler),
        runner=dataclasses.replace(cfg.runner),
        learner=dataclasses.replace(cfg.learner),
        replay=dataclasses.replace(cfg.replay),
        policy=dataclasses.replace(cfg.policy),
        logging=dataclasses.replace(cfg.logging),
        distributed=dataclasses.replace(cfg.distributed),
    )
    num_cores = cpu_cores() if num_cores is None else num_cores
    cuda = torch.cuda.is_available() if cuda is None else cuda
    launch = _check_distributed(cfg.distributed, environ)
    if launch is not None:  # each rank of this machine sizes itself for its share of the cores
        num_cores = max(1, num_cores // launch.local_world_size)
    if cfg.algo not in ALGOS:
        raise ConfigError(f"algo={cfg.algo!r} is unknown; choose one of: {', '.join(ALGOS)}")
    cfg.env.backend, cfg.env.device = _check_env(cfg.env, cuda)
    _resolve_run(cfg.run, cfg.env, cuda)
    if launch is not None:
        _fit_distributed(cfg, launch)
    _fit_sizes(cfg, num_cores)
    _check_learner_sizes(cfg)
    for section in ("policy", "learner", "replay", "sampler", "runner"):
        validate = getattr(getattr(cfg, section), "validate", None)
        if validate is not None:
            try:
                validate()
            except ValueError as e:  # the component's own check; its message names the field
                raise ConfigError(f"{section}: {e} (set it with {section}.<field>=...)") from None
    if cfg.run.mode == "serial" and cfg.runner.learner_sched != "normal":
        raise ConfigError(
            f"runner.learner_sched={cfg.runner.learner_sched} needs run.mode=async: in serial mode the sampler runs in "
            "the learner's threads (use runner.learner_sched=normal)"
        )
    _fit_sampler_device(cfg, _check_policy(cfg), cuda)
    _check_recurrent(cfg)
    _check_logging(cfg.logging)
    return cfg


def _resolve_run(run: RunConfig, env: EnvConfig, cuda: bool) -> None:
    """The ``run`` section checked; its device (auto: CUDA where there is one) and mode (auto: serial with the
    simulator on the GPU, else async) fitted."""
    steps = run.total_env_steps
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not (steps >= 1 and float(steps).is_integer()):
        raise ConfigError(f"run.total_env_steps={steps!r} must be a positive whole number of env steps, e.g. 1e6")
    run.total_env_steps = int(steps)
    if run.time_limit_s is not None and not run.time_limit_s > 0:
        raise ConfigError(f"run.time_limit_s={run.time_limit_s!r} must be > 0 seconds, or null for no limit")
    if run.mode not in MODES:
        raise ConfigError(f"run.mode={run.mode!r} is unknown; choose one of: {', '.join(MODES)}")
    if not run.name or "/" in run.name:
        raise ConfigError(f"run.name={run.name!r} must be a non-empty name without '/'; use run.dir for a path")
    _check_device("run.device", run.device, cuda)
    if run.device == "auto":
        run.device = "cuda" if cuda else "cpu"
    if not run.checkpoint_interval_s > 0:
        raise ConfigError(f"run.checkpoint_interval_s={run.checkpoint_interval_s!r} must be > 0 seconds")
    _positive("run.keep_checkpoints", run.keep_checkpoints)
    if run.mode == "auto":
        run.mode = "serial" if torch.device(env.device).type == "cuda" else "async"


def _fit_sizes(cfg: TrainConfig, num_cores: int) -> None:
    """env.num_envs, env.num_threads, runner.learner_threads and sampler.seed fitted where 0/null (see resolve)."""
    env, run, sampler = cfg.env, cfg.run, cfg.sampler
    _positive("sampler.rollout_len", sampler.rollout_len)
    _positive("sampler.num_splits", sampler.num_splits)
    _positive("env.num_envs", env.num_envs, allow_zero=True)
    _positive("env.num_threads", env.num_threads, allow_zero=True)
    if env.num_envs == 0:
        if is_atari_name(env.name):
            per_core = 32 if torch.device(run.device).type == "cuda" else 16
            env.num_envs = _round_up(per_core * num_cores, sampler.num_splits)
        elif torch.device(env.device).type == "cuda":
            env.num_envs = 4096
        else:
            env.num_envs = _round_up(64 * num_cores, sampler.num_splits)
    if env.num_envs % sampler.num_splits:
        raise ConfigError(
            f"env.num_envs={env.num_envs} must be divisible by sampler.num_splits={sampler.num_splits}; "
            f"try env.num_envs={_round_up(env.num_envs, sampler.num_splits)}"
        )
    if env.num_threads == 0:
        env.num_threads = max(1, min(num_cores, env.num_envs))
    if cfg.runner.learner_threads == 0:
        cfg.runner.learner_threads = default_learner_threads(env.name, run.device, num_cores)
    if sampler.seed is None:
        sampler.seed = run.seed  # split i resets with seed + i


def _check_learner_sizes(cfg: TrainConfig) -> None:
    """learner.num_minibatches divides the batch (the nearest divisor is suggested); replay's segments fit it; the
    learner's seed is run.seed (run.seed seeds everything)."""
    learner, sampler, env = cfg.learner, cfg.sampler, cfg.env
    batch = batch_size(cfg)
    num_minibatches = learner.num_minibatches
    _positive("learner.num_minibatches", num_minibatches)
    if batch % num_minibatches:
        divisors = [d for d in range(1, min(batch, 64) + 1) if batch % d == 0]
        near = min(divisors, key=lambda d: (abs(d - num_minibatches), -d))  # ties: the larger one
        raise ConfigError(
            f"learner.num_minibatches={num_minibatches} must divide the batch of {batch} env steps "
            f"(sampler.rollout_len={sampler.rollout_len} x env.num_envs/sampler.num_splits="
            f"{env.num_envs // sampler.num_splits}); try learner.num_minibatches={near}"
        )
    _check_replay(cfg.replay, env.num_envs // sampler.num_splits)
    learner.seed = cfg.run.seed


def _check_logging(log: LogConfig) -> None:
    if log.progress not in PROGRESS:
        raise ConfigError(f"logging.progress={log.progress!r} is unknown; choose one of: {', '.join(PROGRESS)}")
    if not log.interval_s > 0:
        raise ConfigError(f"logging.interval_s={log.interval_s!r} must be > 0 seconds")
    _positive("logging.return_window", log.return_window)
