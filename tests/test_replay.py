"""Prioritized trajectory replay (sample_fast.replay): sampling law, IS weights, priority updates, FIFO eviction,
segment layout, age limit, beta annealing, and a learner step with replay on (the weighted loss terms:
tests/test_losses.py)."""

from __future__ import annotations

import math

import pytest
import torch

from sample_fast.replay import (
    ReplayConfig,
    ReplayConfigError,
    TrajectoryReplay,
    segment_priorities,
)

T, B = 5, 8


def slot_layout(obs, next_obs, terminated, truncated, capacity=None) -> dict[str, torch.Tensor]:
    """obs ``[T + 1, B]`` rows and the side table (padded with NaN / -1 to ``capacity``, default T * B) of a
    rollout given with a dense ``next_obs [T, B]`` (docs/sampler.md)."""
    num_steps, num_envs = terminated.shape
    step_idx, env_idx = (truncated & ~terminated).nonzero(as_tuple=True)
    count = step_idx.numel()
    capacity = capacity if capacity is not None else num_steps * num_envs
    final_obs = torch.full((capacity, *obs.shape[2:]), float("nan"))
    final_obs[:count] = next_obs[step_idx, env_idx]
    pad = torch.full((capacity - count,), -1, dtype=torch.int64)
    return {
        "obs": obs, "final_obs": final_obs, "final_step_idx": torch.cat([step_idx, pad]),
        "final_env_idx": torch.cat([env_idx, pad]), "final_count": torch.tensor(count),
    }  # fmt: skip


def dense_final(data: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[T, B, ...]`` the side table scattered onto its steps (NaN where a step has no final obs)."""
    num_steps, num_envs = data["rewards"].shape
    count = int(data["final_count"])
    out = torch.full((num_steps, num_envs, *data["obs"].shape[2:]), float("nan"))
    out[data["final_step_idx"][:count], data["final_env_idx"][:count]] = data["final_obs"][:count]
    return out


def make_batch(version: int, num_envs: int = B, num_steps: int = T, obs_dim: int = 3) -> dict[str, torch.Tensor]:
    """A batch whose every entry encodes (version, t, env): obs[t, e, 0] = 1000 v + 10 t + e (t = 0..T), etc.;
    truncated (not terminated) steps have the final obs 1000 v + 10 t + e + 0.5."""
    t_idx = torch.arange(num_steps + 1).view(-1, 1).float()
    e_idx = torch.arange(num_envs).view(1, -1).float()
    code = 1000.0 * version + 10.0 * t_idx + e_idx  # [T + 1, B]
    obs = code.unsqueeze(-1).repeat(1, 1, obs_dim)
    code, t_idx = code[:-1], t_idx[:-1]
    terminated = (t_idx + e_idx).remainder(3).eq(0).expand(num_steps, num_envs).clone()
    truncated = (t_idx + e_idx).remainder(5).eq(0).expand(num_steps, num_envs).clone()
    return {
        "actions": (code + 0.5).unsqueeze(-1).repeat(1, 1, 2),
        "behavior_logp": -code,
        "rewards": code * 0.001,
        "terminated": terminated,
        "truncated": truncated,
        "policy_version": torch.full((num_steps, num_envs), version, dtype=torch.int64),
        **slot_layout(obs, obs[:-1] + 0.5, terminated, truncated),
    }


def filled_replay(priorities: list[float], alpha: float, beta: float = 1.0, seed: int = 0) -> TrajectoryReplay:
    """A memory holding len(priorities) one-column segments (b = 1) with these priorities."""
    cfg = ReplayConfig(ratio=1.0, capacity=len(priorities), segment_envs=1, alpha=alpha, beta=beta, eps=1e-9)
    replay = TrajectoryReplay(cfg, "cpu", seed=seed)
    replay.add(make_batch(0, num_envs=len(priorities)), torch.tensor(priorities))
    return replay


@pytest.mark.timeout(60)
def test_sampling_frequencies_follow_priority_power_alpha():
    # P(i) = p_i^alpha / sum_j p_j^alpha; chi-square goodness of fit over 20k draws (fixed seed).
    priorities, alpha, num_draws = [1.0, 2.0, 4.0, 8.0, 0.5], 0.7, 20_000
    replay = filled_replay(priorities, alpha)
    counts = torch.zeros(len(priorities))
    for _ in range(20):
        sample = replay.sample(num_draws // 20, learner_version=0, beta=1.0)
        counts += torch.bincount(sample.index, minlength=len(priorities)).float()
    scaled = torch.tensor(priorities) ** alpha
    expected = num_draws * scaled / scaled.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (counts, expected)  # chi-square, 4 degrees of freedom, p = 0.001
    # The same counts are far from the alpha = 1 law, so the test can tell the exponent apart.
    wrong = num_draws * torch.tensor(priorities) / sum(priorities)
    assert float(((counts - wrong) ** 2 / wrong).sum()) > 200.0


@pytest.mark.timeout(60)
def test_importance_weights_match_schaul_formula():
    # alpha = 1, beta = 0.5, p = [1, 2, 4]: P = [1/7, 2/7, 4/7], N = 3.
    # w_i = (N P_i)^-beta = (3/7)^-0.5, (6/7)^-0.5, (12/7)^-0.5 = 1.5275, 1.0801, 0.7638; / max -> [1, 0.7071, 0.5].
    replay = filled_replay([1.0, 2.0, 4.0], alpha=1.0)
    sample = replay.sample(300, learner_version=0, beta=0.5)
    expected = torch.tensor([1.0, 1 / math.sqrt(2.0), 0.5])
    seg_weights = sample.weights[0]  # [n * b] with b = 1
    torch.testing.assert_close(seg_weights, expected[sample.index], rtol=1e-5, atol=1e-6)
    # The weight is constant along each segment's time axis.
    assert torch.equal(sample.weights, sample.weights[:1].expand(T, -1))
    # beta = 0: no correction at all.
    assert torch.allclose(replay.sample(10, 0, beta=0.0).weights, torch.ones(T, 10))


@pytest.mark.timeout(60)
def test_priorities_update_changes_sampling_and_ignores_nonfinite():
    replay = filled_replay([1.0, 1.0, 1.0, 1.0], alpha=1.0)
    replay.update_priorities(torch.tensor([2]), torch.tensor([1e6]))
    assert torch.bincount(replay.sample(1000, 0, 1.0).index, minlength=4)[2] > 990
    replay.update_priorities(torch.tensor([2, 3]), torch.tensor([0.0, 5.0]))
    counts = torch.bincount(replay.sample(2000, 0, 1.0).index, minlength=4).float()
    assert counts[2] == 0 and counts[3] > counts[0] * 2  # p = [1, 1, 0, 5]: 0 is never drawn (eps = 1e-9)
    # A NaN priority (non-finite update) falls back to the max priority seen, never poisons the table.
    replay.update_priorities(torch.tensor([0]), torch.tensor([float("nan")]))
    assert replay.sampler.priority[0] == 1e6 and torch.isfinite(replay.sampler.priority).all()


@pytest.mark.timeout(60)
def test_eviction_is_fifo_in_segments():
    cfg = ReplayConfig(ratio=1.0, capacity=6, segment_envs=4)  # B = 8 -> 2 segments per batch, 3 batches fit
    replay = TrajectoryReplay(cfg, "cpu")
    written = [replay.add(make_batch(v), policy_version=v).tolist() for v in range(5)]
    assert written == [[0, 1], [2, 3], [4, 5], [0, 1], [2, 3]]  # round robin: the oldest slots are overwritten
    assert len(replay) == 6
    stored_versions = replay.buffer.storage[torch.arange(6)]["policy_version"][:, 0, 0].tolist()
    assert stored_versions == [3, 3, 4, 4, 2, 2]  # batches 0 and 1 were evicted first


@pytest.mark.timeout(60)
def test_segments_keep_time_structure_and_behavior_logp():
    cfg = ReplayConfig(ratio=1.0, capacity=8, segment_envs=2, alpha=0.0)
    replay = TrajectoryReplay(cfg, "cpu")
    batch = make_batch(7)
    index = replay.add(batch)
    assert index.tolist() == [0, 1, 2, 3]
    sample = replay.sample(16, learner_version=7, beta=1.0)
    for j, seg in enumerate(sample.index.tolist()):
        cols = slice(2 * seg, 2 * seg + 2)  # segment i holds env columns [2 i, 2 i + 2) of the batch
        for key in ("obs", "actions", "behavior_logp", "rewards", "terminated", "truncated"):
            assert torch.equal(sample.data[key][:, 2 * j : 2 * j + 2], batch[key][:, cols]), key
        assert (sample.data["policy_version"][:, 2 * j : 2 * j + 2] == 7).all()
        # the segment carries its own truncations' final obs, re-indexed to its columns in the sample
        replayed_final = dense_final(sample.data)[:, 2 * j : 2 * j + 2]
        torch.testing.assert_close(replayed_final, dense_final(batch)[:, cols], rtol=0, atol=0, equal_nan=True)
    assert sample.data["obs"].shape == (T + 1, 32, 3)  # each segment keeps its bootstrap row
    # every table row is valid (no padding) and each segment's share is its own truncations
    live = batch["truncated"] & ~batch["terminated"]
    expected = sum(int(live[:, 2 * seg : 2 * seg + 2].sum()) for seg in sample.index.tolist())
    assert int(sample.data["final_count"]) == sample.data["final_obs"].shape[0] == expected > 0
    # per-env worst case of the batch's table (T * B rows: T per env) -> 2 * T rows per 2-column segment
    assert replay.final_rows == 2 * T


@pytest.mark.timeout(60)
def test_join_appends_columns_and_one_side_table():
    cfg = ReplayConfig(ratio=0.5, capacity=8, segment_envs=2, alpha=0.0)
    replay = TrajectoryReplay(cfg, "cpu")
    replay.add(make_batch(3))
    fresh = make_batch(4)
    sample = replay.sample(2, learner_version=4, beta=1.0)
    data, rewards, mask, weights = replay.join(fresh, fresh["rewards"], None, sample, learner_version=4)
    assert data["obs"].shape == (T + 1, B + 4, 3) and rewards.shape == mask.shape == weights.shape == (T, B + 4)
    # the joined table is the fresh one, then the replayed one shifted past the B fresh columns
    expected = torch.cat([dense_final(fresh), dense_final(sample.data)], dim=1)
    torch.testing.assert_close(dense_final(data), expected, rtol=0, atol=0, equal_nan=True)
    assert int(data["final_count"]) == data["final_obs"].shape[0]


@pytest.mark.timeout(60)
def test_age_limit_excludes_old_segments():
    cfg = ReplayConfig(ratio=1.0, capacity=8, segment_envs=4, alpha=1.0, max_age=3)
    replay = TrajectoryReplay(cfg, "cpu")
    replay.add(make_batch(0), torch.tensor([100.0, 100.0]))  # old but high priority
    replay.add(make_batch(5), torch.tensor([1.0, 1.0]))
    sample = replay.sample(200, learner_version=6, beta=1.0)  # live: versions >= 3
    assert set(sample.index.tolist()) == {2, 3}
    assert torch.allclose(sample.weights, torch.ones_like(sample.weights))  # N and P_min count live segments only
    assert replay.sample(4, learner_version=9, beta=1.0) is None  # everything is older than 3 versions


@pytest.mark.timeout(60)
def test_beta_annealing_and_segment_count():
    replay = TrajectoryReplay(ReplayConfig(ratio=0.5, segment_envs=4, beta=0.4, beta_steps=1000), "cpu")
    assert replay.beta(0) == pytest.approx(0.4)
    assert replay.beta(500) == pytest.approx(0.7)
    assert replay.beta(5000) == pytest.approx(1.0)
    assert replay.num_segments_for(32) == 4  # 0.5 * 32 columns / 4 per segment
    with pytest.raises(ReplayConfigError, match=r"try replay.segment_envs=3"):  # 3 divides 6 and is nearest 4
        replay.add(make_batch(0, num_envs=6))
    with pytest.raises(ReplayConfigError, match=r"replay.ratio must be >= 0"):
        ReplayConfig(ratio=-1.0).validate()


def test_segment_priorities_hand_computed():
    adv = torch.tensor([[1.0, -3.0, 2.0, 0.0], [-1.0, 1.0, 0.0, 4.0]])  # [T=2, B=4], b = 2
    # segment 0: |1| |-3| |-1| |1| -> 1.5; segment 1: |2| |0| |0| |4| -> 1.5
    assert segment_priorities(adv, adv, adv, 2).tolist() == [1.5, 1.5]
    vs, v = torch.ones(2, 4), torch.tensor([[0.0, 1.0, 3.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert segment_priorities(adv, vs, v, 2, "value_error").tolist() == [0.25, 0.5]


# ----- the learner with replay on ---------------------------------------------------------------------------------
def learner_batch(policy, num_steps: int = 8, num_envs: int = 8, seed: int = 0, version: int = 0):
    """An on-policy [T, B] batch of a 3-dim obs / 2-dim action policy, with a few episode ends."""
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(num_steps + 1, num_envs, 3, generator=gen)
    torch.manual_seed(seed)
    actions, behavior_logp, values = policy.act(obs[:-1].reshape(-1, 3))
    terminated = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    truncated = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    terminated[2, 0] = truncated[3, 2] = truncated[num_steps - 1, 5] = True
    next_obs = torch.randn(num_steps, num_envs, 3, generator=gen)  # only the truncated rows are kept
    return TensorDict(
        {
            "actions": actions.reshape(num_steps, num_envs, 2),
            "behavior_logp": behavior_logp.reshape(num_steps, num_envs), "values": values.reshape(num_steps, num_envs),
            "rewards": torch.randn(num_steps, num_envs, generator=gen), "terminated": terminated,
            "truncated": truncated, "policy_version": torch.full((num_steps, num_envs), version, dtype=torch.int64),
            **slot_layout(obs, next_obs, terminated, truncated, capacity=num_envs),
        },
        batch_size=[],
    )  # fmt: skip


def small_policy(seed: int = 0):
    from sample_fast.envs import Spec

    from sample_fast.policy import ActorCritic, PolicyConfig

    torch.manual_seed(seed)
    obs_spec = Spec(shape=(3,), dtype=torch.float32)
    act_spec = Spec(shape=(2,), dtype=torch.float32, low=-torch.ones(2), high=torch.ones(2))
    return ActorCritic(obs_spec, act_spec, PolicyConfig(hidden_sizes=[32, 32]))


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on 2 threads shared with other processes are slower than on one
    yield
    torch.set_num_threads(previous)


def replay_learner_for(policy, cfg, **replay):
    """A learner with a replay memory of ``ReplayConfig(**replay)``, built as the trainer builds it."""
    from sample_fast.learner import Learner
    from sample_fast.wiring import build_replay

    return Learner(policy, cfg, replay=build_replay(ReplayConfig(**replay), "cpu", seed=cfg.seed))


@pytest.mark.timeout(60)
def test_learner_replay_off_by_default_and_validated():
    import dataclasses

    from sample_fast.learner import Learner, LearnerConfig
    from sample_fast.wiring import build_learner, build_replay

    assert Learner(small_policy(), LearnerConfig()).replay is None
    assert build_replay(ReplayConfig(), "cpu") is None  # ratio 0: no memory
    assert not any(f.name.startswith("replay") for f in dataclasses.fields(LearnerConfig))  # its own section now
    with pytest.raises(ReplayConfigError, match="replay.alpha"):
        build_replay(ReplayConfig(ratio=0.5, alpha=-1.0), "cpu")
    # the trainer's learner builder hands the memory of the replay: section to the learner
    on = ReplayConfig(ratio=0.5, capacity=7)
    learner = build_learner(small_policy(), LearnerConfig(), "cpu", 1000, replay_cfg=on)
    assert isinstance(learner.replay, TrajectoryReplay) and learner.replay.cfg.capacity == 7
    assert build_learner(small_policy(), LearnerConfig(), "cpu", 1000, replay_cfg=ReplayConfig()).replay is None


@pytest.mark.timeout(60)
def test_learner_step_with_replay_trains_on_replayed_segments(one_thread):
    from sample_fast.learner import LearnerConfig

    policy = small_policy()
    learner = replay_learner_for(policy, LearnerConfig(num_minibatches=2), ratio=0.5, segment_envs=2, capacity=8)
    first = learner.train(learner_batch(policy, seed=0, version=0))
    assert first["replay_segments"] == 0 and first["replay_size"] == 4  # empty memory; B = 8 -> 4 segments stored
    second = learner.train(learner_batch(policy, seed=1, version=1))
    assert second["replay_segments"] == 2  # 0.5 * 8 columns / 2 per segment
    assert second["replay_size"] == 8
    assert 0.0 < second["replay_weight_mean"] <= 1.0
    assert learner.env_steps == 2 * 8 * 8  # fresh steps only
    assert all(math.isfinite(v) for v in second.values())
    # The replayed segments' priorities were updated from this call's targets (not left at their insert values).
    before = learner.replay.sampler.priority.clone()
    learner.train(learner_batch(policy, seed=2, version=2))
    assert not torch.equal(before, learner.replay.sampler.priority)


@pytest.mark.timeout(60)
def test_zero_weight_replayed_segment_contributes_no_gradient(one_thread):
    # Two learners with identical weights train on the same fresh batch, each with a DIFFERENT replayed segment.
    # With the IS weights forced to 0 the replayed data must not change the update; with weights 1 it must.
    import copy

    from sample_fast.learner import LearnerConfig

    def run(replay_seed: int, weight: float) -> list[torch.Tensor]:
        policy = small_policy(seed=0)
        cfg = LearnerConfig(num_epochs=1, num_minibatches=1, normalize_advantages=False, scale_rewards=False)
        learner = replay_learner_for(policy, cfg, ratio=0.25, segment_envs=2)
        learner.replay.add(learner_batch(copy.deepcopy(policy), seed=replay_seed))
        draw = learner.replay.sample
        learner.replay.sample = lambda *a: draw(*a)._replace(weights=torch.full((8, 2), weight))
        metrics = learner.train(learner_batch(policy, seed=0))
        assert metrics["replay_segments"] == 1
        return [p.detach().clone() for p in policy.parameters()]

    zero_a, zero_b = run(10, 0.0), run(11, 0.0)
    for a, b in zip(zero_a, zero_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    one_a, one_b = run(10, 1.0), run(11, 1.0)
    assert any(not torch.equal(a, b) for a, b in zip(one_a, one_b, strict=True))


@pytest.mark.timeout(60)
def test_replay_age_limit_replaces_policy_lag_mask(one_thread):
    from sample_fast.learner import LearnerConfig

    def replay_metrics(max_age: int) -> dict[str, float]:
        policy = small_policy()
        learner = replay_learner_for(policy, LearnerConfig(max_policy_lag=0), ratio=0.5, segment_envs=2,
                                     max_age=max_age)  # fmt: skip
        learner.replay.add(learner_batch(policy, seed=3, version=0))
        learner.policy_version = 50  # the stored segments are 50 versions old
        return learner.train(learner_batch(policy, seed=4, version=50))

    kept = replay_metrics(max_age=100)
    assert kept["replay_segments"] == 2 and kept["replay_masked_frac"] == 0.0  # max_policy_lag=0 does not drop them
    assert kept["masked_frac"] == 0.0  # fresh columns are on-policy
    dropped = replay_metrics(max_age=10)
    assert dropped["replay_segments"] == 0  # too old: not sampled at all


def toy_policy():
    """A small ActorCritic for the toy env (module level: the async sampler process builds it too)."""
    from sample_fast.envs import make

    from sample_fast.policy import ActorCritic, PolicyConfig

    env = make("toy", 1)
    return ActorCritic(env.observation_spec, env.action_spec, PolicyConfig(hidden_sizes=[16, 16]))


def replay_learner(policy):
    from sample_fast.learner import LearnerConfig

    return replay_learner_for(policy, LearnerConfig(), ratio=0.5, segment_envs=2, capacity=16)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["serial", "async"])
def test_runner_trains_with_replay_in_both_modes(mode, one_thread):
    import functools

    from sample_fast.envs import make

    from sample_fast.runner import Runner, RunnerConfig
    from sample_fast.sampler import SamplerConfig

    cfg = SamplerConfig(rollout_len=8, num_splits=2, num_slots=4, seed=0)
    rcfg = RunnerConfig(poll_s=0.05, shutdown_timeout_s=5.0)
    runner = Runner(functools.partial(make, "toy", 16), toy_policy, replay_learner, cfg, rcfg, mode=mode)
    summary = runner.run(total_env_steps=8 * 8 * 12)
    replay = runner.learner.replay
    assert summary["env_steps"] >= 8 * 8 * 12
    assert len(replay) == 16  # B = 8 columns -> 4 segments per call; full after 4 calls
    assert replay.num_sampled >= 2 * 8  # 0.5 * 8 / 2 = 2 segments per call from the second call on
    assert runner.learner.env_steps == summary["env_steps"]  # replayed steps are not counted as env steps


@pytest.mark.timeout(60)
def test_train_config_rejects_segment_width_that_does_not_divide_the_batch():
    from hydra import compose, initialize_config_module

    from sample_fast.config import ConfigError, resolve, to_train_config

    overrides = ["env=halfcheetah", "env.num_envs=64", "replay.ratio=0.5"]  # B = 64 / 2 splits = 32
    with initialize_config_module(config_module="sample_fast.configs", version_base=None):
        good = compose("train", overrides=[*overrides, "replay.segment_envs=8"])
        bad = compose("train", overrides=[*overrides, "replay.segment_envs=7"])
        preset = compose("train", overrides=["env=halfcheetah", "replay=prioritized"])
        bad_alpha = compose("train", overrides=["env=halfcheetah", "replay.ratio=0.5", "replay.alpha=-1"])
    assert resolve(to_train_config(good)).replay.segment_envs == 8
    assert resolve(to_train_config(preset)).replay.ratio == 0.5
    with pytest.raises(ConfigError, match="try replay.segment_envs=8"):
        resolve(to_train_config(bad))
    with pytest.raises(ConfigError, match=r"replay.alpha must be >= 0"):
        resolve(to_train_config(bad_alpha))


@pytest.mark.parametrize("old", ["ratio", "capacity", "segment_envs", "alpha", "beta", "beta_steps", "max_age",
                                 "priority"])  # fmt: skip
def test_old_learner_replay_spellings_name_the_replay_section(old):
    from sample_fast import cli
    from sample_fast.config import ConfigError

    expected = rf"learner.replay_{old} is not a key of learner.*did you mean replay.{old}\?"
    with pytest.raises(ConfigError, match=expected):
        cli.preflight(["env=toy", f"learner.replay_{old}=1"])
