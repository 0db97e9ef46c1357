"""Tests of the ``envpool`` backend: its same-step reset against raw EnvPool, semantics against gymnasium's v5 envs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

envpool = pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool)")

import gymnasium  # noqa: E402
from sample_fast.envs import EnvError, make  # noqa: E402
from sample_fast.envs.tasks import ANT_V4_OPTIONS, TASKS  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_specs_match_gymnasium(task):
    ref = gymnasium.make(TASKS[task].gymnasium_id)
    with make(task, 2, backend="envpool", num_threads=1) as env:
        assert env.backend == "envpool"
        assert env.observation_spec.shape == ref.observation_space.shape
        assert env.action_spec.shape == ref.action_space.shape and env.action_spec.dtype == torch.float32
        np.testing.assert_array_equal(env.action_spec.low.numpy(), ref.action_space.low)
        np.testing.assert_array_equal(env.action_spec.high.numpy(), ref.action_space.high)
        assert env.max_episode_steps == 1000 and env.frame_skip == TASKS[task].frame_skip
        obs, _ = env.reset()
        assert obs.shape == (2, *ref.observation_space.shape) and obs.dtype == torch.float32
        res = env.step(torch.zeros(2, *ref.action_space.shape))
        assert res.reward.shape == (2,) and res.reward.dtype == torch.float32
        assert res.terminated.dtype == torch.bool and res.truncated.dtype == torch.bool
    ref.close()


def test_ant_v4_options_give_the_27_dim_observation():
    # healthy_reward_always (v4's terminal-step reward rule) has no EnvPool option; the observation options map.
    v4_obs = {k: v for k, v in ANT_V4_OPTIONS.items() if k != "healthy_reward_always"}
    with make("ant", 2, backend="envpool", **v4_obs) as env:
        assert env.observation_spec.shape == (27,)


def test_same_step_reset_equals_raw_envpool_minus_its_discarded_step():
    """Our trajectory is raw EnvPool's with the reset step (whose action EnvPool discards) cut out.

    Raw EnvPool with max_episode_steps=H: steps 1..H are episode 1, step H+1 ignores its action and returns the
    reset observation (reward 0), steps H+2.. are episode 2. Ours: steps 1..H are episode 1 and step H returns the
    reset observation as obs (final_obs = raw step H's obs); our step H+1 runs our action k on episode 2, matching
    raw step H+2. So no transition spans two episodes and no action is discarded.
    """
    n, horizon, seed = 3, 4, 9
    opts = {"max_episode_steps": horizon, "num_threads": 1}
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (2 * horizon + 2, n, 3)).astype(np.float32)
    raw = envpool.make("Hopper-v5", env_type="gymnasium", num_envs=n, seed=seed, **opts)
    raw_obs0, _ = raw.reset()
    raw_steps = []
    for k in range(2 * horizon + 2):
        # The raw pool needs one extra (discarded) action at each reset step: give it garbage there.
        raw_steps.append(raw.step(actions[k] if k < horizon else (actions[k - 1] if k > horizon else -actions[k])))
    raw.close()
    # Raw steps: index 0..H-1 = episode 1; index H = reset (discarded action); index H+1.. = episode 2.
    with make("hopper", n, backend="envpool", seed=seed, **opts) as env:
        obs, _ = env.reset()
        np.testing.assert_array_equal(obs.numpy(), raw_obs0.astype(np.float32))
        returns = np.zeros(n)
        for k in range(2 * horizon):
            res = env.step(torch.from_numpy(actions[k]))
            raw_k = k if k < horizon else k + 1
            r_obs, r_rew, r_term, r_trunc, _ = raw_steps[raw_k]
            np.testing.assert_array_equal(res.reward.numpy(), r_rew)
            assert (res.reward != 0).all()  # EnvPool's reset step pays exactly 0; ours never is that step
            np.testing.assert_array_equal(res.terminated.numpy(), r_term)
            np.testing.assert_array_equal(res.truncated.numpy(), r_trunc)
            np.testing.assert_array_equal(res.info["final_obs"].numpy(), r_obs.astype(np.float32))
            returns += r_rew
            if (k + 1) % horizon == 0:
                assert res.truncated.all() and not res.terminated.any()
                reset_obs = raw_steps[raw_k + 1][0]  # what raw EnvPool returns on its reset step
                np.testing.assert_array_equal(res.obs.numpy(), reset_obs.astype(np.float32))
                np.testing.assert_allclose(res.info["episode_return"].numpy(), returns, rtol=1e-5)
                assert res.info["episode_length"].tolist() == [horizon] * n
                returns[:] = 0
            else:
                assert not res.truncated.any()
                assert torch.equal(res.obs, res.info["final_obs"])
                assert res.info["episode_length"].tolist() == [0] * n


def test_matches_gymnasium_hopper_from_the_same_state():
    """Start gymnasium's Hopper-v5 from EnvPool's initial state; obs and reward agree step by step (option mapping
    of ctrl_cost_weight and healthy_reward included)."""
    opts = {"ctrl_cost_weight": 0.05, "healthy_reward": 2.0}
    with make("hopper", 1, backend="envpool", seed=3, **opts) as env:
        obs, _ = env.reset()
        ref = gymnasium.make("Hopper-v5", **opts)
        ref.reset(seed=0)
        o = obs[0].double().numpy()
        ref.unwrapped.set_state(np.concatenate([[0.0], o[:5]]), o[5:])  # x does not enter the dynamics
        rng = np.random.default_rng(1)
        for _ in range(20):
            a = rng.uniform(-1, 1, 3).astype(np.float32)
            res = env.step(torch.from_numpy(a)[None])
            r_obs, r_rew, r_term, r_trunc, _ = ref.step(a.astype(np.float64))
            np.testing.assert_allclose(res.info["final_obs"][0].numpy(), r_obs, rtol=1e-4, atol=1e-4)
            assert res.reward.item() == pytest.approx(r_rew, rel=1e-4, abs=1e-4)
            assert bool(res.terminated[0]) == r_term and bool(res.truncated[0]) == r_trunc
            if r_term:
                break
        ref.close()


def test_terminated_is_not_truncated():
    # healthy_z_range (1.3, inf): Hopper starts at z ~1.25, so every env is unhealthy after its first step.
    # Given as a list, as it arrives from a YAML config.
    with make("hopper", 3, backend="envpool", healthy_z_range=[1.3, float("inf")], max_episode_steps=5) as env:
        env.reset()
        for _ in range(3):  # and again right after each same-step reset
            res = env.step(torch.zeros(3, 3))
            assert res.terminated.all() and not res.truncated.any()
            assert res.info["episode_length"].tolist() == [1, 1, 1]
            torch.testing.assert_close(res.info["episode_return"], res.reward)


def test_seeded_determinism_and_reset_seed():
    def run(seed, reset_seed=None):
        with make("hopper", 2, backend="envpool", seed=seed, max_episode_steps=3, num_threads=2) as env:
            out = [env.reset(seed=reset_seed)[0]]
            out += [env.step(torch.full((2, 3), 0.3)).obs for _ in range(5)]
        return torch.stack(out)

    assert torch.equal(run(4), run(4))
    assert not torch.equal(run(4), run(5))
    assert torch.equal(run(5, reset_seed=4), run(4))


@pytest.mark.parametrize(
    "task, options, fragment",
    [
        ("ant", {"contacts": "feet"}, "option contacts='feet' is not supported by the envpool backend"),
        ("ant", {"main_body": 2}, "option main_body=2 is not supported by the envpool backend"),
        ("ant", {"include_cfrc_ext_in_observation": False}, "unless contact_cost_weight=0"),
        ("hopper", {"healthy_z_range": (0.7, 2.0)}, "no healthy_z_max"),
        ("humanoid", {"include_cvel_in_observation": False}, "include_cvel_in_observation"),
        ("ant", {"solver_iterations": 2}, "solver_iterations"),
        ("ant", {"no_such_option": 1}, "unknown option.*valid options"),
        ("ant", {"num_threads": 0}, "num_threads must be a positive int"),
    ],
)
def test_unsupported_options(task, options, fragment):
    with pytest.raises(EnvError, match=fragment):
        make(task, 2, backend="envpool", **options)


def test_close_releases_the_pool():
    env = make("hopper", 2, backend="envpool")
    env.close()
    assert env._pool is None
    with pytest.raises(EnvError, match="closed"):
        env.step(torch.zeros(2, 3))
