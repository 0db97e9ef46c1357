"""TrajectoryStore: slot state machine, poison fill, and a slot written in a child process read back exactly."""

import multiprocessing

import pytest
import torch
from sample_fast.envs import Spec

from sample_fast import trajectory_store
from sample_fast.trajectory_store import (
    FILLING,
    FREE,
    INT_POISON,
    READY,
    TRAINING,
    SharedMemoryTooSmall,
    SlotStateError,
    TrajectoryStore,
    check_shared_memory,
    final_obs_capacity,
    store_bytes,
    trajectory_spec,
)

OBS = Spec(shape=(3,), dtype=torch.float32)
ACT = Spec(shape=(2,), dtype=torch.float32)
DISCRETE = Spec(shape=(), dtype=torch.int64, num_actions=4)


PIXELS = Spec(shape=(2, 2), dtype=torch.uint8)


def _store(**kw):
    return TrajectoryStore(OBS, ACT, rollout_len=4, num_envs=5, num_slots=3, **kw)


def _fill_written(store, slot_idx, count=0):
    """Write every per-step key and obs row of a slot with zeros and a side table of ``count`` rows."""
    slot = store.slot(slot_idx)
    for key, tensor in slot.items():
        if key not in ("final_obs", "final_step_idx", "final_env_idx", "final_count"):
            tensor.zero_()
    slot["final_count"].fill_(count)
    slot["final_obs"][:count] = 0
    slot["final_step_idx"][:count] = torch.arange(count) // 5
    slot["final_env_idx"][:count] = torch.arange(count) % 5
    slot["truncated"].view(-1)[:count] = True  # row-major (t, e) order matches the table's rows
    if store.obs_written is not None:
        store.obs_written[slot_idx].fill_(True)
    return slot


def test_shapes_dtypes_and_poison_at_allocation():
    store = _store()
    slot = store.slot(1)
    assert slot["obs"].shape == (5, 5, 3) and slot["obs"].dtype == torch.float32  # [T + 1, B, ...]
    assert slot["actions"].shape == (4, 5, 2) and "next_obs" not in slot.keys() and "values" not in slot.keys()
    assert slot["terminated"].dtype == torch.bool and slot["policy_version"].dtype == torch.int64
    # side table: no max_episode_steps -> the worst case, every step of every env truncates: T * B = 20 rows
    assert store.final_capacity == 20 and slot["final_obs"].shape == (20, 3)
    assert slot["final_step_idx"].shape == (20,) and slot["final_count"].shape == ()
    assert torch.isnan(slot["obs"]).all() and torch.isnan(slot["rewards"]).all()
    assert (slot["policy_version"] == INT_POISON).all()
    assert (slot["terminated"].view(torch.uint8) == 255).all()
    # every entry of every per-step key is poisoned (5*5*3 obs incl. the bootstrap row, 4*5 per scalar key, 4*5*2
    # actions); a poisoned final_count counts 1 and hides the table rows behind it
    assert store.find_poison(1) == {
        "obs": 75, "actions": 40, "behavior_logp": 20, "rewards": 20,
        "terminated": 20, "truncated": 20, "policy_version": 20, "final_count": 1,
    }  # fmt: skip
    discrete = TrajectoryStore(OBS, DISCRETE, 2, 3, 2)
    assert discrete.slot(0)["actions"].shape == (2, 3) and discrete.slot(0)["actions"].dtype == torch.int64
    with_values = _store(store_values=True)
    assert with_values.slot(0)["values"].shape == (4, 5)


def test_side_table_capacity_from_the_time_limit():
    # ceil(T / L) truncations per env: L = 1000 (Ant), T = 64 -> 1 per env; L = 3, T = 4 -> 2 per env (t = 0, 3)
    assert final_obs_capacity(64, 128, 1000) == 128
    assert final_obs_capacity(4, 5, 3) == 10
    assert final_obs_capacity(4, 5, 1) == final_obs_capacity(4, 5, None) == 20
    assert _store(max_episode_steps=3).slot(0)["final_obs"].shape == (10, 3)


def test_poison_catches_one_unwritten_entry():
    store = _store()
    slot = _fill_written(store, 0, count=3)
    assert store.find_poison(0) == {}
    store.check_written(0)
    slot["truncated"][3, 4] = False
    slot["terminated"].view(torch.uint8)[2, 1] = 255  # a flag never written
    slot["rewards"][0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="unwritten data") as err:
        store.check_written(0)
    assert "'terminated': 1" in str(err.value) and "'rewards': 1" in str(err.value)
    store.poison(0)
    assert store.find_poison(0)["obs"] == 75


def test_poison_catches_the_bootstrap_row_and_side_table_rows():
    store = _store()
    slot = _fill_written(store, 0, count=3)
    slot["obs"][4].fill_(float("nan"))  # the bootstrap row T left unwritten
    assert store.find_poison(0) == {"obs": 15}
    slot = _fill_written(store, 0, count=3)
    slot["final_env_idx"][2] = INT_POISON  # a listed table row never written
    slot["final_obs"][1, 0] = float("nan")
    slot["final_obs"][5] = float("nan")  # beyond final_count: unused, not an error
    assert store.find_poison(0) == {"final_env_idx": 1, "final_obs": 1}
    slot = _fill_written(store, 0, count=3)
    slot["final_count"].fill_(2)  # 3 truncated steps but only 2 listed
    with pytest.raises(RuntimeError, match="lists 2 rows"):
        store.check_written(0)


def test_uint8_observations_stay_uint8_and_unwritten_rows_are_caught():
    store = TrajectoryStore(PIXELS, ACT, rollout_len=3, num_envs=2, num_slots=2)
    slot = store.slot(0)
    assert slot["obs"].dtype == torch.uint8 and slot["obs"].shape == (4, 2, 2, 2)
    assert slot["final_obs"].dtype == torch.uint8
    assert store.obs_written is not None and store.obs_written.shape == (2, 4, 2)
    # every byte is a legal pixel, so unwritten rows are counted from the written mask: all 4 * 2 rows
    assert store.find_poison(0)["obs"] == 8
    _fill_written(store, 0, count=1)
    store.check_written(0)
    store.obs_written[0, 3, 1] = False  # the bootstrap row of env 1 never written
    assert store.find_poison(0) == {"obs": 1}
    store.poison(0)
    assert store.find_poison(0)["obs"] == 8 and store.find_poison(1)["obs"] == 8


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


def _pattern(num_steps, num_envs):
    t = torch.arange(num_steps).view(num_steps, 1)
    e = torch.arange(num_envs).view(1, num_envs)
    return t, e


def _child_writes(store: TrajectoryStore, done) -> None:
    slot_idx = store.acquire_free(timeout_s=5.0)
    slot = store.slot(slot_idx)
    # Write an exact, index-derived pattern everywhere except one obs entry (left poisoned on purpose).
    t, e = _pattern(4, 5)
    slot["rewards"].copy_((10 * t + e).float())
    slot["behavior_logp"].copy_(-(10 * t + e).float())
    slot["policy_version"].copy_(100 + t + 0 * e)
    slot["terminated"].fill_(False)
    slot["truncated"].fill_(True)  # the worst case: every step of every env truncates
    slot["actions"].copy_(torch.full((4, 5, 2), 0.25))
    slot["obs"].copy_(torch.arange(75, dtype=torch.float32).view(5, 5, 3) + 1000)
    slot["obs"][3, 4, 2] = float("nan")
    # the side table at capacity (T * B = 20 rows), in (env, step) order to show the order is free
    rows = torch.arange(20)
    slot["final_env_idx"].copy_(rows // 4)
    slot["final_step_idx"].copy_(rows % 4)
    slot["final_obs"].copy_(-torch.arange(60, dtype=torch.float32).view(20, 3))
    slot["final_count"].fill_(20)
    store.mark_ready(slot_idx)
    done.set()


@pytest.mark.timeout(120)
def test_child_process_writes_slot_parent_reads_exact_values():
    ctx = multiprocessing.get_context("spawn")  # as the runner starts its sampler
    store = _store(shared=True, ctx=ctx)
    done = ctx.Event()
    proc = ctx.Process(target=_child_writes, args=(store, done))
    proc.start()
    slot_idx = store.acquire_ready(timeout_s=90.0)
    proc.join(timeout=10)
    assert proc.exitcode == 0 and slot_idx == 0 and done.is_set()
    slot = store.slot(slot_idx)
    t, e = _pattern(4, 5)
    assert torch.equal(slot["rewards"], (10 * t + e).float())
    assert torch.equal(slot["policy_version"], (100 + t + 0 * e))
    assert not slot["terminated"].any() and slot["truncated"].all()
    expected_obs = torch.arange(75, dtype=torch.float32).view(5, 5, 3) + 1000
    assert torch.equal(slot["obs"][4], expected_obs[4])  # the bootstrap row
    assert int(slot["final_count"]) == 20 == store.final_capacity
    assert torch.equal(slot["final_obs"], -torch.arange(60, dtype=torch.float32).view(20, 3))
    assert torch.equal(slot["final_env_idx"], torch.arange(20) // 4)
    assert torch.equal(slot["final_step_idx"], torch.arange(20) % 4)
    # the one entry the child skipped is caught by the poison check, and nothing else is
    assert store.find_poison(slot_idx) == {"obs": 1}
    assert torch.isnan(slot["obs"][3, 4, 2])
    slot["obs"][3, 4, 2] = 0.0
    store.check_written(slot_idx)  # the full table lists exactly the 20 truncated steps
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


def test_slot_bytes_script_counts_hand_computed_bytes(load_bench):
    slot_bytes = load_bench("slot_bytes")
    ant_obs, ant_act = Spec(shape=(105,), dtype=torch.float32), Spec(shape=(8,), dtype=torch.float32)
    # old: obs + next_obs 2 * 105 * 4 = 840, actions 32, logp/values/rewards 12, flags 2, version 8 -> 894
    assert slot_bytes.old_layout_bytes_per_step(ant_obs, ant_act) == 894
    # new, T = 2, B = 3, L = 1000: obs 3 * 3 * 420 = 3780, per-step keys 2 * 3 * (32 + 4 + 4 + 1 + 1 + 8) = 300,
    # side table ceil(2 / 1000) * 3 = 3 rows of 420 + 8 + 8, final_count 8 -> 5396
    store = TrajectoryStore(ant_obs, ant_act, 2, 3, 1, max_episode_steps=1000)
    assert store.bytes_per_slot() == 3780 + 300 + 3 * 436 + 8


@pytest.mark.parametrize("obs_spec", [OBS, PIXELS])
def test_store_bytes_counts_what_the_store_allocates(obs_spec):
    # the independent count: the bytes of the tensors a local store really holds (obs_written for integer frames)
    store = TrajectoryStore(obs_spec, DISCRETE, 5, 3, 4, max_episode_steps=2)
    held = sum(t.numel() * t.element_size() for t in store.data.values())
    held += store.obs_written.numel() if store.obs_written is not None else 0
    assert store_bytes(store.spec, obs_spec, 4) == held


def test_a_store_that_does_not_fit_in_dev_shm_is_refused_before_allocation(monkeypatch):
    # 4 slots of 129 x 16 Pong frames (28,224 bytes each): 233 MB, more than docker's default 64 MiB of /dev/shm
    pong = Spec(shape=(4, 84, 84), dtype=torch.uint8)
    spec = trajectory_spec(pong, DISCRETE, 128, 16, max_episode_steps=27000)
    need = store_bytes(spec, pong, 4)
    assert need > 4 * 129 * 16 * 28224
    monkeypatch.setattr(trajectory_store, "_free_bytes", lambda path: 64 * 2**20)
    allocated = []
    monkeypatch.setattr(TrajectoryStore, "poison", lambda self, slot_idx=None: allocated.append(self))
    with pytest.raises(SharedMemoryTooSmall, match=r"needs 2\d\d MiB of shared memory, but /dev/shm has 64 MiB free: "
                       r"give it more \(docker run --shm-size=1g.*env\.num_envs, sampler\.rollout_len"):  # fmt: skip
        TrajectoryStore(pong, DISCRETE, 128, 16, 4, max_episode_steps=27000, shared=True,
                        ctx=multiprocessing.get_context("spawn"))  # fmt: skip
    assert allocated == []  # refused before a byte was allocated (and poisoned)
    TrajectoryStore(pong, DISCRETE, 128, 16, 4, max_episode_steps=27000)  # a local store needs no shared memory
    monkeypatch.setattr(trajectory_store, "_free_bytes", lambda path: int(need * 1.1) + 1)
    check_shared_memory(need)  # fits with its 10% margin
    monkeypatch.undo()
    check_shared_memory(10**15, shm_dir="/no/such/dir")  # no /dev/shm (macOS): nothing to check
