"""TrajectoryStore: slot state machine, poison fill, and a slot written in a child process read back exactly."""

import multiprocessing

import pytest
import torch
from sample_fast.envs import Spec

from sample_fast.trajectory_store import (
    FILLING,
    FREE,
    INT_POISON,
    READY,
    TRAINING,
    SlotStateError,
    TrajectoryStore,
)

OBS = Spec(shape=(3,), dtype=torch.float32)
ACT = Spec(shape=(2,), dtype=torch.float32)
DISCRETE = Spec(shape=(), dtype=torch.int64, num_actions=4)


def _store(**kw):
    return TrajectoryStore(OBS, ACT, rollout_len=4, num_envs=5, num_slots=3, **kw)


def test_shapes_dtypes_and_poison_at_allocation():
    store = _store()
    slot = store.slot(1)
    assert slot.batch_size == torch.Size([4, 5])
    assert slot["obs"].shape == (4, 5, 3) and slot["next_obs"].dtype == torch.float32
    assert slot["actions"].shape == (4, 5, 2)
    assert slot["terminated"].dtype == torch.bool and slot["policy_version"].dtype == torch.int64
    assert torch.isnan(slot["obs"]).all() and torch.isnan(slot["rewards"]).all()
    assert (slot["policy_version"] == INT_POISON).all()
    assert (slot["terminated"].view(torch.uint8) == 255).all()
    # every entry of every key is poisoned: 4*5 per scalar key, 4*5*3 for obs/next_obs, 4*5*2 for actions
    assert store.find_poison(1) == {
        "obs": 60, "actions": 40, "behavior_logp": 20, "values": 20, "rewards": 20,
        "terminated": 20, "truncated": 20, "next_obs": 60, "policy_version": 20,
    }  # fmt: skip
    discrete = TrajectoryStore(OBS, DISCRETE, 2, 3, 2)
    assert discrete.slot(0)["actions"].shape == (2, 3) and discrete.slot(0)["actions"].dtype == torch.int64


def test_poison_catches_one_unwritten_entry():
    store = _store()
    slot = store.slot(0)
    for _key, tensor in slot.items():
        tensor.zero_()
    assert store.find_poison(0) == {}
    store.check_written(0)
    slot["truncated"][3, 4] = False
    slot["terminated"].view(torch.uint8)[2, 1] = 255  # a flag never written
    slot["rewards"][0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="unwritten data") as err:
        store.check_written(0)
    assert "'terminated': 1" in str(err.value) and "'rewards': 1" in str(err.value)
    store.poison(0)
    assert store.find_poison(0)["obs"] == 60


def test_state_machine_legal_cycle_and_illegal_transitions():
    store = _store()
    assert store.state_names() == ["FREE"] * 3
    a = store.acquire_free(timeout_s=0.0)
    b = store.acquire_free(timeout_s=0.0)
    assert (a, b) == (0, 1)
    assert store.acquire_ready(timeout_s=0.0) is None  # nothing READY yet
    store.mark_ready(b)  # b becomes READY before a: the learner must get b first (oldest READY)
    store.mark_ready(a)
    assert store.acquire_ready(timeout_s=0.0) == b
    assert store.state(b) == TRAINING and store.state(a) == READY
    with pytest.raises(SlotStateError, match="READY -> READY"):
        store.mark_ready(a)
    with pytest.raises(SlotStateError, match="TRAINING -> READY"):
        store.mark_ready(b)
    with pytest.raises(SlotStateError, match="FREE -> FREE"):
        store.release(2)
    with pytest.raises(SlotStateError, match="READY -> FREE"):
        store.discard(a)  # a READY slot cannot be discarded: the learner owns it next
    store.release(b)
    assert store.state(b) == FREE
    c = store.acquire_free(timeout_s=0.0)
    store.discard(c)  # FILLING -> FREE is the legal "drop a partial slot"
    assert store.state(c) == FREE
    with pytest.raises(IndexError):
        store.transition(7, FILLING)
    assert {store.state(i) for i in range(3)} <= {FREE, READY, FILLING}
    assert store.state(a) == READY


def test_acquire_times_out_when_full():
    store = _store()
    for _ in range(3):
        assert store.acquire_free(timeout_s=0.0) is not None
    import time

    t0 = time.monotonic()
    assert store.acquire_free(timeout_s=0.2) is None
    assert 0.15 <= time.monotonic() - t0 < 2.0


def _child_writes(store: TrajectoryStore, done) -> None:
    slot_idx = store.acquire_free(timeout_s=5.0)
    slot = store.slot(slot_idx)
    # Write an exact, index-derived pattern everywhere except one obs entry (left poisoned on purpose).
    t = torch.arange(4).view(4, 1)
    e = torch.arange(5).view(1, 5)
    slot["rewards"].copy_((10 * t + e).float())
    slot["behavior_logp"].copy_(-(10 * t + e).float())
    slot["values"].fill_(0.5)
    slot["policy_version"].copy_(100 + t + 0 * e)
    slot["terminated"].copy_((t + e) % 3 == 0)
    slot["truncated"].copy_((t * e) % 4 == 1)
    slot["actions"].copy_(torch.full((4, 5, 2), 0.25))
    slot["next_obs"].copy_(torch.arange(60, dtype=torch.float32).view(4, 5, 3))
    slot["obs"].copy_(torch.arange(60, dtype=torch.float32).view(4, 5, 3) + 1000)
    slot["obs"][3, 4, 2] = float("nan")
    store.mark_ready(slot_idx)
    done.set()


@pytest.mark.timeout(60)
def test_child_process_writes_slot_parent_reads_exact_values():
    ctx = multiprocessing.get_context("forkserver")  # shares test_runner's forkserver when run together (fast)
    store = _store(shared=True, ctx=ctx)
    done = ctx.Event()
    proc = ctx.Process(target=_child_writes, args=(store, done))
    proc.start()
    slot_idx = store.acquire_ready(timeout_s=45.0)
    proc.join(timeout=10)
    assert proc.exitcode == 0 and slot_idx == 0 and done.is_set()
    slot = store.slot(slot_idx)
    t = torch.arange(4).view(4, 1)
    e = torch.arange(5).view(1, 5)
    assert torch.equal(slot["rewards"], (10 * t + e).float())
    assert torch.equal(slot["policy_version"], (100 + t + 0 * e))
    assert torch.equal(slot["terminated"], (t + e) % 3 == 0)
    assert torch.equal(slot["truncated"], (t * e) % 4 == 1)
    assert torch.equal(slot["next_obs"].flatten(), torch.arange(60, dtype=torch.float32))
    # the one entry the child skipped is caught by the poison check, and nothing else is
    assert store.find_poison(slot_idx) == {"obs": 1}
    assert torch.isnan(slot["obs"][3, 4, 2])
    store.release(slot_idx)
    assert store.state_names() == ["FREE"] * 3
    # other slots were never touched: still fully poisoned
    assert store.find_poison(1)["rewards"] == 20
    assert store.state(slot_idx) == FREE and READY not in store.states.tolist()


def test_bad_arguments_are_refused_with_a_fix():
    with pytest.raises(ValueError, match="num_slots must be an int >= 1"):
        TrajectoryStore(OBS, ACT, 4, 5, 0)
    with pytest.raises(ValueError, match="ctx="):
        TrajectoryStore(OBS, ACT, 4, 5, 2, shared=True)
    with pytest.raises(TypeError, match="cannot cross a process boundary"):
        import pickle

        pickle.dumps(_store())
