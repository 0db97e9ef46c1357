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
GROUPS = ("env", "algo", "sampler", "logging")
ENV_PRESETS = sorted(p.stem for p in (CONFIG_DIR / "env").glob("*.yaml"))
PYTHON = sys.executable
PRESET_TASK = {"ant_v4": "ant"}  # presets whose name is not their task's


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
    assert set(ENV_PRESETS) == {"ant", "halfcheetah", "hopper", "walker2d", "humanoid", "toy", "ant_v4"}
    for group in GROUPS:
        assert _options(group), f"config group {group} is empty"


@pytest.mark.parametrize("env", ENV_PRESETS)
def test_every_group_option_composes_and_resolves(env):
    for group in ("algo", "sampler", "logging"):
        for option in _options(group):
            cfg = resolve(_compose(f"env={env}", f"{group}={option}"), num_cores=2, cuda=False)
            assert isinstance(cfg, TrainConfig)
            assert cfg.env.name == PRESET_TASK.get(env, env)
            assert cfg.env.num_envs % cfg.sampler.num_splits == 0
            assert batch_size(cfg) % cfg.learner.num_minibatches == 0


@pytest.mark.parametrize("env", [e for e in ENV_PRESETS if e != "toy"])
def test_auto_sizes_cpu_and_gpu(env):
    # CPU, 2 cores: MuJoCo C, async, 64 envs per core, every core simulates, learner gets half the cores.
    cpu = resolve(_compose(f"env={env}"), num_cores=2, cuda=False)
    assert (cpu.env.backend, cpu.env.device, cpu.run.mode, cpu.run.device) == ("mujoco", "cpu", "async", "cpu")
    assert (cpu.env.num_envs, cpu.env.num_threads, cpu.sampler.learner_threads) == (128, 2, 1)
    # CUDA: MJX on the GPU, serial (sim, inference and learning share the device), 4096 envs.
    gpu = resolve(_compose(f"env={env}"), num_cores=8, cuda=True)
    assert (gpu.env.backend, gpu.env.device, gpu.run.mode, gpu.run.device) == ("mjx", "cuda", "serial", "cuda")
    assert gpu.env.num_envs == 4096 and gpu.sampler.learner_threads == 4
    # explicit values are kept
    fixed = resolve(_compose(f"env={env}", "env.num_envs=24", "run.mode=serial"), num_cores=2, cuda=False)
    assert (fixed.env.num_envs, fixed.run.mode, fixed.sampler.learner_threads) == (24, "serial", 1)


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


def _component_configs() -> dict[str, tuple[type, type, str]]:
    """TrainConfig section -> (its dataclass, the component whose constructor takes it, that parameter's name)."""
    from sample_fast.learner import Learner
    from sample_fast.policy import ActorCritic
    from sample_fast.runner import Runner

    return {
        "policy": (ActorCritic, "cfg"),
        "learner": (Learner, "cfg"),
        "sampler": (Runner, "sampler_cfg"),
    }


def test_sections_match_component_constructors():
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    hints = typing.get_type_hints(TrainConfig)
    try:
        components = _component_configs()
    except ImportError as e:
        pytest.skip(f"component not landed: {e}")
    for section, (component, param) in components.items():
        assert section in fields
        expected = typing.get_type_hints(component.__init__)[param]
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
        cfg = resolve(_compose(f"env={env}"), num_cores=2, cuda=False)
        if cfg.env.backend == "toy":
            with make("toy", 2, **cfg.env.options) as e:  # the env's own option check
                assert e.max_episode_steps == cfg.env.options["max_episode_steps"]


BAD = [
    (["env.name=pong"], "env.name='pong' is unknown"),
    (["env=ant", "env.backend=bullet"], "env.backend='bullet' is unknown"),
    (["env=toy", "env.backend=mujoco"], "env 'toy' runs only on backend 'toy'"),
    (["env=ant", "env.num_envs=-4"], "env.num_envs=-4 must be a non-negative int"),
    (
        ["env=ant", "env.num_envs=10", "sampler.num_splits=4", "sampler.num_slots=8"],
        "env.num_envs=10 must be divisible by sampler.num_splits=4; try env.num_envs=12",
    ),
    (["env=ant", "sampler.rollout_len=0"], "sampler.rollout_len must be a positive int, got 0"),
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
    (["env=ant", "policy.activation=swish"], "policy: activation 'swish' unknown"),
    (["env=ant", "logging.progress=fancy"], "logging.progress='fancy' is unknown"),
    (["env=ant", "run.checkpoint_interval_s=0"], "run.checkpoint_interval_s=0"),
]


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
