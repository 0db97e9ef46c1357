"""The benchmark suite's configuration schema (a Hydra structured config) and its validation.

Owns ``BenchmarkConfig`` and ``resolve``, which rejects unknown stages, backends, envs and peers with the list of
valid choices before anything is built. YAML files (``configs/benchmark.yaml`` and the presets in
``configs/benchmark/preset/``) only set values of this schema.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from sample_fast.procs import SCHED_POLICIES

#: ``inference_rnn``: the inference stage with a recurrent policy (``policy_rnn``), for its cost next to the MLP's.
STAGES = ("env", "inference", "train", "inference_rnn")
RNN_CHOICES = ("gru", "lstm")
SUITE_BACKENDS = ("mujoco", "envpool", "mjx", "warp", "gymnasium", "ale", "toy")
#: Peers measured in the same run, in report order. ``mujoco_rollout`` is the physical limit.
#: Atari games (``<Game>-v5``) are measured by the Atari peers (envpool_raw, envpool_raw_async, ale_vector_raw,
#: gymnasium_sync, cleanrl_ppo, sample_factory); the MuJoCo-only ones are skipped with a line.
PEER_NAMES = (
    "mujoco_rollout",
    "envpool_raw",
    "envpool_raw_async",
    "ale_vector_raw",
    "gymnasium_sync",
    "gymnasium_async",
    "torchrl_collector",
    "cleanrl_ppo",
    "sample_factory",
)
ISOLATE_CHOICES = ("none", "mjx", "all")


class BenchmarkConfigError(ValueError):
    """A bad benchmark setting. The message lists the valid choices."""


@dataclass
class TrainStageConfig:
    """End-to-end training stage: the Runner with an APPO learner."""

    mode: str = "async"  #: Runner mode: async (sampler in a child process) or serial
    rollout_len: int = 64  #: T of each trajectory slot
    num_splits: int = 2  #: double-buffering groups; num_envs must be divisible by it (else 1 is used)
    learner_threads: int = 0  #: torch threads of the learner; 0 = half the cores, as the trainer fits them
    learner_sched: str = "normal"  #: the learner's scheduling policy (runner.learner_sched): normal, batch, idle
    #: LearnerConfig overrides; the default is what ``configs/algo/appo.yaml`` changes from the dataclass defaults
    #: that costs CPU (4 epochs per batch), so the stage measures the trainer's default work per sample.
    learner: dict[str, Any] = field(default_factory=lambda: {"num_epochs": 4})
    #: A window spans at least this many train calls as well as ``seconds_per_repeat`` (each call trains one slot:
    #: 4096 env steps at the defaults, ~0.4 s on 2 cores). Windows of 3-4 calls (1.5 s) spread 2.6-2.9k env
    #: steps/s on Ant, windows of 10 calls 0.4-1.0k (``benchmarks/results/train_windows_cpu/``): the async
    #: learner's calls are uneven.
    window_calls: int = 10
    #: Untimed seconds after the first train call, for this stage (None: the suite's ``warmup_s``).
    warmup_s: float | None = 3.0
    #: when the sampler loads the learner's newest weights: step (before every policy forward, the trainer's
    #: default) or slot (at each slot's start)
    weights_refresh: str = "step"


@dataclass
class SampleFactoryConfig:
    """The Sample Factory peer: its own virtualenv, its APPO on MuJoCo, a bounded number of env steps."""

    venv: str = ".venv-sf"  #: built by benchmarks/sample_factory/setup_venv.sh (relative to the repository root)
    num_workers: int = 0  #: rollout workers; 0 = all cores
    num_envs_per_worker: int = 8
    #: Atari: envs over all workers (SF's Atari example: 8 workers x 1 env); per worker atari_num_envs / workers, so
    #: one rollout of all envs (x 128 steps) divides its 4 x 256 training samples, as SF requires
    atari_num_envs: int = 8
    env_steps: int = 300_000  #: --train_for_env_steps (SF 2.1.1 ignores --train_for_seconds)
    timeout_s: float = 300.0  #: the run is killed (with its children) after this


@dataclass
class CleanRLConfig:
    """The CleanRL-style PPO peer (benchmarks/cleanrl_ppo_atari.py): its defaults, a bounded number of steps."""

    num_envs: int = 8  #: CleanRL's Atari default
    num_steps: int = 128  #: rollout length per update (one update = num_envs * num_steps env steps)
    env_steps: int = 20_480  #: --total-timesteps of the bounded run (20 updates at the defaults)
    timeout_s: float = 300.0  #: the run is killed (with its children) after this


@dataclass
class BenchmarkConfig:
    """Everything ``python -m sample_fast.benchmark`` measures and how. Every list is a sweep."""

    #: Stages: env (env steps only), inference (the double-buffered Sampler with a policy), train (Runner + APPO),
    #: inference_rnn (the inference stage with a recurrent policy: policy_rnn after the policy_hidden_sizes MLP).
    stages: list[str] = field(default_factory=lambda: ["env", "inference", "train"])
    #: sample_fast backends (sample_fast.envs.make); ones that do not import here are skipped with a line.
    backends: list[str] = field(default_factory=lambda: ["mujoco", "envpool", "mjx", "gymnasium"])
    #: Tasks (sample_fast.envs.TASKS, e.g. ant, halfcheetah, humanoid) or toy.
    envs: list[str] = field(default_factory=lambda: ["ant"])
    #: Total envs per case (the sampler splits them into num_splits groups).
    num_envs: list[int] = field(default_factory=lambda: [64, 256, 1024])
    #: Peers run in the same process tree for comparison; [] for none.
    peers: list[str] = field(default_factory=lambda: list(PEER_NAMES))
    repeats: int = 3  #: timed windows per case and round (median and spread are over all of them)
    #: Passes over the whole plan; each case's windows are pooled over rounds. rounds=3 repeats=1 spreads every
    #: case's windows over the run, so a load spike from another process hits every runner alike.
    rounds: int = 1
    seconds_per_repeat: float = 3.0
    warmup_s: float = 1.0  #: untimed seconds after the first (compiling) step
    measure_timeout_s: float = 300.0  #: budget of one case, start-up and compilation included
    #: Cases run in a child process with a hard timeout: none, mjx (the device simulators mjx and warp: MJX can hang
    #: in native code, and each gets a fresh GPU context), all.
    isolate: str = "mjx"
    device: str = "auto"  #: where mjx, warp and the policy run: auto (cuda when available), cpu, cuda
    num_threads: int = 0  #: simulator threads (mujoco backend, envpool, mujoco_rollout); 0 = all cores
    torch_threads: int = 1  #: torch intra-op threads for inference (1 is best when the simulator owns the cores)
    #: The sampler's GIL switch interval in the inference and train stages (SamplerConfig.gil_switch_interval_s);
    #: None: SamplerConfig's default.
    gil_switch_interval_s: float | None = None
    #: Policy MLP of the inference and train stages (and the torchrl peer): the trainer's default (algo/appo.yaml).
    policy_hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    #: The inference_rnn stage's recurrent core (gru, lstm) and its size (docs/recurrent.md).
    policy_rnn: str = "gru"
    policy_rnn_size: int = 64
    #: A CNN policy's trunk under CPU bf16 autocast (PolicyConfig.cpu_bf16: auto, always, never): "auto" as the
    #: Atari presets run it; an MLP policy ignores it.
    policy_cpu_bf16: str = "auto"
    #: Task options for every backend (e.g. {max_episode_steps: 1000}); see sample_fast.envs.tasks.
    env_options: dict[str, Any] = field(default_factory=dict)
    #: Per-backend options, e.g. {mjx: {solver_iterations: 1, ls_iterations: 4}}.
    backend_options: dict[str, Any] = field(default_factory=dict)
    rollout_len: int = 64  #: inference stage: T of the Sampler's slots
    num_splits: int = 2  #: inference stage: double-buffering groups
    #: AsyncVectorEnv starts one process per env: sweep sizes above this are left out (if none is left, it runs
    #: once with one env per core).
    gymnasium_async_max_envs: int = 16
    train: TrainStageConfig = field(default_factory=TrainStageConfig)
    sample_factory: SampleFactoryConfig = field(default_factory=SampleFactoryConfig)
    cleanrl: CleanRLConfig = field(default_factory=CleanRLConfig)
    seed: int = 0
    #: Output folder; empty: benchmarks/results/<date>-<host>/. Gets results.json, results.md, results.png.
    out_dir: str = ""
    #: Base name of the three output files.
    out_name: str = "results"
    progress: bool = True  #: rich progress bar (off in tests)
    #: Before measuring the CPUs are sampled (harness.check_quiet: a warning when busy, the JSON's ``quiet``);
    #: wait_quiet first waits, up to quiet_timeout_s, for a window at most max_busy busy.
    wait_quiet: bool = False
    max_busy: float = 0.10  #: non-idle share of all CPUs above which the machine counts as busy
    quiet_timeout_s: float = 300.0
    title: str = "sample_fast benchmark"


def _check_choices(what: str, values: list[Any], choices: tuple[str, ...] | list[str], hint: str = "") -> None:
    bad = [v for v in values if v not in choices]
    if bad:
        extra = f" {hint}" if hint else ""
        raise BenchmarkConfigError(f"unknown {what} {bad}; choose from: {', '.join(choices)}.{extra}")


def known_envs() -> list[str]:
    from sample_fast.envs import TASKS

    return [*sorted(TASKS), "toy", "<Game>-v5 (an Atari game, e.g. Pong-v5)"]


def is_atari(env: str) -> bool:
    from sample_fast.envs.atari import is_atari_name

    return is_atari_name(env)


def resolve(cfg: BenchmarkConfig) -> BenchmarkConfig:
    """Validate ``cfg`` in place (raising BenchmarkConfigError with the valid choices) and fill derived values."""
    for name in ("stages", "backends", "envs", "num_envs", "peers", "policy_hidden_sizes"):
        value = getattr(cfg, name)
        if isinstance(value, (str, int)):  # `envs=ant` on the command line instead of `envs=[ant]`
            setattr(cfg, name, [value])
    _check_choices("stage(s)", cfg.stages, STAGES)
    _check_choices("backend(s)", cfg.backends, SUITE_BACKENDS)
    _check_choices("env(s)", [e for e in cfg.envs if not is_atari(e)], known_envs())
    _check_choices("peer(s)", cfg.peers, PEER_NAMES, "Use peers=[] to measure none.")
    if cfg.policy_rnn not in RNN_CHOICES:
        raise BenchmarkConfigError(f"policy_rnn={cfg.policy_rnn!r}; choose from: {', '.join(RNN_CHOICES)}")
    from sample_fast.encoders import CPU_BF16_SETTINGS

    if cfg.policy_cpu_bf16 not in CPU_BF16_SETTINGS:
        raise BenchmarkConfigError(
            f"policy_cpu_bf16={cfg.policy_cpu_bf16!r}; choose from: {', '.join(CPU_BF16_SETTINGS)}"
        )
    if not isinstance(cfg.policy_rnn_size, int) or cfg.policy_rnn_size < 1:
        raise BenchmarkConfigError(f"policy_rnn_size must be a positive int, got {cfg.policy_rnn_size!r}")
    if cfg.isolate not in ISOLATE_CHOICES:
        raise BenchmarkConfigError(f"isolate={cfg.isolate!r}; choose from: {', '.join(ISOLATE_CHOICES)}")
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise BenchmarkConfigError(f"device={cfg.device!r}; choose from: auto, cpu, cuda, cuda:<index>")
    if not isinstance(cfg.train.window_calls, int) or cfg.train.window_calls < 1:
        raise BenchmarkConfigError(f"train.window_calls must be an int >= 1, got {cfg.train.window_calls!r}")
    if cfg.train.warmup_s is not None and cfg.train.warmup_s < 0:
        raise BenchmarkConfigError(f"train.warmup_s must be >= 0 or null, got {cfg.train.warmup_s}")
    if cfg.train.mode not in ("async", "serial"):
        raise BenchmarkConfigError(f"train.mode={cfg.train.mode!r}; choose from: async, serial")
    if cfg.train.learner_sched not in SCHED_POLICIES:
        raise BenchmarkConfigError(
            f"train.learner_sched={cfg.train.learner_sched!r}; choose from: {', '.join(SCHED_POLICIES)}"
        )
    if cfg.train.learner_sched != "normal" and cfg.train.mode != "async":
        raise BenchmarkConfigError(f"train.learner_sched={cfg.train.learner_sched} needs train.mode=async")
    if cfg.train.weights_refresh not in ("step", "slot"):
        raise BenchmarkConfigError(f"train.weights_refresh={cfg.train.weights_refresh!r}; choose from: step, slot")
    bad_n = [n for n in cfg.num_envs if not isinstance(n, int) or isinstance(n, bool) or n < 1]
    if bad_n or not cfg.num_envs:
        raise BenchmarkConfigError(f"num_envs must be a non-empty list of positive ints, got {cfg.num_envs}")
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise BenchmarkConfigError(f"repeats must be >= 1 (3 or more for a meaningful spread), got {cfg.repeats}")
    for name in ("seconds_per_repeat", "measure_timeout_s"):
        if not getattr(cfg, name) > 0:
            raise BenchmarkConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.warmup_s < 0:
        raise BenchmarkConfigError(f"warmup_s must be >= 0, got {cfg.warmup_s}")
    for name in ("rollout_len", "num_splits", "torch_threads", "rounds"):
        if getattr(cfg, name) < 1:
            raise BenchmarkConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    si = cfg.gil_switch_interval_s
    if si is not None and not 0 < si <= 1:
        raise BenchmarkConfigError(f"gil_switch_interval_s must be in (0, 1] seconds or null, got {si}")
    unknown_opts = [b for b in cfg.backend_options if b not in SUITE_BACKENDS]
    if unknown_opts:
        raise BenchmarkConfigError(
            f"backend_options has unknown backend(s) {unknown_opts}; choose from: {', '.join(SUITE_BACKENDS)}"
        )
    if not cfg.out_dir:
        cfg.out_dir = os.path.join("benchmarks", "results", f"{time.strftime('%Y-%m-%d')}-{socket.gethostname()}")
    return cfg


def num_threads(cfg: BenchmarkConfig) -> int:
    """Simulator threads: ``cfg.num_threads`` or every core this process may run on."""
    if cfg.num_threads > 0:
        return cfg.num_threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (``configs/benchmark.yaml`` builds on it)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="benchmark_schema", node=BenchmarkConfig)
