"""Tests of the ``toy`` env: specs, rewards against hand-computed values, auto-reset and truncation/termination."""

from __future__ import annotations

import pytest
import torch
from sample_fast.envs import EnvError, make


def test_specs_and_shapes_continuous():
    with make("toy", 5, dim=3) as env:
        assert env.backend == "toy"
        assert env.observation_spec.shape == (4,) and env.observation_spec.dtype == torch.float32
        assert env.action_spec.shape == (3,) and env.action_spec.dtype == torch.float32
        assert not env.action_spec.is_discrete
        assert torch.equal(env.action_spec.low, -torch.ones(3)) and torch.equal(env.action_spec.high, torch.ones(3))
        obs, info = env.reset()
        assert obs.shape == (5, 4) and obs.dtype == torch.float32 and obs.device == torch.device("cpu")
        assert torch.all(obs[:, :3].abs() <= 1) and torch.all(obs[:, 3] == 0)
        obs, reward, terminated, truncated, info = env.step(torch.zeros(5, 3))
        assert reward.shape == (5,) and reward.dtype == torch.float32
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool and terminated.shape == (5,)
        assert info["final_obs"].shape == (5, 4)
        assert info["episode_return"].shape == (5,) and info["episode_length"].dtype == torch.int64
        assert info["physics_reset"].dtype == torch.bool and not info["physics_reset"].any()
        assert env.optimal_return == 16.0


def test_specs_discrete():
    with make("toy", 3, kind="discrete", num_states=5, num_actions=3) as env:
        assert env.action_spec.shape == () and env.action_spec.dtype == torch.int64
        assert env.action_spec.num_actions == 3
        obs, _ = env.reset()
        assert obs.shape == (3, 6)
        # one-hot part has exactly one 1 per row
        assert torch.equal(obs[:, :5].sum(-1), torch.ones(3))


def test_continuous_reward_matches_hand_computation():
    with make("toy", 4, dim=2, seed=3) as env:
        obs, _ = env.reset()
        target = obs[:, :2].clone()
        # Action = target + (0.5, -0.5) (then clipped to [-1, 1]); reward = 1 - mean(diff^2) with the clipped diff.
        actions = target + torch.tensor([0.5, -0.5])
        clipped = actions.clamp(-1, 1)
        expected = 1.0 - ((clipped - target) ** 2).mean(-1)
        _, reward, *_ = env.step(actions)
        torch.testing.assert_close(reward, expected)
        # The optimal action gives exactly 1.
        obs2 = env.step(torch.zeros(4, 2)).obs
        reward = env.step(obs2[:, :2].clone()).reward
        torch.testing.assert_close(reward, torch.ones(4))


def test_discrete_reward_matches_hand_computation():
    with make("toy", 64, kind="discrete", num_states=8, num_actions=3, seed=1) as env:
        obs, _ = env.reset()
        state = obs[:, :8].argmax(-1)
        right = state % 3
        reward = env.step(right).reward
        assert torch.equal(reward, torch.ones(64))
        state = env.step(right).obs  # wrong-or-right doesn't matter here; read the new state
        state = state[:, :8].argmax(-1)
        reward = env.step((state + 1) % 3).reward
        assert torch.equal(reward, torch.zeros(64))


def test_truncation_at_max_episode_steps_with_final_obs_and_returns():
    n, horizon = 3, 3
    with make("toy", n, dim=1, max_episode_steps=horizon, seed=7) as env:
        obs, _ = env.reset()
        rewards = []
        actions = torch.tensor([[0.2], [-0.4], [1.0]])
        for t in range(1, horizon + 1):
            prev_target = obs[:, :1]
            obs, reward, terminated, truncated, info = env.step(actions)
            # Hand computation: 1 - (a - target)^2 (dim 1, so the mean is the single term).
            torch.testing.assert_close(reward, 1.0 - (actions - prev_target).squeeze(-1) ** 2)
            rewards.append(reward)
            assert not terminated.any()
            if t < horizon:
                assert not truncated.any()
                assert torch.equal(info["final_obs"], obs)  # no episode ended: final_obs is obs
                assert torch.allclose(obs[:, 1], torch.full((n,), t / horizon))
                assert torch.equal(info["episode_length"], torch.zeros(n, dtype=torch.int64))
            else:
                assert truncated.all()
                # final_obs is the last observation of the old episode (time fraction 1), obs the new episode's first.
                assert torch.allclose(info["final_obs"][:, 1], torch.ones(n))
                assert torch.allclose(obs[:, 1], torch.zeros(n))
                assert not torch.equal(info["final_obs"][:, 0], obs[:, 0])
                torch.testing.assert_close(info["episode_return"], torch.stack(rewards).sum(0))
                assert torch.equal(info["episode_length"], torch.full((n,), horizon))
        # The counters restarted: the next episode runs its full horizon again.
        for _ in range(horizon - 1):
            assert not env.step(actions).truncated.any()
        assert env.step(actions).truncated.all()


def test_terminate_on_miss_is_terminated_not_truncated():
    with make("toy", 4, kind="discrete", num_states=4, num_actions=4, terminate_on_miss=True, seed=0) as env:
        obs, _ = env.reset()
        state = obs[:, :4].argmax(-1)
        # envs 0, 1 hit; envs 2, 3 miss
        actions = state.clone()
        actions[2:] = (state[2:] + 1) % 4
        obs, reward, terminated, truncated, info = env.step(actions)
        assert terminated.tolist() == [False, False, True, True]
        assert not truncated.any()
        assert reward.tolist() == [1.0, 1.0, 0.0, 0.0]
        assert info["episode_length"].tolist() == [0, 0, 1, 1]
        assert info["episode_return"].tolist() == [0.0, 0.0, 0.0, 0.0]
        # Terminated envs restarted (time fraction 0); the others are at t = 1.
        assert obs[:, 4].tolist() == [1 / 16, 1 / 16, 0.0, 0.0]
        assert info["final_obs"][:, 4].tolist() == [1 / 16] * 4


def test_continuous_terminate_on_miss_threshold():
    with make("toy", 2, dim=1, terminate_on_miss=True, miss_threshold=0.25) as env:
        obs, _ = env.reset()
        target = obs[:, :1]
        # err 0.2^2 = 0.04 (hit) and 0.6^2 = 0.36 (miss, > 0.25); clip keeps both inside [-1, 1] via sign choice.
        offset = torch.where(target > 0, -1.0, 1.0) * torch.tensor([[0.2], [0.6]])
        res = env.step(target + offset)
        assert res.terminated.tolist() == [False, True]


def test_optimal_policy_reaches_optimal_return_and_random_policy_its_expectation():
    horizon = 8
    with make("toy", 256, dim=2, max_episode_steps=horizon, seed=2) as env:
        obs, _ = env.reset()
        returns = []
        for _ in range(horizon):
            obs, _, _, truncated, info = env.step(obs[:, :2].clone())
        assert truncated.all()
        torch.testing.assert_close(info["episode_return"], torch.full((256,), env.optimal_return))
        gen = torch.Generator().manual_seed(0)
        for _ in range(horizon * 8):
            res = env.step(torch.rand(256, 2, generator=gen) * 2 - 1)
            returns.append(res.info["episode_return"][res.truncated])
        mean = torch.cat(returns).mean().item()
        # 2048 episodes; per-episode std is about sqrt(8) * 0.3, so the mean's std is ~0.02.
        assert abs(mean - env.random_return) < 0.1, (mean, env.random_return)


def test_discrete_random_return_with_termination():
    env = make("toy", 4096, kind="discrete", num_actions=2, terminate_on_miss=True, max_episode_steps=4, seed=5)
    env.reset()
    gen = torch.Generator().manual_seed(1)
    first_return = torch.full((4096,), float("nan"))
    for _ in range(4):  # every env's first episode ends within max_episode_steps
        res = env.step(torch.randint(0, 2, (4096,), generator=gen))
        first = (res.terminated | res.truncated) & first_return.isnan()
        first_return[first] = res.info["episode_return"][first]
    # Only first episodes: later ones in a fixed window over-represent short episodes.
    assert not first_return.isnan().any()
    # sum_{k=1..4} 0.5^k = 0.9375; std of one return ~1.1, of the mean over 4096 ~0.02.
    assert env.random_return == pytest.approx(0.9375)
    assert abs(first_return.mean().item() - 0.9375) < 0.08
    env.close()


def test_seeded_determinism_and_reset_seed():
    def rollout(seed, reset_seed=None):
        env = make("toy", 4, dim=2, seed=seed, max_episode_steps=3)
        obs, _ = env.reset(seed=reset_seed)
        out = [obs]
        for i in range(7):
            res = env.step(torch.full((4, 2), 0.1 * i))
            out += [res.obs, res.reward, res.info["final_obs"]]
        env.close()
        return out

    a, b, c = rollout(11), rollout(11), rollout(12)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    d = rollout(12, reset_seed=11)
    assert all(torch.equal(x, y) for x, y in zip(a, d, strict=True))


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"kind": "box"}, "kind must be one of"),
        ({"foo": 1}, "valid options: kind, dim"),
        ({"kind": "discrete", "dim": 3}, "only apply to another kind"),
        ({"max_episode_steps": 0}, "max_episode_steps must be a positive int"),
        ({"dim": 1.5}, "dim must be a positive int"),
        ({"miss_threshold": 0.0}, "miss_threshold must be > 0"),
    ],
)
def test_bad_options(options, fragment):
    with pytest.raises(EnvError, match=fragment):
        make("toy", 2, **options)


def test_discrete_action_range_checked():
    with make("toy", 2, kind="discrete", num_actions=3) as env:
        env.reset()
        with pytest.raises(EnvError, match=r"\[0, 3\)"):
            env.step(torch.tensor([0, 3]))


def test_image_kind_frames_and_rewards_by_column_band():
    with make("toy", 64, kind="image", image_size=12, num_actions=4, max_episode_steps=3, seed=2) as env:
        spec = env.observation_spec
        assert spec.shape == (1, 12, 12) and spec.dtype == torch.uint8 and env.action_spec.num_actions == 4
        assert env.random_return == 3 * 0.25 and env.optimal_return == 3.0
        obs, _ = env.reset()
        assert obs.shape == (64, 1, 12, 12) and obs.dtype == torch.uint8
        assert torch.equal((obs == 255).sum(dim=(1, 2, 3)), torch.ones(64, dtype=torch.int64))  # one lit pixel
        assert int(obs.sum()) == 64 * 255  # the rest black
        col = (obs[:, 0] == 255).nonzero()[:, 2]  # rows of nonzero() come in env order: one per env
        # 12 columns, 4 actions: columns 0-2 -> action 0, 3-5 -> 1, 6-8 -> 2, 9-11 -> 3
        correct = torch.div(col, 3, rounding_mode="floor")
        res = env.step(correct)
        assert torch.equal(res.reward, torch.ones(64))
        col = (res.obs[:, 0] == 255).nonzero()[:, 2]
        res = env.step((torch.div(col, 3, rounding_mode="floor") + 1) % 4)  # always the wrong band
        assert torch.equal(res.reward, torch.zeros(64))
        res = env.step(torch.zeros(64, dtype=torch.int64))
        assert res.truncated.all() and torch.equal(res.info["episode_length"], torch.full((64,), 3))
    with pytest.raises(EnvError, match="image_size .* must be >= num_actions"):
        make("toy", 1, kind="image", image_size=3, num_actions=4)


def test_recall_kind_shows_the_cue_once_and_rewards_recalling_it():
    env = make("toy", 4, kind="recall", recall_steps=3, num_cues=2, seed=0)
    obs, _ = env.reset(seed=0)
    cue = obs[:, :2].argmax(dim=1)
    assert torch.equal(obs[:, :2].sum(dim=1), torch.ones(4)) and torch.equal(obs[:, 2], torch.zeros(4))
    answer = torch.tensor([0, 1, 0, 1])
    r1 = env.step(answer)  # step 1 of 3: no cue, no query, no reward, not done
    assert torch.equal(r1.obs, torch.zeros(4, 3)) and torch.equal(r1.reward, torch.zeros(4))
    r2 = env.step(answer)  # step 2: the query flag is up
    assert torch.equal(r2.obs[:, 2], torch.ones(4)) and torch.equal(r2.obs[:, :2], torch.zeros(4, 2))
    r3 = env.step(answer)  # step 3 (the last): reward 1 where the answer is the cue, terminated, a new cue shown
    assert torch.equal(r3.reward, (answer == cue).float())
    assert r3.terminated.all() and not r3.truncated.any()
    assert torch.equal(r3.info["episode_return"], (answer == cue).float())
    assert torch.equal(r3.obs[:, :2].sum(dim=1), torch.ones(4))
    assert (env.optimal_return, env.random_return) == (1.0, 0.5)


def test_bandit_kind_trials_and_rewards():
    env = make("toy", 2000, kind="bandit", trial_episodes=3, best_p=0.9, seed=0)
    env.reset(seed=0)
    best = env._state.clone()  # the best arm of each env's first trial
    pulls = [env.step(best) for _ in range(3)]  # every pull ends an episode; the third ends the trial
    assert all(r.terminated.all() and not r.truncated.any() for r in pulls)
    assert [bool(r.info["trial_end"].any()) for r in pulls[:2]] == [False, False] and pulls[2].info["trial_end"].all()
    rate = torch.stack([r.reward for r in pulls]).mean()
    assert abs(float(rate) - 0.9) < 0.02  # 6000 pulls of the best arm (std 0.004)
    worst = env.step(1 - env._state).reward.mean()  # the other arm of the new trial pays 0.1
    assert abs(float(worst) - 0.1) < 0.03
    assert env.has_trials and env.random_return == pytest.approx(0.5)
