"""Tests of ``sample_fast.checkpoint``: round trips, keep-last-K and best, a crash mid-write, and truncated or
corrupted files being reported and skipped in favour of the previous good checkpoint."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from sample_fast.checkpoint import CheckpointError, CheckpointManager, read_checkpoint_file


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


def test_learner_and_policy_state_survive_a_checkpoint(tmp_path):
    from sample_fast.envs import Spec

    from sample_fast.learner import Learner, LearnerConfig
    from sample_fast.policy import ActorCritic, PolicyConfig

    obs_spec, act_spec = Spec(shape=(3,), dtype=torch.float32), Spec(shape=(2,), dtype=torch.float32)
    policy = ActorCritic(obs_spec, act_spec, PolicyConfig(hidden_sizes=[8]))
    policy.update_normalizer(torch.randn(10, 3))
    learner = Learner(policy, LearnerConfig())
    mgr = CheckpointManager(tmp_path)
    mgr.save({"policy": policy.state_dict(), "learner": learner.state_dict()}, env_steps=1)
    state, _ = mgr.load_latest()
    restored = ActorCritic(obs_spec, act_spec, PolicyConfig(hidden_sizes=[8]))
    restored.load_state_dict(state["policy"])
    Learner(restored, LearnerConfig()).load_state_dict(state["learner"])
    for key, value in policy.state_dict().items():
        assert torch.equal(value, restored.state_dict()[key]), key
