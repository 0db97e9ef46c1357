"""Third-party RL libraries driving our envs through the adapters: Stable-Baselines3 (``SB3VecEnv``), skrl 2.x
(the gymnasium adapter with the loop that passes ``final_obs``) and rl_games (``VecTaskEnv`` registered as its
vecenv). Each is checked against an independent expectation: SB3's own checker and its own ``DummyVecEnv`` over
single-env views; the bootstrap term SB3 and skrl actually applied at truncations, recomputed from the value net;
rl_games' own runner training on the env. They are optional test dependencies, pinned in the ``dev`` extra (CI
installs them); ``importorskip`` covers only an install without that extra.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from arm_robot import ARM_XML, arm_obs, arm_reward
from sample_fast.envs import TASKS, EnvError, make
from sample_fast.envs.adapters import GymnasiumSingleEnv
from sample_fast.envs.custom import register_robot


def _terminated(xp, p):
    return p.qpos[..., 0] > 0.01  # passed under +1 torque at step ~7


@pytest.fixture(scope="module")
def arm():
    # deterministic (no reset noise): a batch and single-env views of it step identically
    register_robot("client_arm", ARM_XML, arm_obs, arm_reward, _terminated, max_episode_steps=9, check_jax=False,
                   overwrite=True)  # fmt: skip
    yield "client_arm"
    TASKS.pop("client_arm", None)


# ----- Stable-Baselines3 ---------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_sb3_check_env_on_single_env_view(arm):
    """SB3's own checker takes one gymnasium.Env: our single-env view of a batch passes it."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_checker import check_env

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(infinity|unbounded|symmetric|normaliz).*")
        check_env(GymnasiumSingleEnv(make(arm, 1, backend="mujoco", num_threads=1)), warn=True)
        check_env(GymnasiumSingleEnv(make("toy", 1, kind="discrete", terminate_on_miss=True)), warn=True)


@pytest.mark.timeout(60)
def test_sb3_vec_env_matches_dummy_vec_env(arm):
    """SB3VecEnv equals SB3's own DummyVecEnv over single-env views, step for step through terminations and
    truncations: obs, rewards, dones, terminal_observation and TimeLimit.truncated; under VecCheckNan too."""
    pytest.importorskip("stable_baselines3")
    from sample_fast.envs.adapters import SB3VecEnv
    from stable_baselines3.common.vec_env import DummyVecEnv, VecCheckNan, VecEnv

    n = 3
    ours = VecCheckNan(SB3VecEnv(make(arm, n, backend="mujoco", num_threads=1)), raise_exception=True)
    ref = DummyVecEnv([lambda: GymnasiumSingleEnv(make(arm, 1, backend="mujoco", num_threads=1)) for _ in range(n)])
    assert isinstance(ours.unwrapped, VecEnv) and ours.num_envs == ref.num_envs == n
    assert ours.observation_space == ref.observation_space and ours.action_space == ref.action_space
    ours.seed(0)
    ref.seed(0)
    np.testing.assert_array_equal(ours.reset(), ref.reset())
    rng = np.random.default_rng(0)
    seen = {"terminated": 0, "truncated": 0}
    for _ in range(40):
        # env 0 pushes the shoulder past 0.01 rad (termination), env 1 idles into the time limit, env 2 is random
        actions = np.stack([[1.0, 0.0], [0.0, 0.0], rng.uniform(-1, 1, 2)]).astype(np.float32)
        o1, r1, d1, i1 = ours.step(actions)
        o2, r2, d2, i2 = ref.step(actions)
        np.testing.assert_allclose(o1, o2, rtol=0, atol=1e-6)
        np.testing.assert_allclose(r1, r2, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(d1, d2)
        for a, b in zip(i1, i2, strict=True):
            assert a["TimeLimit.truncated"] == b["TimeLimit.truncated"]
            assert ("terminal_observation" in a) == ("terminal_observation" in b)
            if "terminal_observation" in b:
                np.testing.assert_allclose(a["terminal_observation"], b["terminal_observation"], rtol=0, atol=1e-6)
                assert a["episode"]["l"] == b["episode_length"]  # Monitor-style stats of the ended episode
                np.testing.assert_allclose(a["episode"]["r"], b["episode_return"], rtol=1e-6)
                seen["truncated" if b["TimeLimit.truncated"] else "terminated"] += 1
    assert seen["terminated"] >= 2 and seen["truncated"] >= 2
    ours.close()
    ref.close()


@pytest.mark.timeout(60)
def test_sb3_seeding_per_env():
    """seed(s) reproduces the batch; its envs differ from one another; per-env seeds it cannot honour raise."""
    pytest.importorskip("stable_baselines3")
    from sample_fast.envs.adapters import SB3VecEnv

    env = SB3VecEnv(make("hopper", 4, backend="mujoco", num_threads=1))
    env.seed(3)
    first = env.reset()
    assert len({row.tobytes() for row in first}) == 4  # no two envs are clones
    env.seed(3)
    np.testing.assert_array_equal(env.reset(), first)
    env.seed(4)
    assert not np.array_equal(env.reset(), first)
    env._seeds = [1, 5, 2, 7]
    with pytest.raises(EnvError, match="seeded as a whole"):
        env.reset()
    env.close()


@pytest.mark.timeout(120)
def test_sb3_ppo_bootstraps_truncations():
    """A short PPO run on SB3VecEnv: SB3 reads TimeLimit.truncated and adds gamma * V(terminal_observation) to the
    reward of exactly the truncated steps (recomputed here from the policy's own value net), never to terminations."""
    pytest.importorskip("stable_baselines3")
    from sample_fast.envs.adapters import SB3VecEnv
    from stable_baselines3 import PPO

    n, horizon, gamma = 4, 5, 0.9
    env = SB3VecEnv(make("toy", n, max_episode_steps=horizon, terminate_on_miss=True, miss_threshold=1.5, seed=2))
    recorded = []
    original = env.step_wait

    def step_wait():
        out = original()
        recorded.append((out[0].copy(), out[1].copy(), out[2].copy(), out[3]))  # SB3 adds the bootstrap in place
        return out

    env.step_wait = step_wait
    # learning_rate 0: the update leaves the value net as it was during collection, so the bootstrap can be recomputed
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, gamma=gamma, seed=0, device="cpu",
                learning_rate=0.0)  # fmt: skip
    model.learn(total_timesteps=n * 16)  # one rollout, one update
    assert len(recorded) == 16
    shaped = model.rollout_buffer.rewards  # [16, n], as SB3 stored them
    raw = np.stack([r[1] for r in recorded])
    truncated = np.stack([[info["TimeLimit.truncated"] for info in r[3]] for r in recorded])
    terminated = np.stack([r[2] for r in recorded]) & ~truncated
    assert truncated.sum() >= 4 and terminated.sum() >= 1
    np.testing.assert_allclose(shaped[~truncated], raw[~truncated], rtol=0, atol=1e-6)  # terminations: no bootstrap
    for t, i in zip(*np.nonzero(truncated), strict=True):
        final = torch.as_tensor(recorded[t][3][i]["terminal_observation"])[None]
        with torch.no_grad():
            value = float(model.policy.predict_values(final)[0, 0])
        np.testing.assert_allclose(shaped[t, i], raw[t, i] + gamma * value, rtol=1e-5, atol=1e-6)
    assert model.ep_info_buffer and all(0 < e["l"] <= horizon for e in model.ep_info_buffer)
    env.close()


# ----- skrl 2.x, rl_games, TorchRL: the recipes of benchmarks/clients.py (docs/wrappers.md) ------------------------
@pytest.mark.timeout(120)
def test_skrl_loop_passes_final_obs(load_bench, monkeypatch):
    """benchmarks/clients.py's skrl_loop hands skrl the observation each transition reached (final_obs) as the next
    observation, so skrl's time_limit_bootstrap uses the right state; skrl's own trainer would pass the next
    episode's first observation there. Checked against the BatchedEnv's own results, step for step."""
    pytest.importorskip("skrl")
    from sample_fast.envs.adapters import GymnasiumVectorEnv
    from sample_fast.envs.base import BatchedEnv
    from skrl.envs.wrappers.torch import wrap_env

    clients = load_bench("clients")
    results = []
    recv = BatchedEnv.recv
    monkeypatch.setattr(BatchedEnv, "recv", lambda self: results.append(recv(self)) or results[-1])
    env = wrap_env(GymnasiumVectorEnv(make("toy", 4, max_episode_steps=3, seed=0)), wrapper="gymnasium")
    agent = clients._skrl_agent(env, rollouts=6, seed=0)
    seen = []
    record = agent.record_transition

    def recording(**kwargs):
        seen.append((kwargs["next_observations"].clone(), kwargs["truncated"].clone()))
        return record(**kwargs)

    monkeypatch.setattr(agent, "record_transition", recording)
    clients.skrl_loop(agent, env, timesteps=12)  # two rollouts, two updates
    assert len(seen) == len(results) == 12
    num_truncated = 0
    for (next_obs, truncated), res in zip(seen, results, strict=True):
        torch.testing.assert_close(next_obs, res.info["final_obs"], rtol=0, atol=0)
        assert torch.equal(truncated[:, 0], res.truncated)
        if res.truncated.any():  # there the auto-reset observation differs: the recipe's fix matters
            assert not torch.equal(next_obs[res.truncated], res.obs[res.truncated])
            num_truncated += int(res.truncated.sum())
    assert num_truncated == 16  # steps 3, 6, 9, 12 of four envs
    env.close()


@pytest.mark.timeout(120)
def test_rl_games_runner_trains_on_vectask(load_bench, monkeypatch):
    """rl_games' own Runner (a2c_continuous) trains on VecTaskEnv through the registration recipe, and receives the
    fresh tensors and time_outs the VecTask interface promises."""
    pytest.importorskip("rl_games")
    from sample_fast.envs.adapters import VecTaskEnv

    clients = load_bench("clients")
    steps = []
    step = VecTaskEnv.step

    def recording(self, actions):
        out = step(self, actions)
        steps.append((out[0]["obs"], out[0]["obs"].clone(), out[3]["time_outs"].clone()))
        return out

    monkeypatch.setattr(VecTaskEnv, "step", recording)
    r = clients.train_rl_games(512, task="hopper", num_envs=4, max_episode_steps=20)
    assert r["steps"] == 512 and len(steps) >= 128  # rl_games stepped our env for every frame it counted
    assert all(torch.equal(kept, copy) for kept, copy, _ in steps)  # no later step overwrote what rl_games kept
    assert sum(int(t.sum()) for _, _, t in steps) > 0  # time limits reached, reported as time_outs
    assert np.isfinite(r["before"]) and np.isfinite(r["after"])


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("error::FutureWarning")  # torchrl 0.14 warns when the collector's env handling is left open
def test_torchrl_ppo_recipe_runs(load_bench):
    """The TorchRL recipe (Collector + GAE + ClipPPOLoss on TorchRLEnv) trains through episode ends."""
    clients = load_bench("clients")
    r = clients.train_torchrl(256, task="hopper", num_envs=4, max_episode_steps=20)
    assert r["steps"] == 256 and np.isfinite(r["after"])


@pytest.mark.timeout(120)
def test_cleanrl_style_loop_on_make_vec(load_bench):
    """A CleanRL-style PPO loop runs unchanged on gymnasium.make_vec("sample_fast/Hopper-v5") with gymnasium's
    vector wrappers (NormalizeObservation and friends need NEXT_STEP, make_vec's default)."""
    clients = load_bench("clients")
    r = clients.train_cleanrl(256, task="hopper", num_envs=4, max_episode_steps=20)
    assert r["steps"] == 256 and np.isfinite(r["after"])
