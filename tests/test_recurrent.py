"""Recurrent policies (docs/recurrent.md): the sampler's per-env state and its resets, the learner's re-run from the
stored state, R2D2 burn-in, the memory tasks (cue recall, RL² bandit) and the config errors."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from sample_fast.envs import BatchedEnv, Spec, StepResult, make
from sample_fast.envs.base import EpisodeTracker

from sample_fast.learner import Learner, LearnerConfig
from sample_fast.policy import ActorCritic, PolicyConfig
from sample_fast.recurrent import sequence_inputs
from sample_fast.sampler import Sampler, SamplerConfig
from sample_fast.trajectory_store import TrajectoryStore


class CountdownEnv(BatchedEnv):
    """Deterministic: env i's episodes last ``i + 2`` steps; they end terminated for even i, truncated for odd i.
    obs ``[i / N, t / (i + 2)]`` (each env's own), 2 discrete actions (ignored), reward 1 per step."""

    backend, name = "test", "countdown"

    def __init__(self, num_envs: int):
        self.num_envs, self.device = num_envs, torch.device("cpu")
        self.observation_spec = Spec((2,), torch.float32)
        self.action_spec = Spec((), torch.int64, num_actions=2)
        self.length = torch.arange(num_envs) + 2
        self.max_episode_steps = int(self.length.max())
        self.truncates_only_at_time_limit = False
        self.t = torch.zeros(num_envs, dtype=torch.int64)
        self.tracker = EpisodeTracker(num_envs, self.device)

    def _obs(self) -> torch.Tensor:
        return torch.stack([torch.arange(self.num_envs) / self.num_envs, self.t / self.length], dim=-1).float()

    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        self.t.zero_()
        return self._obs(), {}

    def _step(self, actions: torch.Tensor) -> StepResult:
        self.t += 1
        done = self.t >= self.length
        odd = torch.arange(self.num_envs) % 2 == 1
        final_obs = self._obs()
        self.t.masked_fill_(done, 0)
        info = {"final_obs": final_obs, "physics_reset": torch.zeros(self.num_envs, dtype=torch.bool)}
        reward = torch.ones(self.num_envs)
        self.tracker.update(reward, done, info)
        return StepResult(self._obs(), reward, done & ~odd, done & odd, info)


class Recorder:
    """Wraps ``policy.act_recurrent``: records each call's state (as given), reset, new state and log-prob."""

    def __init__(self, policy: ActorCritic):
        self.calls: list[dict[str, torch.Tensor]] = []
        self._act = policy.act_recurrent
        policy.act_recurrent = self

    def __call__(self, obs, state, reset, *prev, **kw):
        actions, logp, values, new_state = self._act(obs, state, reset, *prev, **kw)
        self.calls.append({"state": state.clone(), "reset": reset.clone(), "new_state": new_state.clone(),
                           "logp": logp.clone()})  # fmt: skip
        return actions, logp, values, new_state


def rnn_policy(env: BatchedEnv, rnn: str = "gru", memory: str = "episode", dtype=torch.float32) -> ActorCritic:
    torch.manual_seed(0)
    cfg = PolicyConfig(hidden_sizes=[16], rnn=rnn, rnn_size=8, memory=memory)
    return ActorCritic(env.observation_spec, env.action_spec, cfg).to(dtype)


def run_sampler(env: BatchedEnv, policy: ActorCritic, num_slots: int, rollout_len: int = 6):
    """The real Sampler (serial, one split) over ``num_slots`` slots; returns the store and the READY slot order."""
    cfg = SamplerConfig(rollout_len=rollout_len, num_splits=1, num_slots=num_slots + 1, seed=0)
    dtype = next(policy.parameters()).dtype
    store = TrajectoryStore(env.observation_spec, env.action_spec, rollout_len, env.num_envs, num_slots + 1,
                            rnn_state_shape=policy.rnn_state_shape, rl2=policy.rl2,
                            rnn_state_dtype=dtype)  # fmt: skip
    sampler = Sampler([env], policy, store, cfg, version_fn=lambda: 0)
    order = []
    while len(order) < num_slots:
        sampler.advance(wait_s=1.0)
        while (idx := store.acquire_ready(0.0)) is not None:
            store.check_written(idx)
            order.append(idx)
    sampler.stop()
    return store, order


@pytest.mark.timeout(60)
def test_state_resets_exactly_at_episode_ends_and_stays_with_its_env():
    env = CountdownEnv(5)
    policy = rnn_policy(env)
    rec = Recorder(policy)
    store, order = run_sampler(env, policy, num_slots=3)
    calls = rec.calls[: 3 * 6]  # the steps of the 3 READY slots (the sampler may have acted once more)
    length = torch.arange(5) + 2
    for t, call in enumerate(calls):
        # Expected, from the episode lengths alone: the state is zeroed before step t where step t - 1 ended an
        # episode (terminated for even envs, truncated for odd ones), and before the very first step.
        expected = torch.ones(5, dtype=torch.bool) if t == 0 else (t % length == 0)
        assert torch.equal(call["reset"], expected), f"step {t}"
        if t > 0:  # never carried from one env to another: row i continues row i of the previous step's output
            assert torch.equal(call["state"], calls[t - 1]["new_state"])
    # The store holds what the sampler used: the state entering each slot and every row's reset flag.
    for k, slot_idx in enumerate(order):
        slot = store.slot(slot_idx)
        assert torch.equal(slot["rnn_state"], calls[6 * k]["state"])
        for t in range(7 if k < 2 else 6):  # row 6 is the next slot's row 0
            assert torch.equal(slot["rnn_reset"][t], calls[6 * k + t]["reset"])
    # the states really differ between envs (else "never carried across envs" would be vacuous)
    assert not torch.equal(calls[3]["new_state"][0], calls[3]["new_state"][1])


@pytest.mark.timeout(60)
def test_trial_memory_resets_only_at_trial_ends():
    env = make("toy", 4, kind="bandit", trial_episodes=3)
    policy = rnn_policy(env, memory="trial")
    rec = Recorder(policy)
    run_sampler(env, policy, num_slots=2)
    for t, call in enumerate(rec.calls[:12]):
        # every pull ends an episode (terminated), but the state is zeroed only every 3 pulls: a new trial
        assert torch.equal(call["reset"], torch.full((4,), t % 3 == 0)), f"step {t}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rnn,memory", [("gru", "episode"), ("lstm", "episode"), ("gru", "trial")])
def test_sequence_rerun_from_the_stored_state_reproduces_the_samplers_logp(rnn, memory):
    """float64 policy and stored state: the learner's re-run of each slot (all columns, and a column subset as
    in a minibatch) gives the log-probs the sampler acted with."""
    env = CountdownEnv(5) if memory == "episode" else make("toy", 5, kind="bandit", trial_episodes=4)
    policy = rnn_policy(env, rnn, memory, dtype=torch.float64)
    rec = Recorder(policy)
    store, order = run_sampler(env, policy, num_slots=3)
    for k, slot_idx in enumerate(order):
        slot = store.slot(slot_idx)
        seq = sequence_inputs(slot, policy.rl2)
        logp, _, _, _ = policy.evaluate_sequence(slot["obs"], slot["actions"], seq)
        sampled = torch.stack([c["logp"] for c in rec.calls[6 * k : 6 * k + 6]])
        assert logp.dtype == torch.float64
        torch.testing.assert_close(logp, sampled, rtol=0, atol=1e-12)
        cols = torch.tensor([3, 1])
        sub, _, _, _ = policy.evaluate_sequence(slot["obs"][:, cols], slot["actions"][:, cols], seq.columns(cols))
        torch.testing.assert_close(sub, sampled[:, cols], rtol=0, atol=1e-12)


@pytest.mark.timeout(60)
def test_burn_in_rows_get_no_gradient():
    env = CountdownEnv(4)
    policy = rnn_policy(env)
    store, order = run_sampler(env, policy, num_slots=1)
    slot = store.slot(order[0])
    obs = slot["obs"].clone().requires_grad_(True)
    burn_in, replayed = 2, torch.tensor([False, False, True, True])
    logp, entropy, values, _ = policy.evaluate_sequence(obs, slot["actions"], sequence_inputs(slot, False),
                                                        detach_cols=replayed, detach_at=burn_in)  # fmt: skip
    # the learner's loss mask: burn-in rows of the replayed columns are not trained on
    trained = torch.ones(6, 4, dtype=torch.bool)
    trained[:burn_in, replayed] = False
    (logp[trained].sum() + values[:6][trained].square().sum()).backward()
    grad = obs.grad.abs().sum(-1)  # [T + 1, B]
    assert torch.all(grad[:burn_in][:, replayed] == 0)  # nothing reaches the burn-in rows of replayed columns
    assert torch.all(grad[burn_in:6][:, replayed] > 0)
    assert torch.all(grad[:burn_in][:, ~replayed] > 0)  # fresh columns: BPTT from later rows reaches row 0


def _train(kind_options: dict, policy_cfg: PolicyConfig, env_steps: int, rollout_len: int) -> list[float]:
    from sample_fast.runner import Runner, RunnerConfig

    returns: list[float] = []

    class Hooks:
        def on_train(self, env_steps, metrics):
            pass

        def on_episodes(self, env_steps, ep_returns, lengths):
            returns.extend(ep_returns.tolist())

        def on_stop(self, env_steps, reason):
            pass

    cfg = SamplerConfig(rollout_len=rollout_len, num_splits=2, num_slots=4, seed=0)
    runner = Runner(functools.partial(make, "toy", 64, **kind_options),
                    functools.partial(_toy_policy, kind_options, policy_cfg),
                    functools.partial(_toy_learner), cfg, RunnerConfig(poll_s=0.05), mode="serial",
                    hooks=Hooks())  # fmt: skip
    runner.run(total_env_steps=env_steps)
    return returns


def _toy_policy(kind_options: dict, policy_cfg: PolicyConfig) -> ActorCritic:
    env = make("toy", 1, **kind_options)
    torch.manual_seed(0)
    return ActorCritic(env.observation_spec, env.action_spec, policy_cfg)


def _toy_learner(policy: ActorCritic) -> Learner:
    return Learner(policy, LearnerConfig(lr=3e-3, num_epochs=4, num_minibatches=2))


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.timeout(120)
def test_gru_recalls_the_cue_and_an_mlp_stays_at_chance(one_thread):
    # recall_steps=8: the cue at step 0, the query at step 7; chance = 1/2 (2 cues). 60k env steps = 7.5k episodes.
    options = {"kind": "recall", "recall_steps": 8}
    gru = _train(options, PolicyConfig(hidden_sizes=[32], rnn="gru", rnn_size=32), 60_000, rollout_len=16)
    mlp = _train(options, PolicyConfig(hidden_sizes=[32]), 60_000, rollout_len=16)
    gru_rate, mlp_rate = sum(gru[-500:]) / 500, sum(mlp[-500:]) / 500
    assert gru_rate >= 0.9, gru_rate
    # 500 fair coin flips: mean 0.5, std 0.022; an MLP cannot beat chance, so 0.6 is > 4 std away
    assert 0.4 <= mlp_rate <= 0.6, mlp_rate


@pytest.mark.timeout(120)
def test_trial_memory_beats_episode_memory_on_the_bandit(one_thread):
    # 2 arms paying 0.9 / 0.1, one pull per episode, 8 pulls per trial: without memory across episodes 0.5 per pull.
    options = {"kind": "bandit", "trial_episodes": 8}
    trial = _train(options, PolicyConfig(hidden_sizes=[32], rnn="gru", rnn_size=32, memory="trial"), 64_000, 16)
    episode = _train(options, PolicyConfig(hidden_sizes=[32], rnn="gru", rnn_size=32), 64_000, 16)
    trial_rate, episode_rate = sum(trial[-2000:]) / 2000, sum(episode[-2000:]) / 2000
    assert trial_rate >= 0.75, trial_rate  # the optimum is ~0.85 (the first pull of a trial is a coin flip)
    assert 0.45 <= episode_rate <= 0.55, episode_rate  # 2000 pulls at 0.5: std 0.011


@pytest.mark.timeout(60)
def test_r2d2_replay_keeps_the_stored_state_and_burns_in(one_thread):
    from sample_fast.replay import ReplayConfig, TrajectoryReplay

    env = CountdownEnv(4)
    policy = rnn_policy(env)
    store, order = run_sampler(env, policy, num_slots=3)
    batches = [store.slot(i).clone() for i in order]
    replay = TrajectoryReplay(ReplayConfig(ratio=0.5, capacity=8, segment_envs=2, burn_in=2, priority_eta=0.9))
    learner = Learner(policy, LearnerConfig(num_minibatches=2, max_policy_lag=None), replay=replay)
    first = learner.train(batches[0])
    assert first["replay_segments"] == 0 and len(replay) == 2
    # the memory keeps each segment's slot-start state: columns 0-1 and 2-3 of the first slot
    stored = replay.buffer.storage[torch.arange(2)]
    torch.testing.assert_close(stored["rnn_state"].reshape(4, 1, 8), batches[0]["rnn_state"], rtol=0, atol=0)
    torch.testing.assert_close(stored["rnn_reset"].transpose(0, 1).reshape(7, 4), batches[0]["rnn_reset"], rtol=0,
                               atol=0)  # fmt: skip
    second = learner.train(batches[1])
    assert second["replay_segments"] == 1  # 0.5 * 4 columns / 2 per segment
    # the replayed columns' first 2 of 6 rows are burn-in: masked out of the loss (their age is within max_age)
    assert second["replay_masked_frac"] == pytest.approx(2 / 6)
    assert second["num_updates"] == 2 * 2  # num_epochs x num_minibatches: whole-column minibatches


def test_r2d2_priority_mixes_max_and_mean():
    from sample_fast.replay import segment_priorities

    adv = torch.tensor([[1.0, -3.0, 2.0, 0.0], [-1.0, 1.0, 0.0, 4.0]])  # [T=2, B=4], b = 2
    # segment 0: |1| |-3| |-1| |1|: max 3, mean 1.5 -> 0.9 * 3 + 0.1 * 1.5 = 2.85; segment 1: max 4, mean 1.5 -> 3.75
    torch.testing.assert_close(segment_priorities(adv, adv, adv, 2, eta=0.9), torch.tensor([2.85, 3.75]))
    assert segment_priorities(adv, adv, adv, 2, eta=0.0).tolist() == [1.5, 1.5]  # the mean alone, as before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_recurrent_policy_trains_in_async_mode(rnn, one_thread):
    """The sampler process acts with its own copy of the recurrent policy and fills shared slots with the state."""
    from sample_fast.runner import Runner, RunnerConfig

    options = {"kind": "recall", "recall_steps": 4}
    cfg = SamplerConfig(rollout_len=8, num_splits=2, num_slots=4, seed=0)
    policy_cfg = PolicyConfig(hidden_sizes=[16], rnn=rnn, rnn_size=8)
    runner = Runner(functools.partial(make, "toy", 8, **options), functools.partial(_toy_policy, options, policy_cfg),
                    _toy_learner, cfg, RunnerConfig(poll_s=0.05, shutdown_timeout_s=5.0), mode="async")  # fmt: skip
    summary = runner.run(total_env_steps=8 * 4 * 6)
    assert summary["env_steps"] >= 8 * 4 * 6 and runner.learner.policy_version >= 3  # trained on shared slots


def test_stateful_actor_carries_the_state_with_the_samplers_reset_rule():
    """Evaluation and videos (sample_fast.eval) act through StatefulActor: same resets as the sampler."""
    from sample_fast.recurrent import StatefulActor

    env = CountdownEnv(5)
    policy = rnn_policy(env)
    rec = Recorder(policy)
    actor = StatefulActor(policy, 5)
    obs, _ = env.reset()
    for _ in range(12):
        obs, reward, terminated, truncated, info = env.step(actor.act(obs))
        actor.observe(reward, terminated, truncated, info)
    length = torch.arange(5) + 2
    for t, call in enumerate(rec.calls):
        assert torch.equal(call["reset"], torch.ones(5, dtype=torch.bool) if t == 0 else t % length == 0)
        if t > 0:
            assert torch.equal(call["state"], rec.calls[t - 1]["new_state"])


@pytest.mark.timeout(60)
def test_eval_runs_a_recurrent_policy(tmp_path, capsys):
    from test_eval import _fresh_run, _mean_return

    from sample_fast import eval as eval_mod

    _fresh_run(tmp_path, "env=recall")
    assert eval_mod.main([str(tmp_path), "--episodes", "8"]) == 0
    # 8 deterministic episodes of an untrained GRU: each return is 0 or 1
    assert 0.0 <= _mean_return(capsys.readouterr()[0]) <= 1.0


def test_replay_memory_refuses_a_layout_change():
    """A memory of recurrent segments cannot take a batch without their state (nor the other way round)."""
    from sample_fast.replay import ReplayConfig, ReplayConfigError, TrajectoryReplay

    env = CountdownEnv(4)
    store, order = run_sampler(env, rnn_policy(env), num_slots=1)
    batch = store.slot(order[0]).clone()
    replay = TrajectoryReplay(ReplayConfig(ratio=0.5, capacity=4, segment_envs=2))
    replay.add(batch)
    del batch["rnn_state"], batch["rnn_reset"]
    with pytest.raises(ReplayConfigError, match="one memory holds one policy's layout"):
        replay.add(batch)
