"""Sampler (in-process): double-buffered order, batch correctness on the toy env, versions, backpressure, episodes.

``VersionPolicy`` is a stand-in for ActorCritic whose action mean encodes the version of its weights (a parameter
AND a buffer, like normaliser statistics), so a batch proves which weights produced each action. test_runner.py
reuses it.
"""

import math
import sys

import pytest
import torch
from sample_fast.envs import Spec, make
from sample_fast.envs.toy import ToyEnv

from sample_fast.param_store import ParamStore
from sample_fast.runner import RunnerConfig
from sample_fast.sampler import EpisodeRing, Sampler, SamplerConfig, acting_device, build_split_envs
from sample_fast.trajectory_store import TrajectoryStore

ACTION_STEP = 0.002  # mean action = ACTION_STEP * version (half from the parameter, half from the buffer)
LOG_STD = -9.0  # std 1.2e-4: versions 0.002 apart are 16 standard deviations apart


class VersionPolicy(torch.nn.Module):
    """ActorCritic contract (act/evaluate/value); mean = bias + 0.001 * stat, values = obs.sum(-1)."""

    def __init__(self, act_dim: int = 2) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(act_dim))
        self.register_buffer("stat", torch.zeros(()))

    def set_version(self, version: int) -> None:
        with torch.no_grad():
            self.bias.fill_(0.001 * version)
            self.stat.fill_(float(version))

    def _mean(self, n: int) -> torch.Tensor:
        return (self.bias + 0.001 * self.stat).expand(n, self.bias.numel())

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False):
        noise = torch.randn(obs.shape[0], self.bias.numel())
        actions = self._mean(obs.shape[0]) + noise * math.exp(LOG_STD)
        logp = (-0.5 * noise.square() - LOG_STD - 0.5 * math.log(2 * math.pi)).sum(-1)
        return actions, logp, obs.sum(-1)

    def evaluate(self, obs, actions):
        z = (actions - self._mean(obs.shape[0])) / math.exp(LOG_STD)
        logp = (-0.5 * z.square() - LOG_STD - 0.5 * math.log(2 * math.pi)).sum(-1)
        return logp, torch.zeros_like(logp), obs.sum(-1)

    def value(self, obs):
        return obs.sum(-1)


def toy_env(num_envs: int) -> ToyEnv:
    # A constant action ~0 misses when mean(target^2) > 0.5 (P ~ 0.21 per step): episodes of 8 steps end both
    # terminated and truncated.
    return make("toy", num_envs, terminate_on_miss=True, miss_threshold=0.5, max_episode_steps=8)


def true_next_obs(batch) -> torch.Tensor:
    """``[T, B, ...]`` the observation each step actually reached, rebuilt from the slot layout: ``obs[t + 1]``,
    replaced by the side table's final obs where a step truncated (not terminated)."""
    count = int(batch["final_count"])
    nxt = batch["obs"][1:].clone()
    nxt[batch["final_step_idx"][:count], batch["final_env_idx"][:count]] = batch["final_obs"][:count]
    return nxt


def check_batch(batch, miss_threshold: float = 0.5) -> None:
    """Independent checks of one [T, B] toy batch collected by VersionPolicy."""
    obs, term, trunc = batch["obs"], batch["terminated"], batch["truncated"]
    num_steps = term.shape[0]
    assert obs.shape[0] == num_steps + 1
    done = term | trunc
    # obs[t + 1] continues the episode where step t did not end it (toy obs[-1] = t / 8 in (0, 1)), and is a fresh
    # episode's first obs (t = 0) where it did, the bootstrap row T included
    assert ((obs[1:][~done][:, -1] > 0) & (obs[1:][~done][:, -1] < 1)).all()
    assert (obs[1:][done][:, -1] == 0).all()
    # the side table lists exactly the truncated, not terminated steps, each with its true final obs (t == 8)
    live_trunc = trunc & ~term
    count = int(batch["final_count"])
    listed = torch.zeros_like(live_trunc)
    listed[batch["final_step_idx"][:count], batch["final_env_idx"][:count]] = True
    assert count == int(live_trunc.sum()) and torch.equal(listed, live_trunc)
    assert (batch["final_obs"][:count][:, -1] == 1.0).all()
    # truncated <=> the true next obs shows t == max_episode_steps (terminated ones need no final obs)
    assert torch.equal(live_trunc, true_next_obs(batch)[..., -1] == 1.0)
    assert torch.equal(term, batch["rewards"] < 1.0 - miss_threshold)
    # the action mean encodes the version of the weights that produced it
    version_from_action = torch.round(batch["actions"] / ACTION_STEP).to(torch.int64)
    assert torch.equal(version_from_action, batch["policy_version"].unsqueeze(-1).expand_as(version_from_action))
    if "values" in batch.keys():  # store_values: values were computed at obs
        torch.testing.assert_close(batch["values"], obs[:-1].sum(-1))


def _serial_sampler(
    num_splits=2, num_slots=4, num_envs=6, rollout_len=5, version=None, store_values=False, **cfg_kwargs
):
    cfg = SamplerConfig(
        rollout_len=rollout_len, num_splits=num_splits, num_slots=num_slots, seed=3, store_values=store_values,
        **cfg_kwargs,
    )  # fmt: skip
    envs = build_split_envs(lambda: toy_env(num_envs), num_splits)
    store = TrajectoryStore(
        envs[0].observation_spec, envs[0].action_spec, rollout_len, num_envs, num_slots,
        max_episode_steps=envs[0].max_episode_steps, store_values=store_values,
    )  # fmt: skip
    policy = VersionPolicy()
    version = version if version is not None else {"v": 0}
    policy.set_version(version["v"])
    ring = EpisodeRing(1024, shared=False)
    sampler = Sampler(envs, policy, store, cfg, version_fn=lambda: version["v"], episodes=ring, split_seeds=[3, 4])
    return sampler, store, policy, version, ring


def test_double_buffered_order_overlaps_one_split_with_the_other():
    log = []

    class Recording(ToyEnv):
        def _send(self, actions):
            log.append(("send", self.tag))

        def _recv(self, actions):
            log.append(("recv", self.tag))
            return self._step(actions)

    envs = [Recording("toy", 2), Recording("toy", 2)]
    envs[0].tag, envs[1].tag = "A", "B"
    cfg = SamplerConfig(rollout_len=3, num_splits=2, num_slots=4, seed=0)
    store = TrajectoryStore(envs[0].observation_spec, envs[0].action_spec, 3, 2, 4)
    policy = VersionPolicy()

    class LoggingPolicy(VersionPolicy):
        def act(self, obs, deterministic=False):
            log.append(("act",))
            return super().act(obs)

    policy = LoggingPolicy()
    sampler = Sampler(envs, policy, store, cfg, version_fn=lambda: 0)
    sampler.advance(wait_s=0.0)
    sampler.advance(wait_s=0.0)
    # While B's step is in flight (send B .. recv B), A is received, acted on and sent again: A's policy forward
    # overlaps B's physics, and vice versa.
    assert log == [
        ("act",), ("send", "A"), ("act",), ("send", "B"),
        ("recv", "A"), ("act",), ("send", "A"), ("recv", "B"), ("act",), ("send", "B"),
    ]  # fmt: skip
    sampler.close()
    assert envs[0]._closed and envs[1]._closed


@pytest.mark.parametrize("store_values", [False, True])
def test_serial_batches_are_continuous_across_slots_and_record_versions(store_values):
    sampler, store, policy, version, ring = _serial_sampler(store_values=store_values)
    assert store.final_capacity == 6  # ceil(T=5 / max_episode_steps=8) = 1 truncation per env at most
    per_split: dict[int, list[int]] = {0: [], 1: []}
    slots_seen = []
    for _rollout in range(6):
        owners = {s.slot_idx: i for i, s in enumerate(sampler.splits) if s.slot_idx is not None}
        while sampler.advance(wait_s=0.0) == 0:
            owners.update({s.slot_idx: i for i, s in enumerate(sampler.splits) if s.slot_idx is not None})
        while (slot_idx := store.acquire_ready(0.0)) is not None:
            batch = store.slot(slot_idx).clone()
            store.check_written(slot_idx)
            check_batch(batch)
            assert ("values" in batch.keys()) == store_values
            per_split[owners[slot_idx]].append(len(slots_seen))
            slots_seen.append(batch)
            store.release(slot_idx)
        version["v"] += 1  # "train": new weights, same policy object (serial mode)
        policy.set_version(version["v"])
    assert len(slots_seen) == 12 and all(len(v) == 6 for v in per_split.values())
    versions = set()
    for _split_idx, order in per_split.items():
        for prev, nxt in zip(order, order[1:], strict=False):
            a, b = slots_seen[prev], slots_seen[nxt]
            # the rollout boundary loses no transition: slot n's bootstrap row T is slot n+1's first obs (also
            # where the last step ended an episode: then both are the reset obs, and the side table has the rest)
            assert torch.equal(a["obs"][-1], b["obs"][0])
        for i in order:
            versions |= set(slots_seen[i]["policy_version"].unique().tolist())
    assert versions == set(range(6))  # rollouts 0..5 acted with versions 0..5, and each step says which
    # episodes: every done flag produced exactly one (return, length) in the ring
    returns, lengths = ring.drain()
    num_done = sum(int((b["terminated"] | b["truncated"]).sum()) for b in slots_seen)
    # pending in-flight steps of the current slots may have ended episodes too: at least all batched ones
    assert returns.numel() >= num_done and lengths.min() >= 1 and lengths.max() <= 8
    sampler.close()


def test_episode_returns_match_rewards_of_the_batch():
    sampler, store, _, _, ring = _serial_sampler(num_splits=2, num_envs=3, rollout_len=40)
    owners, batches = {}, {}
    while len(batches) < 2:
        sampler.advance(wait_s=0.0)
        owners.update({s.slot_idx: i for i, s in enumerate(sampler.splits) if s.slot_idx is not None})
        while (slot_idx := store.acquire_ready(0.0)) is not None:
            batches[owners[slot_idx]] = store.slot(slot_idx).clone()
            store.release(slot_idx)
    # Reconstruct finished episodes from each split's rewards (all envs start fresh at t=0 of these slots), summed
    # in float32 as the env's EpisodeTracker sums them (a float64 sum rounds to another 4th decimal now and then).
    expected = []
    for batch in batches.values():
        done = (batch["terminated"] | batch["truncated"]).T
        for env_rewards, env_done in zip(batch["rewards"].T, done, strict=True):
            ret, length = torch.zeros((), dtype=torch.float32), 0
            for r, d in zip(env_rewards, env_done.tolist(), strict=True):
                ret, length = ret + r, length + 1
                if d:
                    expected.append((round(float(ret), 4), length))
                    ret, length = torch.zeros((), dtype=torch.float32), 0
    returns, lengths = ring.drain()
    got = sorted(zip([round(x, 4) for x in returns.tolist()], lengths.tolist(), strict=True))
    # the ring may also hold episodes ended by the steps already in flight beyond the slots; all batch ones are there
    assert len(expected) > 10
    for item in expected:
        assert item in got
        got.remove(item)
    sampler.close()


def test_backpressure_waits_bounded_and_resumes():
    sampler, store, _, _, _ = _serial_sampler(num_splits=2, num_slots=3, rollout_len=2)
    ready = 0
    while ready < 3:  # fills all 3 slots (never released): the sampler must wait, not fail
        ready += sampler.advance(wait_s=0.0)
        assert sampler.wait_s < 1.0
    before = sampler.wait_s
    assert sampler.advance(wait_s=0.1) == 0  # both splits wait for a FREE slot, ~0.1 s each at most
    assert 0.05 < sampler.wait_s - before < 2.0
    slot_idx = store.acquire_ready(0.0)
    store.release(slot_idx)
    progressed = sum(sampler.advance(wait_s=0.0) for _ in range(4))
    assert progressed == 1  # exactly the released slot was refilled
    sampler.close()
    assert store.state_names().count("FILLING") == 0  # close() discarded partial slots


def test_episode_ring_overflow_is_counted_not_fatal():
    ring = EpisodeRing(4, shared=False)
    ring.push(torch.arange(3.0), torch.arange(3))
    r, lengths = ring.drain()
    assert r.tolist() == [0.0, 1.0, 2.0] and lengths.tolist() == [0, 1, 2]
    ring.push(torch.arange(10.0), torch.arange(10))
    r, _ = ring.drain()
    assert r.tolist() == [6.0, 7.0, 8.0, 9.0] and ring.dropped == 6


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="try num_slots=4"):
        SamplerConfig(num_splits=2, num_slots=2)
    with pytest.raises(ValueError, match="runner.mp_start_method must be spawn or forkserver"):
        RunnerConfig(mp_start_method="fork")
    with pytest.raises(TypeError, match="mp_start_method"):  # a runner setting, not the sampler's any more
        SamplerConfig(mp_start_method="spawn")
    with pytest.raises(ValueError, match="different env groups"):
        sizes = iter([2, 3])
        build_split_envs(lambda: make("toy", next(sizes)), 2)


def test_gil_switch_interval_holds_while_the_sampler_lives_and_is_restored_by_close():
    before = sys.getswitchinterval()
    sampler, store, *_ = _serial_sampler(gil_switch_interval_s=2e-4)
    try:
        assert sys.getswitchinterval() == pytest.approx(2e-4)
        for _ in range(12):  # the sampler still fills slots
            sampler.advance(wait_s=0.0)
        assert store.acquire_ready(timeout_s=0.0) is not None
    finally:
        sampler.close()
    assert sys.getswitchinterval() == before
    sampler, *_ = _serial_sampler()  # None: the process's interval is left alone
    sampler.close()
    assert sys.getswitchinterval() == before
    for bad in (0, -1e-3, 2.0, True, "1ms"):
        with pytest.raises(ValueError, match=r"gil_switch_interval_s must be a number of seconds in \(0, 1\]"):
            SamplerConfig(gil_switch_interval_s=bad)


@pytest.mark.parametrize("refresh", ["step", "slot"])
def test_async_weights_refresh_mid_slot(refresh):
    # Async mode: weights published while a slot fills reach the next policy forward ("step") or wait for the
    # next slot ("slot"); either way every step's recorded version is the one whose weights produced its action.
    rollout_len, num_envs = 6, 4
    cfg = SamplerConfig(rollout_len=rollout_len, num_splits=2, num_slots=4, seed=0, weights_refresh=refresh)
    envs = build_split_envs(lambda: toy_env(num_envs), 2)
    store = TrajectoryStore(envs[0].observation_spec, envs[0].action_spec, rollout_len, num_envs, 4)
    learner_policy, policy = VersionPolicy(), VersionPolicy()
    params = ParamStore(learner_policy)
    params.publish(learner_policy, version=0)
    sampler = Sampler(envs, policy, store, cfg, param_store=params)
    try:
        for _ in range(3):  # steps 0..2 of the first slot of both splits, acted with version 0
            sampler.advance(wait_s=0.0)
        learner_policy.set_version(1)
        params.publish(learner_policy, version=1)
        batches = []
        while len(batches) < 2:
            if sampler.advance(wait_s=0.0):
                while (idx := store.acquire_ready(timeout_s=0.0)) is not None:
                    batches.append(store.slot(idx).clone())
                    store.release(idx)
        for batch in batches:  # the first slot of split A and of split B
            check_batch(batch)
            versions = batch["policy_version"][:, 0].tolist()
            expected = [0, 0, 0, 1, 1, 1] if refresh == "step" else [0] * rollout_len
            assert versions == expected
    finally:
        sampler.close()


def test_sampler_device_names_the_choices():
    assert SamplerConfig().device == "auto" and acting_device("auto") == torch.device("cpu")
    assert acting_device("cuda:1") == torch.device("cuda", 1)  # no CUDA needed to name one (resolve checks that)
    for bad in ("gpu", "meta", "cuda:x", ""):
        with pytest.raises(ValueError, match=r"sampler\.device=.*not a device the sampler can act on; use auto, cpu"):
            SamplerConfig(device=bad)


def test_weights_refresh_rejects_unknown_values():
    with pytest.raises(ValueError, match="weights_refresh must be step or slot"):
        SamplerConfig(weights_refresh="sometimes")


def test_no_critic_forward_unless_store_values():
    calls = []

    class ValueAwarePolicy(VersionPolicy):
        @torch.no_grad()
        def act(self, obs, deterministic=False, *, with_value=True):
            calls.append(with_value)
            actions, logp, values = super().act(obs)
            return actions, logp, values if with_value else None

    for store_values in (False, True):
        calls.clear()
        cfg = SamplerConfig(rollout_len=2, num_splits=1, num_slots=2, seed=0, store_values=store_values)
        envs = build_split_envs(lambda: toy_env(3), 1)
        store = TrajectoryStore(envs[0].observation_spec, envs[0].action_spec, 2, 3, 2, store_values=store_values)
        sampler = Sampler(envs, ValueAwarePolicy(), store, cfg, version_fn=lambda: 0)
        while sampler.advance(wait_s=0.0) == 0:
            pass
        batch = store.slot(store.acquire_ready(0.0))
        assert calls and set(calls) == {store_values}
        assert ("values" in batch.keys()) == store_values
        check_batch(batch)
        sampler.close()
    with pytest.raises(ValueError, match="store_values"):
        Sampler(build_split_envs(lambda: toy_env(3), 1), VersionPolicy(), store, SamplerConfig(
            rollout_len=2, num_splits=1, num_slots=2), version_fn=lambda: 0)  # fmt: skip


def test_actor_critic_act_without_value_samples_the_same_actions():
    from sample_fast.policy import ActorCritic, PolicyConfig

    env = toy_env(4)
    policy = ActorCritic(env.observation_spec, env.action_spec, PolicyConfig(hidden_sizes=[8]))
    obs, _ = env.reset(seed=0)
    torch.manual_seed(1)
    actions, logp, values = policy.act(obs)
    torch.manual_seed(1)
    actions2, logp2, none = policy.act(obs, with_value=False)
    assert none is None and torch.equal(actions, actions2) and torch.equal(logp, logp2)
    torch.testing.assert_close(values, policy.value(obs).detach())


class PixelToy(ToyEnv):
    """The toy env with uint8 observations (round(100 * obs)): a stand-in for a pixel task."""

    def __init__(self, num_envs: int) -> None:
        super().__init__("toy", num_envs, max_episode_steps=3)
        self.observation_spec = Spec(shape=self.observation_spec.shape, dtype=torch.uint8)

    @staticmethod
    def _pixels(obs):
        return (obs.clamp(0, 1) * 100).round().to(torch.uint8)

    def _reset(self, seed):
        obs, info = super()._reset(seed)
        return self._pixels(obs), info

    def _step(self, actions):
        res = super()._step(actions)
        res.info["final_obs"] = self._pixels(res.info["final_obs"])
        return res._replace(obs=self._pixels(res.obs))


def test_uint8_observations_are_stored_as_uint8_and_every_row_is_marked_written():
    cfg = SamplerConfig(rollout_len=4, num_splits=1, num_slots=2, seed=0)
    envs = [PixelToy(3)]
    store = TrajectoryStore(envs[0].observation_spec, envs[0].action_spec, 4, 3, 2, max_episode_steps=3)
    sampler = Sampler(envs, VersionPolicy(), store, cfg, version_fn=lambda: 0)
    while sampler.advance(wait_s=0.0) == 0:
        pass
    slot_idx = store.acquire_ready(0.0)
    batch = store.slot(slot_idx)
    store.check_written(slot_idx)  # every obs row, the bootstrap row included, was marked written
    assert batch["obs"].dtype == torch.uint8 and batch["final_obs"].dtype == torch.uint8
    # max_episode_steps = 3: every env truncates at t = 2 (time feature 100 = t / 3 * 100 at t = 3 steps)
    count = int(batch["final_count"])
    assert count == 3 and (batch["final_step_idx"][:count] == 2).all()
    assert (batch["final_obs"][:count, -1] == 100).all() and (batch["obs"][3, :, -1] == 0).all()
    store.release(slot_idx)
    sampler.close()
