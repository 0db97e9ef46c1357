"""Config schema tests: every shipped YAML composes and resolves, YAML keys exist on their components' config
dataclasses, those dataclasses are what the components' constructors take, and every bad setting is rejected with a
message naming the fix -- before anything is written."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import sample_fast.configs
import yaml
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from sample_fast.config import ConfigError, TrainConfig, batch_size, resolve, run_dir

CONFIG_DIR = Path(sample_fast.configs.__file__).parent
GROUPS = ("env", "algo", "sampler", "runner", "replay", "logging", "distributed")
ENV_PRESETS = sorted(p.stem for p in (CONFIG_DIR / "env").glob("*.yaml"))
PYTHON = sys.executable
PRESET_TASK = {
    "ant_v4": "ant",
    "pong": "Pong-v5",
    "breakout": "Breakout-v5",
    "atari": "SpaceInvaders-v5",
    "recall": "toy",
    "bandit": "toy",
}
#: overrides a preset needs to resolve: env=atari takes the game from the command line
PRESET_OVERRIDES = {"atari": ("env.name=SpaceInvaders-v5",)}
ATARI_PRESETS = ("pong", "breakout", "atari")
TOY_PRESETS = ("recall", "bandit")


def _preset(env: str) -> list[str]:
    return [f"env={env}", *PRESET_OVERRIDES.get(env, ())]


def test_ant_v4_preset_is_ant_with_the_v4_options():
    from sample_fast.envs.tasks import ANT_V4_OPTIONS

    cfg = resolve(_compose("env=ant_v4"), num_cores=2, cuda=False)
    assert cfg.env.name == "ant" and cfg.env.options == ANT_V4_OPTIONS
    from sample_fast.envs import make

    with make("ant", 2, backend=cfg.env.backend, **cfg.env.options) as env:
        assert tuple(env.observation_spec.shape) == (27,)  # Ant-v4: no contact forces in the observation


@pytest.fixture(autouse=True, scope="module")
def _hydra():
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        yield


def _compose(*overrides: str):
    return compose("train", overrides=list(overrides))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def test_presets_are_the_issue_list():
    # the issue's presets, plus ant_v4 (Ant with gymnasium Ant-v4 semantics, for comparisons with peers)
    # and the memory tasks of docs/recurrent.md (recall, bandit: toy kinds with a GRU policy)
    assert set(ENV_PRESETS) == {"ant", "halfcheetah", "hopper", "walker2d", "humanoid", "toy", "ant_v4", *ATARI_PRESETS,
                                *TOY_PRESETS}  # fmt: skip
    for group in GROUPS:
        assert _options(group), f"config group {group} is empty"


#: What each env preset resolves to on a 2-core CPU machine, written from the YAML files and resolve()'s rules
#: (64 envs per core, 2 splits): (env.name, env.backend, env.num_envs, run.total_env_steps, sampler.rollout_len, batch).
#: batch = rollout_len x num_envs / num_splits: 64 x 128 / 2 = 4096 (MuJoCo presets), 16 x 16 / 2 = 128 (toy).
#: Atari: 16 envs per core (the CNN learner sets the pace) = 32, rollout 128 (sampler=long): 128 x 32 / 2 = 2048;
#: backend auto = envpool, installed here.
PRESET_RESOLVED = {
    "ant": ("ant", "mujoco", 128, 8_000_000, 64, 4096),
    "ant_v4": ("ant", "mujoco", 128, 5_000_000, 64, 4096),
    "halfcheetah": ("halfcheetah", "mujoco", 128, 5_000_000, 64, 4096),
    "hopper": ("hopper", "mujoco", 128, 3_000_000, 64, 4096),
    "walker2d": ("walker2d", "mujoco", 128, 5_000_000, 64, 4096),
    "humanoid": ("humanoid", "mujoco", 128, 20_000_000, 64, 4096),
    "toy": ("toy", "toy", 16, 100_000, 16, 128),
    "recall": ("toy", "toy", 64, 100_000, 16, 512),  # 16 x 64 / 2
    "bandit": ("toy", "toy", 64, 150_000, 16, 512),
    "pong": ("Pong-v5", "envpool", 32, 4_000_000, 128, 2048),
    "breakout": ("Breakout-v5", "envpool", 32, 4_000_000, 128, 2048),
    "atari": ("SpaceInvaders-v5", "envpool", 32, 4_000_000, 128, 2048),
}


@pytest.mark.parametrize("env", ENV_PRESETS)
def test_every_preset_resolves_to_its_values(env):
    assert env in PRESET_RESOLVED, f"configs/env/{env}.yaml is new: add what it resolves to to PRESET_RESOLVED"
    cfg = resolve(_compose(*_preset(env)), num_cores=2, cuda=False)
    name, backend, num_envs, total, rollout_len, batch = PRESET_RESOLVED[env]
    assert (cfg.env.name, cfg.env.backend, cfg.env.num_envs) == (name, backend, num_envs)
    assert (cfg.run.total_env_steps, cfg.sampler.rollout_len, batch_size(cfg)) == (total, rollout_len, batch)
    assert batch % cfg.learner.num_minibatches == 0  # appo: 4 minibatches of 1024 (MuJoCo) or 32 (toy)
    # the preset's env.options are exactly its YAML's (nothing dropped or added on the way)
    preset_yaml = yaml.safe_load((CONFIG_DIR / "env" / f"{env}.yaml").read_text())
    assert cfg.env.options == preset_yaml["env"].get("options", {})


@pytest.mark.parametrize("env", [e for e in ENV_PRESETS if e not in ("toy", "ant_v4", *ATARI_PRESETS, *TOY_PRESETS)])
def test_task_presets_build_the_gymnasium_task(env):
    """The resolved preset builds (the env's own checks) with gymnasium's spaces for that task (the reference)."""
    import gymnasium
    from sample_fast.envs import TASKS, make

    cfg = resolve(_compose(f"env={env}"), num_cores=2, cuda=False)
    ref = gymnasium.make(TASKS[cfg.env.name].gymnasium_id)
    try:
        with make(cfg.env.name, 2, backend=cfg.env.backend, num_threads=1, **cfg.env.options) as built:
            assert tuple(built.observation_spec.shape) == ref.observation_space.shape
            assert tuple(built.action_spec.shape) == ref.action_space.shape
    finally:
        ref.close()


BENCHMARK_PRESETS = sorted(p.stem for p in (CONFIG_DIR / "benchmark" / "preset").glob("*.yaml"))


# ids "preset-<name>": a bare "gpu" id would be read as the gpu marker (conftest) and skipped on CPU machines
@pytest.mark.parametrize("preset", BENCHMARK_PRESETS, ids=lambda p: f"preset-{p}")
def test_every_benchmark_preset_composes_and_resolves_to_its_values(preset):
    """The other primary config (configs/benchmark.yaml) and each of its presets: every value the preset sets
    reaches the resolved BenchmarkConfig."""
    from sample_fast.benchmark import resolve as resolve_benchmark
    from sample_fast.benchmark.__main__ import to_config

    cfg = resolve_benchmark(to_config(compose("benchmark", overrides=[f"preset={preset}"])))
    values = yaml.safe_load((CONFIG_DIR / "benchmark" / "preset" / f"{preset}.yaml").read_text())
    assert values, f"preset {preset} sets nothing"
    for key, value in _walk(values):
        node = cfg
        for part in key.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)  # train.learner is a dict field
        assert node == value, f"preset={preset}: {key} is {node!r}, the preset sets {value!r}"


@pytest.mark.parametrize("env", ENV_PRESETS)
def test_every_group_option_composes_and_resolves(env):
    for group in ("algo", "sampler", "runner", "replay", "logging"):
        for option in _options(group):
            cfg = resolve(_compose(*_preset(env), f"{group}={option}"), num_cores=2, cuda=False)
            assert isinstance(cfg, TrainConfig)
            assert cfg.env.name == PRESET_TASK.get(env, env)
            assert cfg.env.num_envs % cfg.sampler.num_splits == 0
            assert batch_size(cfg) % cfg.learner.num_minibatches == 0


@pytest.mark.parametrize("env", [e for e in ENV_PRESETS if e not in ("toy", *ATARI_PRESETS, *TOY_PRESETS)])
def test_auto_sizes_cpu_and_gpu(env):
    # CPU, 2 cores: MuJoCo C, async, 64 envs per core, every core simulates, learner gets half the cores.
    cpu = resolve(_compose(f"env={env}"), num_cores=2, cuda=False)
    assert (cpu.env.backend, cpu.env.device, cpu.run.mode, cpu.run.device) == ("mujoco", "cpu", "async", "cpu")
    assert (cpu.env.num_envs, cpu.env.num_threads, cpu.runner.learner_threads) == (128, 2, 1)
    # CUDA: MuJoCo Warp on the GPU (installed here: a pinned dependency; MJX where it does not import), serial
    # (sim, inference and learning share the device), 4096 envs.
    gpu = resolve(_compose(f"env={env}"), num_cores=8, cuda=True)
    assert (gpu.env.backend, gpu.env.device, gpu.run.mode, gpu.run.device) == ("warp", "cuda", "serial", "cuda")
    mjx = resolve(_compose(f"env={env}", "env.backend=mjx"), num_cores=8, cuda=True)
    assert (mjx.env.backend, mjx.env.device, mjx.run.mode) == ("mjx", "cuda", "serial")
    assert gpu.env.num_envs == 4096 and gpu.runner.learner_threads == 4
    # explicit values are kept
    fixed = resolve(_compose(f"env={env}", "env.num_envs=24", "run.mode=serial"), num_cores=2, cuda=False)
    assert (fixed.env.num_envs, fixed.run.mode, fixed.runner.learner_threads) == (24, "serial", 1)


def test_overrides_from_the_docs():
    cfg = resolve(
        _compose("env=halfcheetah", "learner.lr=1e-4", "run.total_env_steps=1e6", "run.mode=serial"),
        num_cores=2,
        cuda=False,
    )
    assert cfg.learner.lr == 1e-4 and cfg.run.total_env_steps == 1_000_000 and cfg.run.mode == "serial"
    assert isinstance(cfg.run.total_env_steps, int)
    assert cfg.learner.seed == cfg.run.seed  # run.seed seeds everything
    # the toy preset selects the short-rollout sampler; the command line still wins
    assert resolve(_compose("env=toy"), num_cores=2, cuda=False).sampler.rollout_len == 16
    assert resolve(_compose("env=toy", "sampler=default"), num_cores=2, cuda=False).sampler.rollout_len == 64


def test_backend_options_are_accepted_for_their_backend_only():
    cfg = resolve(_compose("env=ant", "+env.options.step_timeout_s=5", "+env.options.max_episode_steps=500"), 2, False)
    assert cfg.env.options == {"step_timeout_s": 5, "max_episode_steps": 500}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['step_timeout_s'\]"):
        resolve(_compose("env=ant", "env.backend=envpool", "+env.options.step_timeout_s=5"), 2, False)


def test_run_dir_default_and_override(tmp_path):
    cfg = resolve(_compose("env=ant", "run.name=exp1"), num_cores=2, cuda=False)
    assert run_dir(cfg) == os.path.abspath(os.path.join("runs", "ant", "exp1"))
    cfg = resolve(_compose("env=ant", f"run.dir={tmp_path}/x"), num_cores=2, cuda=False)
    assert run_dir(cfg) == str(tmp_path / "x")


def _component_configs() -> dict[str, tuple[type, str]]:
    """TrainConfig section -> (the component whose constructor takes it, that parameter's name)."""
    from sample_fast.learner import Learner
    from sample_fast.policy import ActorCritic
    from sample_fast.replay import TrajectoryReplay
    from sample_fast.runner import Runner

    return {
        "policy": (ActorCritic, "cfg"),
        "learner": (Learner, "cfg"),
        "replay": (TrajectoryReplay, "cfg"),  # built by wiring.build_replay, handed to Learner(replay=...)
        "sampler": (Runner, "sampler_cfg"),
        "runner": (Runner, "runner_cfg"),
    }


def test_sections_match_component_constructors():
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    hints = typing.get_type_hints(TrainConfig)
    for section, (component, param) in _component_configs().items():  # an ImportError of our own code fails
        assert section in fields
        # only this parameter's annotation (others may name types imported for type checking only)
        annotation = component.__init__.__annotations__[param]
        if isinstance(annotation, str):  # from __future__ import annotations
            annotation = eval(annotation, vars(sys.modules[component.__module__]))
        expected = annotation
        if typing.get_args(expected):  # ``Cfg | None``: the constructor's own default when None
            expected = next(a for a in typing.get_args(expected) if a is not type(None))
        assert hints[section] is expected, f"TrainConfig.{section} is {hints[section]}, {component} takes {expected}"


def _walk(node: dict, prefix: str = ""):
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and key != "options":
            yield from _walk(value, path + ".")
        else:
            yield path, value


def test_every_yaml_key_is_a_dataclass_field():
    """Independent of Hydra: read each YAML file and look each key up on the dataclass it lands in."""
    hints_cache: dict[type, dict] = {}

    def field_type(cls: type, name: str):
        if cls not in hints_cache:
            hints_cache[cls] = typing.get_type_hints(cls)
        assert name in hints_cache[cls], f"{cls.__name__} has no field {name!r}"
        return hints_cache[cls][name]

    checked = 0
    train_files = [CONFIG_DIR / "train.yaml"] + [p for g in GROUPS for p in sorted((CONFIG_DIR / g).glob("*.yaml"))]
    for path in train_files:
        text = path.read_text()
        data = yaml.safe_load(text) or {}
        group = path.parent.name if path.parent != CONFIG_DIR else None
        data = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
        if group is not None and "@package _global_" not in text:
            data = {group: data}  # the group's default package is its name
        for key, _ in _walk(data):
            cls: type = TrainConfig
            parts = key.split(".")
            for part in parts[:-1]:
                cls = field_type(cls, part)
                assert dataclasses.is_dataclass(cls), f"{path.name}: {key} goes through a non-dataclass"
            field_type(cls, parts[-1])
            checked += 1
    assert checked > 20


def test_env_options_in_presets_are_accepted_by_the_env():
    from sample_fast.envs import make

    for env in ENV_PRESETS:
        cfg = resolve(_compose(*_preset(env)), num_cores=2, cuda=False)
        if cfg.env.backend == "toy":
            with make("toy", 2, **cfg.env.options) as e:  # the env's own option check
                # recall: one episode is recall_steps long; bandit: one pull
                expected = {"recall": cfg.env.options.get("recall_steps"), "bandit": 1}.get(e.kind)
                assert e.max_episode_steps == (expected or cfg.env.options["max_episode_steps"])


BAD = [
    (["env.name=pong"], "env.name='pong' is unknown"),
    (["env=atari"], "env.name is not set; pick a preset with env=<name>, or with env=atari a game: env.name=<Game>-v5"),
    (["env=atari", "env.name=Pongg-v5"], "env.name='Pongg-v5': unknown Atari game 'Pongg-v5'; closest: Pong-v5"),
    (["env=pong", "env.backend=mujoco"], "Atari game 'Pong-v5' runs on backends envpool, ale (got 'mujoco')"),
    (["env=pong", "+env.options.sticky=0.1"], "unknown option(s) ['sticky'] for Atari game 'Pong-v5'"),
    (["env=pong", "env.backend=ale", "+env.options.frame_skip=0"], "frame_skip must be a positive int, got 0"),
    (
        ["env=pong", "policy.init_log_std=-1.0"],
        "policy.init_log_std only applies to continuous (Gaussian) actions, and this env's actions are discrete (a "
        "categorical policy); drop policy.init_log_std (env Pong-v5)",
    ),
    (["env=breakout", "policy.squash_mean=false"], "policy.squash_mean only applies to continuous"),
    (
        ["env=pong", "policy.encoder=mlp"],  # the preset turns the normaliser off: raw 0-255 pixels into an MLP
        "policy.encoder=mlp on uint8 frames [4, 84, 84] needs policy.normalize_obs=true",
    ),
    (
        ["env=ant", "policy.encoder=impala_cnn"],
        "policy.encoder=impala_cnn needs image observations [C, H, W]; 'ant' observes a state vector",
    ),
    (
        ["env=toy", "env.options.kind=image", "~env.options.dim", "policy.encoder=nature_cnn"],
        "policy.encoder=nature_cnn needs frames of at least 36x36",
    ),
    (["env=pong", "policy.encoder=vit"], "policy: encoder 'vit' unknown; choose one of: auto, mlp, nature_cnn"),
    (["env=pong", "policy.cpu_bf16=yes"], "policy: cpu_bf16 'yes' unknown; choose one of: auto, always, never"),
    (["env=ant", "policy.cpu_bf16=always"], "policy.cpu_bf16=always applies to CNN encoders only, and this policy's"),
    (["env=ant", "env.backend=bullet"], "env.backend='bullet' is unknown"),
    (["env=toy", "env.backend=mujoco"], "env 'toy' runs only on backend 'toy'"),
    (["env=ant", "env.num_envs=-4"], "env.num_envs=-4 must be a non-negative int"),
    (
        ["env=ant", "env.num_envs=10", "sampler.num_splits=4", "sampler.num_slots=8"],
        "env.num_envs=10 must be divisible by sampler.num_splits=4; try env.num_envs=12",
    ),
    (["env=ant", "sampler.rollout_len=0"], "sampler.rollout_len must be a positive int, got 0"),
    # recurrent policies (docs/recurrent.md)
    (["env=ant", "policy.rnn=rnn"], "policy: rnn 'rnn' unknown; choose one of: none, gru, lstm"),
    (["env=ant", "policy.memory=trial"], "memory=trial (RL²) needs a recurrent policy: set rnn=gru"),
    (["env=recall", "policy.memory=trial"], "env 'toy' has no trials (it never marks a trial end); use an env with"),
    (["env=ant", "policy.rnn=gru", "policy.memory=trial"], "env 'ant' has no trials"),
    (
        ["env=ant", "policy.rnn=gru", "env.num_envs=24", "learner.num_minibatches=8"],  # 12 columns, 8 | 4096 steps
        "learner.num_minibatches=8 must divide the batch's 12 env columns (env.num_envs/sampler.num_splits): a "
        "recurrent policy's minibatches are whole env columns (each re-run from its stored state); try "
        "learner.num_minibatches=6",
    ),
    (
        ["env=recall", "replay.ratio=0.5", "replay.segment_envs=4", "replay.burn_in=16"],
        "replay.burn_in=16 must be shorter than the segment it burns in (sampler.rollout_len=16 steps), or nothing "
        "is left to train on; try replay.burn_in=4",
    ),
    (["env=recall", "replay.burn_in=4"], "replay.burn_in=4 applies to replayed segments, and replay is off"),
    (
        ["env=toy", "replay.ratio=0.5", "replay.segment_envs=4", "replay.burn_in=4"],
        "replay.burn_in=4 refreshes a recurrent state, and policy.rnn=none",
    ),  # fmt: skip
    (["env=recall", "replay.ratio=0.5", "replay.priority_eta=2"], "replay.priority_eta must be in [0, 1]"),
    (
        ["env=ant", "env.num_envs=8", "sampler.rollout_len=10", "learner.num_minibatches=3"],
        "learner.num_minibatches=3 must divide the batch of 40 env steps",
    ),
    (["env=ant", "run.total_env_steps=-5"], "run.total_env_steps=-5"),
    (["env=ant", "run.mode=parallel"], "run.mode='parallel' is unknown; choose one of: auto, serial, async"),
    (["env=ant", "run.device=cuda"], "torch sees no CUDA device; use run.device=cpu"),
    (["env=ant", "+env.options.ctrl_cost=1"], "env.options has unknown key(s) ['ctrl_cost']"),
    (["env=toy", "+env.options.bogus=1"], "unknown key(s) ['bogus'] for env 'toy'"),
    (["env=ant", "learner.lr=-1"], "learner: lr must be a positive number"),
    (["env=pong", "learner.entropy_schedule=cosine"], "entropy_schedule 'cosine' unknown; use constant or linear"),
    (["env=ant", "policy.activation=swish"], "policy: activation 'swish' unknown"),
    (["env=ant", "logging.progress=fancy"], "logging.progress='fancy' is unknown"),
    (["env=ant", "run.checkpoint_interval_s=0"], "run.checkpoint_interval_s=0"),
]


#: Options a backend's make() rejects, which resolve() must reject first (with the config's spelling of the key and
#: the fix): (overrides, fragment of the ConfigError, (name, backend, options) that make() rejects the same way).
BACKEND_BAD = [
    (
        ["env=ant", "env.backend=envpool", "+env.options.contacts=feet"],
        "env.options.contacts='feet' is not supported by the envpool backend for 'ant' (EnvPool's Ant-v5 has no "
        "setting for it); use env.backend=mujoco, or leave contacts at its default 'all'",
        ("ant", "envpool", {"contacts": "feet"}),
    ),
    (
        ["env=ant", "env.backend=envpool", "+env.options.solver_iterations=2"],
        "env.options.solver_iterations=2 is not supported by the envpool backend",
        ("ant", "envpool", {"solver_iterations": 2}),
    ),
    (
        ["env=hopper", "env.backend=envpool", "+env.options.healthy_z_range=[0.7,2.0]"],
        "env.options.healthy_z_range=[0.7, 2.0] is not supported by the envpool backend for 'hopper' (EnvPool has "
        "no healthy_z_max)",
        ("hopper", "envpool", {"healthy_z_range": (0.7, 2.0)}),
    ),
    (
        ["env=ant", "env.backend=envpool", "+env.options.include_cfrc_ext_in_observation=false"],
        "unless contact_cost_weight=0",
        ("ant", "envpool", {"include_cfrc_ext_in_observation": False}),
    ),
    (
        ["env=ant", "env.backend=envpool", "+env.options.max_episode_steps=null"],
        "env.options.max_episode_steps=None is not supported by the envpool backend (EnvPool needs a time limit)",
        ("ant", "envpool", {"max_episode_steps": None}),
    ),
    (
        ["env=ant", "env.backend=envpool", "+env.options.step_timeout_s=5"],
        "step_timeout_s is an option of the mujoco backend: use env.backend=mujoco, or drop step_timeout_s",
        ("ant", "envpool", {"step_timeout_s": 5}),
    ),
    (
        ["env=ant", "env.backend=mujoco", "+env.options.xla_opt_level=0"],
        "env.options has unknown key(s) ['xla_opt_level'] for env 'ant' on the mujoco backend; xla_opt_level is an "
        "option of the mjx backend: use env.backend=mjx, or drop xla_opt_level",
        ("ant", "mujoco", {"xla_opt_level": 0}),
    ),
    (
        ["env=hopper", "+env.options.precision=float32"],  # backend auto = mujoco on the CPU
        "precision is an option of the mjx backend: use env.backend=mjx",
        ("hopper", "mujoco", {"precision": "float32"}),
    ),
    (
        ["env=ant", "env.backend=mjx", "+env.options.precision=float64"],  # jax_enable_x64 is off in the tests
        "env.options.precision='float64' needs 64-bit JAX, which is off in this process (jax.config.jax_enable_x64 "
        "is False); set JAX_ENABLE_X64=1 in the environment",
        ("ant", "mjx", {"precision": "float64"}),
    ),
    (
        ["env=ant", "env.backend=mjx", "+env.options.precision=float16"],
        "env.options (mjx backend): precision must be 'float32' or 'float64', got 'float16'",
        ("ant", "mjx", {"precision": "float16"}),
    ),
    (
        ["env=ant", "env.backend=mjx", "+env.options.solver=pgs"],
        "env.options (mjx backend): solver must be one of ['cg', 'newton'] or None, got 'pgs'",
        ("ant", "mjx", {"solver": "pgs"}),
    ),
    (
        ["env=ant", "env.backend=mjx", "+env.options.xla_opt_level=fast"],
        "env.options.xla_opt_level='fast' must be an int >= 0 or None (XLA's default)",
        ("ant", "mjx", {"xla_opt_level": "fast"}),
    ),
    (
        ["env=ant", "env.backend=warp", "+env.options.nconmax=0"],
        "env.options.nconmax=0 must be an int >= 1 or None (sized per task)",
        ("ant", "warp", {"nconmax": 0}),
    ),
    (
        ["env=ant", "env.backend=warp", "+env.options.solver=pgs"],
        "env.options (warp backend): solver must be one of ['cg', 'newton'] or None, got 'pgs'",
        ("ant", "warp", {"solver": "pgs"}),
    ),
    (
        ["env=ant", "env.backend=warp", "+env.options.xla_opt_level=0"],
        "xla_opt_level is an option of the mjx backend: use env.backend=mjx, or drop xla_opt_level",
        ("ant", "warp", {"xla_opt_level": 0}),
    ),
    (
        ["env=ant", "env.backend=mujoco", "+env.options.njmax=64"],
        "njmax is an option of the warp backend: use env.backend=warp, or drop njmax",
        ("ant", "mujoco", {"njmax": 64}),
    ),
    (
        ["env=ant", "+env.options.frame_skip=0"],
        "env.options.frame_skip=0 must be an int >= 1",
        ("ant", "mujoco", {"frame_skip": 0}),
    ),
    (
        ["env=ant", "+env.options.solver_iterations=many"],
        "env.options.solver_iterations='many' must be an int >= 0 or None (the model's own)",
        ("ant", "mujoco", {"solver_iterations": "many"}),
    ),
    (
        ["env=ant", "+env.options.step_timeout_s=-1"],
        "env.options (mujoco backend): step_timeout_s must be a positive number of seconds, got -1",
        ("ant", "mujoco", {"step_timeout_s": -1}),
    ),
    (
        ["env=ant", "+env.options.caller_steps=sometimes"],
        "env.options (mujoco backend): caller_steps must be true or false, got 'sometimes'",
        ("ant", "mujoco", {"caller_steps": "sometimes"}),
    ),
    (
        ["env=ant", "+env.options.worker_nice=-5"],
        "env.options (mujoco backend): worker_nice must be an int from 0 to 19, got -5",
        ("ant", "mujoco", {"worker_nice": -5}),
    ),
    (
        ["env=ant", "+env.options.pin_workers=2"],
        "env.options (mujoco backend): pin_workers must be true or false, got 2",
        ("ant", "mujoco", {"pin_workers": 2}),
    ),
    (
        ["env=ant", "+env.options.kernel=numba"],
        "env.options (mujoco backend): kernel must be 'compiled' or 'python', got 'numba'",
        ("ant", "mujoco", {"kernel": "numba"}),
    ),
    (
        ["env=ant", "+env.options.cone=round"],
        "env.options (mujoco backend): cone must be one of ['elliptic', 'pyramidal']",
        ("ant", "mujoco", {"cone": "round"}),
    ),
    (
        ["env=toy", "env.options.dim=0"],
        "env.options (toy backend): toy option dim must be a positive int, got 0",
        ("toy", "toy", {"dim": 0}),
    ),
    (
        ["env=toy", "+env.options.num_states=4"],  # the toy preset is kind=continuous
        "unknown key(s) ['num_states'] for env 'toy' on the toy backend (num_states only apply to another kind)",
        ("toy", "toy", {"kind": "continuous", "num_states": 4}),
    ),
    (
        ["env.name=gymnasium:Pendulum-v1", "+env.options.vectorization=threads"],
        "env.options (gymnasium backend): vectorization must be 'sync' or 'async', got 'threads'",
        ("gymnasium:Pendulum-v1", "gymnasium", {"vectorization": "threads"}),
    ),
    (
        ["env.name=gymnasium:NoSuchEnv-v0"],
        "env.name='gymnasium:NoSuchEnv-v0': gymnasium has no env 'NoSuchEnv-v0'",
        ("gymnasium:NoSuchEnv-v0", "gymnasium", {}),
    ),
    (
        ["env.name=gymnasium:sf_no_such_module:Foo-v0"],
        "env.name='gymnasium:sf_no_such_module:Foo-v0': could not import module 'sf_no_such_module'",
        ("gymnasium:sf_no_such_module:Foo-v0", "gymnasium", {}),
    ),
]


@pytest.mark.parametrize("overrides, message, make_args", BACKEND_BAD)
def test_what_make_rejects_resolve_rejects_first(overrides, message, make_args):
    from sample_fast.envs import EnvError, make

    with pytest.raises(ConfigError) as info:
        resolve(_compose(*overrides), num_cores=2, cuda=False)
    assert message in str(info.value)
    name, backend, options = make_args
    with pytest.raises(EnvError) as made:  # the backend's own check, before it builds anything
        make(name, 2, backend=backend, device="cpu", **options)
    key = list(options)[-1] if options else name.rsplit(":", 1)[-1]  # the option or env id both messages name
    assert key in str(made.value)


def test_the_right_backend_takes_the_options_the_wrong_one_rejects():
    cfg = resolve(_compose("env=ant", "env.backend=mujoco", "+env.options.contacts=feet",
                           "+env.options.solver_iterations=2"), num_cores=2, cuda=False)  # fmt: skip
    assert cfg.env.options == {"contacts": "feet", "solver_iterations": 2}
    mjx_options = ["+env.options.xla_opt_level=0", "+env.options.solver=cg", "+env.options.precision=float32"]
    cfg = resolve(_compose("env=ant", "env.backend=mjx", *mjx_options), num_cores=2, cuda=False)
    assert (cfg.env.backend, cfg.env.options) == ("mjx", {"xla_opt_level": 0, "solver": "cg", "precision": "float32"})
    cfg = resolve(_compose("env=ant", "env.backend=envpool", "+env.options.thread_affinity_offset=0"), 2, False)
    assert cfg.env.options == {"thread_affinity_offset": 0}


def test_float64_mjx_is_accepted_with_64_bit_jax():
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        cfg = resolve(_compose("env=ant", "env.backend=mjx", "+env.options.precision=float64"), 2, False)
        assert cfg.env.options == {"precision": "float64"}
    finally:
        jax.config.update("jax_enable_x64", before)


def test_model_params_are_rejected_by_the_trainer():
    # a per-env [num_envs, ...] array cannot fit both a sampler split (num_envs / num_splits envs) and the 1-env probe
    with pytest.raises(ConfigError, match=r"env.options.model_params is not supported by the trainer.*drop it"):
        resolve(_compose("env=ant", "+env.options.model_params={body_mass:[[1.0]]}"), num_cores=2, cuda=False)


def test_gymnasium_module_colon_id_resolves(tmp_path, monkeypatch):
    """``gymnasium:<module>:<id>`` (gymnasium's own convention): resolve imports the module, which registers the id."""
    import gymnasium

    module, env_id = "sf_test_config_envs", "SampleFastConfigPendulum-v0"
    (tmp_path / f"{module}.py").write_text(
        f"import gymnasium\ngymnasium.register({env_id!r}, "
        "entry_point='gymnasium.envs.classic_control.pendulum:PendulumEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = resolve(_compose(f"env.name=gymnasium:{module}:{env_id}", "env.num_envs=4"), num_cores=2, cuda=False)
        assert (cfg.env.backend, cfg.env.num_envs) == ("gymnasium", 4) and env_id in gymnasium.registry
    finally:
        gymnasium.registry.pop(env_id, None)
        sys.modules.pop(module, None)


@pytest.mark.parametrize("overrides,message", [b for b in BAD if b[1] is not None])
def test_bad_config_is_rejected_with_its_fix(overrides, message):
    with pytest.raises(ConfigError) as info:
        resolve(_compose(*overrides), num_cores=2, cuda=False)
    assert message in str(info.value)


def test_the_learners_minibatch_suggestion_divides():
    with pytest.raises(ConfigError, match=r"try learner.num_minibatches=(\d+)") as info:
        resolve(_compose("env=ant", "env.num_envs=8", "sampler.rollout_len=10", "learner.num_minibatches=3"), 2, False)
    suggested = int(re.search(r"try learner.num_minibatches=(\d+)", str(info.value)).group(1))
    assert 40 % suggested == 0 and suggested in (2, 4)


def test_typo_in_override_key_names_the_section():
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as info:
        _compose("env=ant", "learner.lrr=1e-4")
    text = str(info.value) + str(info.value.__cause__)
    assert "lrr" in text and "LearnerConfig" in text


@pytest.mark.timeout(60)
def test_cli_rejects_bad_config_before_writing_anything(tmp_path):
    """From a foreign cwd (so the configs come from the installed package), a bad config exits with status 2."""
    rdir = tmp_path / "run"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "sample_fast.train",
            "env=toy",
            "env.num_envs=10",
            "sampler.num_splits=4",
            "sampler.num_slots=8",
            f"run.dir={rdir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "env.num_envs=10 must be divisible by sampler.num_splits=4; try env.num_envs=12" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run dir, no hydra outputs/


def test_atari_presets_are_cleanrl_ppo_atari():
    """CleanRL's ppo_atari.py (v1.0) constants, written out: lr 2.5e-4 annealed, gamma 0.99, gae_lambda 0.95,
    clip_coef 0.1 (ratio and value), ent_coef 0.01 (0.005 for Pong), vf_coef 0.5, max_grad_norm 0.5, update_epochs 4,
    num_minibatches 4 of its 8 envs x 128 steps (minibatches of 256 samples: ours are 8 of a 2 x 16-env split's
    128 x 16 batch on 2 cores), num_steps 128; plus the Nature CNN's 512 ReLU units on pixels scaled by 1/255."""
    for env in ATARI_PRESETS:
        cfg = resolve(_compose(*_preset(env)), num_cores=2, cuda=False)
        lrn, pol = cfg.learner, cfg.policy
        assert (lrn.lr, lrn.lr_schedule, lrn.gamma, lrn.lam) == (2.5e-4, "linear", 0.99, 0.95), env
        # Pong halves the entropy bonus (configs/env/pong.yaml, benchmarks/results/train_pong_ent005/)
        entropy_coef = 0.005 if env == "pong" else 0.01
        assert (lrn.clip_eps, lrn.value_clip, lrn.entropy_coef, lrn.value_coef) == (0.1, 0.1, entropy_coef, 0.5), env
        assert (lrn.max_grad_norm, lrn.num_epochs, lrn.num_minibatches, lrn.kl_coef) == (0.5, 4, 8, 0.0), env
        assert batch_size(cfg) // lrn.num_minibatches == 8 * 128 // 4, env  # CleanRL's minibatch of 256 samples
        assert (cfg.sampler.rollout_len, lrn.recompute_targets) == (128, "batch"), env
        assert (pol.encoder, pol.hidden_sizes, pol.activation, pol.normalize_obs) == ("auto", [512], "relu", False)
        assert (cfg.env.device, cfg.run.mode, cfg.run.device) == ("cpu", "async", "cpu")
        assert cfg.env.options == {}  # the env's v5 defaults: sticky actions 0.25, full games (no episodic life)
        # CleanRL's reward clipping: the raw score change clipped to [-1, 1], no scaling
        assert (lrn.raw_reward_clip, lrn.scale_rewards) == (1.0, False), env


def test_atari_sizes_follow_the_learner_device():
    # CPU learner: 16 envs per core; CUDA learner (the emulator still on the CPU): 32 per core, async mode.
    assert resolve(_compose("env=pong"), num_cores=2, cuda=False).env.num_envs == 32
    assert resolve(_compose("env=pong"), num_cores=3, cuda=False).env.num_envs == 48
    gpu = resolve(_compose("env=pong"), num_cores=8, cuda=True)
    assert (gpu.env.num_envs, gpu.env.device, gpu.run.device, gpu.run.mode) == (256, "cpu", "cuda", "async")
    fixed = resolve(_compose("env=pong", "env.num_envs=8", "env.backend=ale"), num_cores=2, cuda=False)
    assert (fixed.env.num_envs, fixed.env.backend) == (8, "ale")


def test_the_sampler_acts_where_its_policy_is_cheapest():
    # A CNN policy acts on the learner's GPU (a Nature CNN on one CPU thread would set a GPU run's pace); an MLP on the
    # CPU (async, the simulator there too); serial mode acts with the learner's policy on run.device.
    assert resolve(_compose("env=pong"), num_cores=8, cuda=True).sampler.device == "cuda"
    assert resolve(_compose("env=pong", "policy.encoder=impala_cnn"), num_cores=8, cuda=True).sampler.device == "cuda"
    assert resolve(_compose("env=pong"), num_cores=2, cuda=False).sampler.device == "cpu"
    pong_mlp = _compose("env=pong", "policy.encoder=mlp", "policy.normalize_obs=true")
    assert resolve(pong_mlp, num_cores=8, cuda=True).sampler.device == "cpu"
    ant_cpu_sim = resolve(_compose("env=ant", "env.backend=mujoco"), num_cores=8, cuda=True)
    assert (ant_cpu_sim.run.mode, ant_cpu_sim.run.device, ant_cpu_sim.sampler.device) == ("async", "cuda", "cpu")
    ant_gpu_sim = resolve(_compose("env=ant"), num_cores=8, cuda=True)
    assert (ant_gpu_sim.run.mode, ant_gpu_sim.sampler.device) == ("serial", "cuda")
    # explicit choices are kept
    assert resolve(_compose("env=pong", "sampler.device=cpu"), num_cores=8, cuda=True).sampler.device == "cpu"
    assert resolve(_compose("env=pong", "sampler.device=cuda:0"), num_cores=8, cuda=True).sampler.device == "cuda:0"


@pytest.mark.parametrize(
    "overrides, cuda, match",
    [
        (["sampler.device=gpu"], False, r"sampler\.device='gpu': not a device the sampler can act on; use auto, cpu"),
        (["sampler.device=cuda"], False, r"sampler\.device='cuda' but torch sees no CUDA device; use sampler\.device"),
        (["sampler.device=cuda", "run.mode=serial", "run.device=cpu"], True,
         r"run\.mode=serial acts with the learner's policy on run\.device=cpu: drop sampler\.device"),
    ],
)  # fmt: skip
def test_bad_sampler_devices_name_the_fix(overrides, cuda, match):
    with pytest.raises(ConfigError, match=match):
        resolve(_compose("env=pong", *overrides), num_cores=8, cuda=cuda)


def test_a_cpu_atari_learner_gets_every_core_and_an_ant_learner_half():
    # The CNN learner sets the pace of a CPU Atari run; the MLP learner of a MuJoCo run shares with the simulator.
    assert resolve(_compose("env=pong"), num_cores=2, cuda=False).runner.learner_threads == 2
    assert resolve(_compose("env=pong"), num_cores=6, cuda=False).runner.learner_threads == 6
    assert resolve(_compose("env=pong"), num_cores=8, cuda=True).runner.learner_threads == 4  # CUDA: half
    assert resolve(_compose("env=ant"), num_cores=2, cuda=False).runner.learner_threads == 1
    assert (
        resolve(_compose("env=pong", "runner.learner_threads=1"), num_cores=2, cuda=False).runner.learner_threads == 1
    )


def test_pong_with_an_mlp_policy_resolves_with_the_normaliser():
    cfg = resolve(_compose("env=pong", "policy.encoder=mlp", "policy.normalize_obs=true"), num_cores=2, cuda=False)
    assert cfg.policy.encoder == "mlp"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["runner.learner_sched=low"], r"runner\.learner_sched must be one of normal, batch, idle, got 'low'"),
        (["runner.learner_sched=idle", "run.mode=serial"],
         r"runner\.learner_sched=idle needs run\.mode=async: .*use runner\.learner_sched=normal"),
    ],
)  # fmt: skip
def test_bad_learner_sched_names_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        resolve(_compose("env=ant", *overrides), num_cores=2, cuda=False)
    assert resolve(_compose("env=ant", "runner.learner_sched=idle"), num_cores=2, cuda=False).runner.learner_sched == (
        "idle"
    )
