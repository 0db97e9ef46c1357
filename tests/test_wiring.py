"""sample_fast.wiring: the one place components are built, used by the trainer, eval and the benchmark stages."""

import functools
import multiprocessing

import pytest
import torch
from sample_fast.envs import make

from sample_fast import wiring
from sample_fast.config import EnvConfig
from sample_fast.learner import LearnerConfig
from sample_fast.policy import PolicyConfig
from sample_fast.sampler import SamplerConfig
from sample_fast.trajectory_store import final_obs_capacity


def test_build_env_passes_threads_and_options_to_make():
    env = wiring.build_env(EnvConfig(name="hopper", backend="mujoco", num_threads=1, options={"frame_skip": 2}), 3)
    try:
        assert (env.num_envs, env.backend, env.frame_skip) == (3, "mujoco", 2)
        ref = make("hopper", 3, backend="mujoco", num_threads=1, frame_skip=2)
        try:
            assert env.observation_spec == ref.observation_spec and env.dt == ref.dt
        finally:
            ref.close()
    finally:
        env.close()


def test_on_cpu_simulator_keeps_what_mujoco_takes_and_drops_mjx_only_options():
    cfg = EnvConfig(
        name="ant",
        backend="mjx",
        device="cuda",
        options={"precision": "float32", "frame_skip": 5, "max_episode_steps": 100, "contacts": "feet"},
    )
    cpu = wiring.on_cpu_simulator(cfg)
    assert (cpu.backend, cpu.device) == ("mujoco", "cpu")
    # frame_skip and max_episode_steps are every task's, contacts is ant's own; precision is MJX's alone
    assert cpu.options == {"frame_skip": 5, "max_episode_steps": 100, "contacts": "feet"}
    assert cfg.options["precision"] == "float32" and cfg.backend == "mjx"  # the input is not modified
    specs = wiring.probe_specs(cfg)  # a 1-env mujoco copy, no JAX compile
    assert specs[0].shape == make("ant", 1, backend="mujoco", contacts="feet").observation_spec.shape


def test_build_store_sizes_the_side_table_from_truncation_limit():
    cfg = SamplerConfig(rollout_len=16, num_splits=1, num_slots=2)
    timed = make("toy", 4, max_episode_steps=5)  # truncates only at its limit: at most ceil(16 / 5) per env
    gym = make("gymnasium:CartPole-v1", 4)  # a gymnasium env may truncate at any step: the worst case, T per env
    try:
        assert wiring.build_store(timed, cfg).final_capacity == 4 * 4 == final_obs_capacity(16, 4, 5)
        assert gym.truncation_limit is None
        assert wiring.build_store(gym, cfg).final_capacity == 16 * 4
        # the async runner's shared store is sized the same way (it used max_episode_steps=500: room for 4 rows, not 64)
        shared = wiring.build_store(gym, cfg, shared=True, ctx=multiprocessing.get_context("spawn"))
        assert shared.final_capacity == 16 * 4
    finally:
        timed.close()
        gym.close()


def test_build_learner_restores_weights_and_counters():
    env = make("toy", 2)
    policy_fn = functools.partial(
        wiring.build_policy, env.observation_spec, env.action_spec, PolicyConfig(hidden_sizes=[8])
    )
    torch.manual_seed(0)
    first = wiring.build_learner(policy_fn(), LearnerConfig(), "cpu", total_env_steps=1000)
    first.policy_version = 7
    state = {"policy": first.policy.state_dict(), "learner": first.state_dict(), "rng": _rng()}
    torch.manual_seed(1)  # a differently initialised policy: the resumed weights must replace these
    second = wiring.build_learner(policy_fn(), LearnerConfig(), "cpu", total_env_steps=1000, resume_state=state)
    assert second.policy_version == 7
    for a, b in zip(first.policy.parameters(), second.policy.parameters(), strict=True):
        assert torch.equal(a, b)
    env.close()


def _rng() -> dict:
    from sample_fast.checkpoint import rng_state

    return rng_state()


def test_build_sampler_closes_its_envs_when_the_store_cannot_be_built():
    envs = [make("toy", 2), make("toy", 2)]
    bad = SamplerConfig(rollout_len=4, num_splits=2, num_slots=3)
    bad.rollout_len = 0  # past validation: the store's own check rejects it
    with pytest.raises(ValueError, match="rollout_len"):
        wiring.build_sampler(envs, object(), bad)
    assert all(env._closed for env in envs)
