"""Tests of ``sample_fast.checkpoint``: round trips, keep-last-K and best, a crash mid-write, and truncated or
corrupted files being reported and skipped in favour of the previous good checkpoint."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch
from sample_fast.envs import Spec

from sample_fast.checkpoint import CheckpointError, CheckpointManager, read_checkpoint_file
from sample_fast.policy import ActorCritic, PolicyConfig

OBS_SPEC, ACT_SPEC = Spec(shape=(3,), dtype=torch.float32), Spec(shape=(2,), dtype=torch.float32)


def state_for(step: int) -> dict:
    return {
        "policy": {"w": torch.full((4,), float(step))},
        "counters": {"env_steps": step},
        "rng": torch.get_rng_state(),
    }


def test_round_trip_keep_last_and_best(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.load_latest() is None and mgr.load_best() is None
    for step, metric in ((100, 1.0), (200, 5.0), (300, 2.0), (400, None)):
        mgr.save(state_for(step), env_steps=step, metric=metric)
    names = [p.name for p in mgr.checkpoints()]
    assert names == ["ckpt_000000000300.pt", "ckpt_000000000400.pt"]  # the last 2 only
    state, path = mgr.load_latest()
    assert path.name == "ckpt_000000000400.pt" and state["counters"]["env_steps"] == 400
    assert torch.equal(state["policy"]["w"], torch.full((4,), 400.0))
    best, best_path = mgr.load_best()
    assert best_path.name == "best.pt" and best["counters"]["env_steps"] == 200  # metric 5.0, pruned from the last K
    # A new manager on the same run dir knows the best metric from the file.
    mgr2 = CheckpointManager(tmp_path, keep_last=2)
    assert mgr2.best_metric == 5.0
    mgr2.save(state_for(500), env_steps=500, metric=4.0)  # not better: best.pt stays the step-200 one
    assert mgr2.load_best()[0]["counters"]["env_steps"] == 200
    mgr2.save(state_for(600), env_steps=600, metric=6.0)
    assert mgr2.load_best()[0]["counters"]["env_steps"] == 600
    assert not [p for p in mgr.dir.iterdir() if ".tmp-" in p.name]  # no temporary files left behind


def test_crash_mid_write_leaves_previous_file(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save(state_for(100), env_steps=100, metric=1.0)

    def crash(*args, **kwargs):  # the process "dies" after the temporary file is written, before the rename
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        mgr.save(state_for(200), env_steps=200, metric=9.0)
    monkeypatch.undo()
    assert [p.name for p in mgr.checkpoints()] == ["ckpt_000000000100.pt"]
    assert mgr.load_latest()[0]["counters"]["env_steps"] == 100
    assert mgr.load_best()[0]["counters"]["env_steps"] == 100
    assert not [p for p in mgr.dir.iterdir() if ".tmp-" in p.name]


def test_save_of_unpicklable_state_changes_nothing(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save(state_for(100), env_steps=100)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        mgr.save({"bad": lambda: None}, env_steps=200)  # serialisation fails before any file is touched
    assert [p.name for p in mgr.checkpoints()] == ["ckpt_000000000100.pt"]


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "garbage"])
def test_damaged_newest_checkpoint_falls_back_with_warning(tmp_path, caplog, damage):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(state_for(100), env_steps=100)
    newest = mgr.save(state_for(200), env_steps=200)
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        pos = len(data) - 100  # inside the payload: only the checksum can catch it
        newest.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :])
    else:
        newest.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=newest.name):
        read_checkpoint_file(newest)
    with caplog.at_level(logging.WARNING, logger="sample_fast.checkpoint"):
        state, path = mgr.load_latest()
    assert path.name == "ckpt_000000000100.pt" and state["counters"]["env_steps"] == 100
    assert any(newest.name in r.getMessage() for r in caplog.records)


def _trained_learner(num_trains: int):
    """A policy and learner after ``num_trains`` APPO iterations on synthetic batches: Adam moments, counters, the
    reward scaler and the minibatch generator have all moved from their initial values."""
    from test_learner import make_batch

    from sample_fast.learner import Learner, LearnerConfig

    torch.manual_seed(0)
    policy = ActorCritic(OBS_SPEC, ACT_SPEC, PolicyConfig(hidden_sizes=[8]))
    learner = Learner(policy, LearnerConfig())
    for i in range(num_trains):
        learner.train(make_batch(policy, seed=i, version=learner.policy_version))
    return policy, learner


def _fresh_learner(seed: int):
    from sample_fast.learner import Learner, LearnerConfig

    torch.manual_seed(seed)
    policy = ActorCritic(OBS_SPEC, ACT_SPEC, PolicyConfig(hidden_sizes=[8]))
    return policy, Learner(policy, LearnerConfig())


def test_learner_and_policy_state_round_trip_exactly(tmp_path):
    from test_learner import make_batch

    policy, learner = _trained_learner(num_trains=3)
    mgr = CheckpointManager(tmp_path)
    mgr.save({"policy": policy.state_dict(), "learner": learner.state_dict()}, env_steps=144)
    state, _ = mgr.load_latest()

    restored_policy, restored = _fresh_learner(seed=1)  # other initial weights, empty Adam state, generator at seed
    assert not torch.equal(restored_policy.state_dict()["actor.0.weight"], policy.state_dict()["actor.0.weight"])
    assert not restored.optimizer.state  # the check below cannot pass by accident
    restored_policy.load_state_dict(state["policy"])
    restored.load_state_dict(state["learner"])

    # policy weights and normaliser statistics
    for key, value in policy.state_dict().items():
        assert torch.equal(value, restored_policy.state_dict()[key]), key
    # Adam moments and step counts, parameter by parameter
    for p, q in zip(learner.params, restored.params, strict=True):
        a, b = learner.optimizer.state[p], restored.optimizer.state[q]
        assert set(a) == set(b) == {"step", "exp_avg", "exp_avg_sq"}
        for k in a:
            assert torch.equal(a[k], b[k]), k
        assert float(a["step"]) == learner.num_updates  # every update stepped every parameter
    # counters: 3 trains of a [8, 6] batch, 2 epochs x 4 minibatches each, none skipped
    assert (learner.policy_version, learner.env_steps, learner.num_updates) == (3, 3 * 48, 3 * 2 * 4)
    for name in ("policy_version", "env_steps", "num_updates", "lr_scale", "adaptive_lr", "nonfinite_skips",
                 "rollbacks", "consecutive_skips", "_good_updates"):  # fmt: skip
        assert getattr(restored, name) == getattr(learner, name), name
    # reward scaler: one discounted return per reward seen (3 x 48), the per-env running returns
    src, dst = learner.reward_scaler, restored.reward_scaler
    assert src.count == 3 * 48 and (dst.count, dst.mean, dst.var) == (src.count, src.mean, src.var)
    assert torch.equal(dst.returns, src.returns)
    # the minibatch generator: the next permutation is the one the uninterrupted learner draws
    state_before = learner.generator.get_state()
    assert torch.equal(
        torch.randperm(48, generator=restored.generator), torch.randperm(48, generator=learner.generator)
    )
    learner.generator.set_state(state_before)
    restored.generator.set_state(state_before)
    # Together: one more iteration on the same batch gives bit-identical metrics and weights.
    batch = make_batch(policy, seed=10, version=3)
    metrics, restored_metrics = learner.train(batch.clone()), restored.train(batch.clone())
    assert metrics == restored_metrics
    for (key, value), other in zip(policy.state_dict().items(), restored_policy.state_dict().values(), strict=True):
        assert torch.equal(value, other), key
