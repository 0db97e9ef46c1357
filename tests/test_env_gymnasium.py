"""Tests of the ``gymnasium`` backend against single gymnasium envs stepped by hand (the independent reference)."""

from __future__ import annotations

import sys

import gymnasium
import numpy as np
import pytest
import torch
from sample_fast.envs import EnvError, make


def _reference(env_id: str, seed: int, **kwargs):
    env = gymnasium.make(env_id, **kwargs)
    obs, _ = env.reset(seed=seed)
    return env, obs


def test_specs_box_and_discrete():
    with make("gymnasium:Pendulum-v1", 3) as env:
        assert env.backend == "gymnasium" and env.env_id == "Pendulum-v1"
        assert env.observation_spec.shape == (3,) and env.observation_spec.dtype == torch.float32
        assert env.action_spec.shape == (1,) and env.action_spec.dtype == torch.float32
        assert env.action_spec.low.item() == -2.0 and env.action_spec.high.item() == 2.0
        assert env.max_episode_steps == 200 and env.dt == pytest.approx(0.05)
        obs, _ = env.reset()
        assert obs.shape == (3, 3) and obs.dtype == torch.float32
    with make("gymnasium:CartPole-v1", 2) as env:
        assert env.action_spec.shape == () and env.action_spec.dtype == torch.int64
        assert env.action_spec.num_actions == 2
        env.reset()
        res = env.step(torch.tensor([0, 1]))
        assert res.obs.shape == (2, 4) and res.reward.dtype == torch.float32 and res.terminated.dtype == torch.bool


def test_discrete_observations_are_one_hot():
    with make("gymnasium:FrozenLake-v1", 2, is_slippery=False) as env:
        assert env.observation_spec.shape == (16,)
        obs, _ = env.reset()
        assert torch.equal(obs, torch.nn.functional.one_hot(torch.tensor([0, 0]), 16).float())
        # Action 2 is "right": state 0 -> 1 on the non-slippery lake.
        obs = env.step(torch.tensor([2, 1])).obs  # 1 is "down": state 0 -> 4
        assert obs.argmax(-1).tolist() == [1, 4]


def test_matches_single_envs_through_truncation_and_reset():
    """Each row equals a single gymnasium env seeded seed + i, including final_obs and the reset after truncation."""
    n, seed, horizon = 3, 5, 4
    env = make("gymnasium:Pendulum-v1", n, seed=seed, max_episode_steps=horizon)
    obs, _ = env.reset()
    refs = [_reference("Pendulum-v1", seed + i, max_episode_steps=horizon) for i in range(n)]
    np.testing.assert_allclose(obs.numpy(), np.stack([o for _, o in refs]), rtol=1e-6)
    gen = torch.Generator().manual_seed(0)
    ref_returns = np.zeros(n)
    for t in range(1, 2 * horizon + 2):
        actions = torch.rand(n, 1, generator=gen) * 4 - 2
        res = env.step(actions)
        for i, (ref, _) in enumerate(refs):
            r_obs, r_rew, r_term, r_trunc, _ = ref.step(actions[i].numpy())
            ref_returns[i] += r_rew
            assert res.reward[i].item() == pytest.approx(r_rew, rel=1e-5)
            assert bool(res.terminated[i]) == r_term and bool(res.truncated[i]) == r_trunc
            np.testing.assert_allclose(res.info["final_obs"][i].numpy(), r_obs, rtol=1e-5, atol=1e-6)
            if r_trunc:
                assert res.info["episode_length"][i].item() == horizon
                assert res.info["episode_return"][i].item() == pytest.approx(ref_returns[i], rel=1e-5)
                ref_returns[i] = 0.0
                r_obs, _ = ref.reset()  # no seed: continues the env's generator, as the vector env does
            np.testing.assert_allclose(res.obs[i].numpy(), r_obs, rtol=1e-5, atol=1e-6)
        assert bool(res.truncated.all()) == (t % horizon == 0)
    env.close()


def test_terminated_not_truncated_cartpole():
    """Pushing left every step topples the pole: terminated (not truncated) at the step a single env says."""
    seed = 3
    ref, _ = _reference("CartPole-v1", seed)
    length = 0
    while True:
        length += 1
        _, _, term, trunc, _ = ref.step(0)
        assert not trunc
        if term:
            break
    with make("gymnasium:CartPole-v1", 1, seed=seed) as env:
        env.reset()
        for t in range(1, length + 1):
            res = env.step(torch.tensor([0]))
            assert bool(res.terminated[0]) == (t == length) and not res.truncated[0]
        assert res.info["episode_length"].item() == length
        assert res.info["episode_return"].item() == float(length)  # CartPole pays 1 per step
        assert not torch.equal(res.obs, res.info["final_obs"])
        # The new episode starts near the origin; the final observation had the pole far over.
        assert res.obs.abs().max() < 0.05 and res.info["final_obs"][0, 2].abs() > 0.2


@pytest.mark.timeout(60)
def test_async_equals_sync():
    kw = {"seed": 1, "max_episode_steps": 3}
    with (
        make("gymnasium:Pendulum-v1", 2, **kw) as sync,
        make("gymnasium:Pendulum-v1", 2, vectorization="async", **kw) as av,
    ):
        assert torch.equal(sync.reset()[0], av.reset()[0])
        for t in range(4):
            a = torch.full((2, 1), 0.5 * t - 1)
            av.send(a)  # the workers step while this process steps the sync copy
            s = sync.step(a)
            r = av.recv()
            for x, y in zip(s[:4], r[:4], strict=True):
                assert torch.equal(x, y)
            assert torch.equal(s.info["final_obs"], r.info["final_obs"])


def test_seeded_determinism_and_reset_seed():
    def run(seed, reset_seed=None):
        with make("gymnasium:Pendulum-v1", 2, seed=seed) as env:
            out = [env.reset(seed=reset_seed)[0]]
            out += [env.step(torch.ones(2, 1)).obs for _ in range(3)]
        return torch.stack(out)

    assert torch.equal(run(4), run(4))
    assert not torch.equal(run(4), run(5))
    assert torch.equal(run(5, reset_seed=4), run(4))


def test_close_closes_the_vector_env():
    env = make("gymnasium:CartPole-v1", 2)
    vec = env._vec
    env.close()
    assert vec.closed
    with pytest.raises(EnvError, match="closed"):
        env.reset()


class _MultiDiscreteEnv(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1, 1, (2,))
    action_space = gymnasium.spaces.MultiDiscrete([2, 3])


class _DictObsEnv(gymnasium.Env):
    observation_space = gymnasium.spaces.Dict({"a": gymnasium.spaces.Box(-1, 1, (2,))})
    action_space = gymnasium.spaces.Discrete(2)


gymnasium.register("SampleFastTest/MultiDiscrete-v0", entry_point=_MultiDiscreteEnv)
gymnasium.register("SampleFastTest/DictObs-v0", entry_point=_DictObsEnv)


@pytest.mark.parametrize(
    "name, options, fragment",
    [
        ("gymnasium:NoSuchEnv-v0", {}, r"no env 'NoSuchEnv-v0'.*pprint_registry"),
        ("gymnasium:", {}, "empty gymnasium id"),
        ("gymnasium:Pendulum-v1", {"gravity_typo": 1.0}, "rejected an option.*gravity_typo"),
        ("gymnasium:Pendulum-v1", {"vectorization": "threads"}, "vectorization must be 'sync' or 'async'"),
        ("gymnasium:SampleFastTest/MultiDiscrete-v0", {}, "MultiDiscrete action space"),
        ("gymnasium:SampleFastTest/DictObs-v0", {}, "Dict observation space.*FlattenObservation"),
    ],
)
def test_bad_input(name, options, fragment):
    with pytest.raises(EnvError, match=fragment):
        make(name, 2, **options)


def test_module_colon_id_imports_the_module_that_registers_it(tmp_path, monkeypatch):
    """gymnasium's own ``module:EnvId`` convention (gymnasium.make, make_vec): the module registers the id on import."""
    module, env_id = "sf_test_tmp_envs", "SampleFastTmpPendulum-v0"
    (tmp_path / f"{module}.py").write_text(
        "import gymnasium\n"
        f"gymnasium.register({env_id!r}, entry_point='gymnasium.envs.classic_control.pendulum:PendulumEnv', "
        "max_episode_steps=3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    assert env_id not in gymnasium.registry  # only the import below can register it
    try:
        with make(f"gymnasium:{module}:{env_id}", 2, seed=1) as env:
            assert module in sys.modules and env.env_id == env_id
            assert env.max_episode_steps == 3  # our registration's limit, not Pendulum-v1's 200
            env.reset()
            truncated = [env.step(torch.zeros(2, 1)).truncated.tolist() for _ in range(3)]
            assert truncated == [[False, False], [False, False], [True, True]]
    finally:
        gymnasium.registry.pop(env_id, None)
        sys.modules.pop(module, None)


def test_module_colon_id_with_a_missing_module_names_the_module():
    with pytest.raises(EnvError, match=r"could not import module 'sf_no_such_module'.*should register 'Foo-v0'"):
        make("gymnasium:sf_no_such_module:Foo-v0", 2)
    # the module imports but registers nothing under that id: the registry lookup names the id and the module
    with pytest.raises(EnvError, match=r"no env 'NoSuchEnv-v0' after importing 'json'"):
        make("gymnasium:json:NoSuchEnv-v0", 2)


def test_no_truncation_bound_is_assumed_for_gymnasium_envs():
    """A gymnasium env may truncate for its own reasons, so the trajectory store must size its final-obs table for
    the worst case (T rows per env); envs whose only truncation is the time limit report that limit."""
    from sample_fast.trajectory_store import final_obs_capacity

    with make("gymnasium:Pendulum-v1", 2, max_episode_steps=200) as env:
        assert env.max_episode_steps == 200 and env.truncation_limit is None
        assert final_obs_capacity(64, env.num_envs, env.truncation_limit) == 64 * 2
    with make("toy", 3, max_episode_steps=16) as toy:
        assert toy.truncation_limit == 16
        assert final_obs_capacity(64, toy.num_envs, toy.truncation_limit) == 3 * 4  # ceil(64 / 16) = 4 per env
