"""TrajectoryStore: the shared-memory ring of rollout slots between the sampler and the learner.

It owns one ``TensorDict`` ``[num_slots]`` of per-slot tensors (keys in ``docs/sampler.md``: observations
``[T + 1, B, ...]`` stored once, per-step ``[T, B]`` keys, and a compact side table of the true final observations
of truncated steps), allocated once and poisoned at allocation, and a small shared int tensor of slot states
guarded by one multiprocessing lock, with a "doorbell" semaphore per state that a waiter sleeps on:

    FREE --acquire_free--> FILLING --mark_ready--> READY --acquire_ready--> TRAINING --release--> FREE
                              \\--discard (partial slot of a stopped/restarted sampler)--> FREE

Only slot indices cross process boundaries; tensors stay where they were allocated. It never steps envs and never
computes losses.

Why a lock and doorbells, not a ``multiprocessing.Condition``: a Condition's ``notify_all`` blocks until every
registered waiter has woken, so a waiter that was killed (kill -9, a native crash) or stopped (SIGSTOP) while waiting
hangs the notifier -- the learner -- for ever, and a lock held by a dead process is never released. Here nothing
waits without a bound: ringing a doorbell (``Semaphore.release``) never blocks, every lock acquisition has a timeout,
and ``replace_writer`` gives the store a fresh lock and doorbells once a dead writer process is gone.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from typing import Any

import torch
from tensordict import TensorDict

from sample_fast.envs import Spec

FREE, FILLING, READY, TRAINING = 0, 1, 2, 3
STATE_NAMES = {FREE: "FREE", FILLING: "FILLING", READY: "READY", TRAINING: "TRAINING"}
# INVARIANT: these are the only legal slot-state transitions; anything else is a bug and raises SlotStateError.
LEGAL_TRANSITIONS = {(FREE, FILLING), (FILLING, READY), (READY, TRAINING), (TRAINING, FREE), (FILLING, FREE)}

#: Poison written at allocation (and, with ``repoison``, whenever a slot starts FILLING): floats NaN, ints
#: ``INT_POISON``, bools the byte 255 (a real bool is 0 or 1, so ``view(torch.uint8) > 1`` finds unwritten flags).
#: Integer observations (uint8 pixels) have no spare value: every byte is a legal pixel. Their rows are tracked by
#: the store's ``obs_written`` mask instead (see ``TrajectoryStore``).
INT_POISON = -(2**62)
BOOL_POISON_BYTE = 255

#: The longest a state transition waits for the store's lock (held for microseconds, except by a process that died or
#: was stopped inside it): then it raises StoreLockTimeout rather than hang.
LOCK_TIMEOUT_S = 5.0

#: The side table of truncated steps' final observations (the first ``final_count`` rows are valid).
FINAL_KEYS = ("final_obs", "final_step_idx", "final_env_idx", "final_count")


def final_obs_capacity(rollout_len: int, num_envs: int, max_episode_steps: int | None = None) -> int:
    """Worst-case number of truncated steps in one ``[T, B]`` slot: the side table's row count.

    Truncation is the time limit (``envs/base.py``): after one, an env's next truncation is at least
    ``max_episode_steps = L`` steps later (a termination in between only restarts the clock), so T consecutive
    steps hold at most ``ceil(T / L)`` truncations per env. Without a known L every step could truncate: ``T``.
    Ant (L = 1000, T = 64): 1 row per env, i.e. ``B`` rows, against ``T * B`` for a dense ``next_obs``.
    """
    per_env = rollout_len if not max_episode_steps else math.ceil(rollout_len / max_episode_steps)
    return num_envs * per_env


def trajectory_spec(
    observation_spec: Spec,
    action_spec: Spec,
    rollout_len: int,
    num_envs: int,
    *,
    max_episode_steps: int | None = None,
    store_values: bool = False,
    rnn_state_shape: tuple[int, ...] | None = None,
    rl2: bool = False,
    rnn_state_dtype: torch.dtype = torch.float32,
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Key -> (per-slot shape, dtype) of one slot (the contract in docs/sampler.md).

    ``obs`` ``[T + 1, B, ...]`` has the env's observation dtype (uint8 pixels stay uint8): row t is what step t
    acted on, row T the observation after the last step (the bootstrap; the next slot's row 0). ``final_obs``
    ``[K, ...]`` with ``final_step_idx``/``final_env_idx`` ``[K]`` and ``final_count`` ``[]`` hold the true final
    observation of every truncated, not terminated step (K from ``final_obs_capacity``). ``values`` only with
    ``store_values``.

    A recurrent policy (``rnn_state_shape``, docs/recurrent.md) adds ``rnn_state`` ``[B, *rnn_state_shape]`` (the
    state at the slot start, before row 0's reset) and ``rnn_reset`` ``[T + 1, B]`` bool (the state was zeroed
    before row t); with ``rl2`` (``memory=trial``) also the slot start's ``prev_action`` ``[B, *act_shape]``,
    ``prev_reward`` ``[B]`` and ``prev_done`` ``[B]`` (rows 1..T take theirs from the slot's own steps).
    """
    T, B = rollout_len, num_envs
    act_dtype = torch.int64 if action_spec.is_discrete else torch.float32
    obs_shape, obs_dtype = tuple(observation_spec.shape), observation_spec.dtype
    capacity = final_obs_capacity(T, B, max_episode_steps)
    spec = {
        "obs": ((T + 1, B, *obs_shape), obs_dtype),
        "actions": ((T, B, *action_spec.shape), act_dtype),
        "behavior_logp": ((T, B), torch.float32),
        "rewards": ((T, B), torch.float32),
        "terminated": ((T, B), torch.bool),
        "truncated": ((T, B), torch.bool),
        "policy_version": ((T, B), torch.int64),
        "final_obs": ((capacity, *obs_shape), obs_dtype),
        "final_step_idx": ((capacity,), torch.int64),
        "final_env_idx": ((capacity,), torch.int64),
        "final_count": ((), torch.int64),
    }
    if store_values:
        spec["values"] = ((T, B), torch.float32)
    if rnn_state_shape is not None:
        spec["rnn_state"] = ((B, *rnn_state_shape), rnn_state_dtype)
        spec["rnn_reset"] = ((T + 1, B), torch.bool)
        if rl2:
            spec["prev_action"] = ((B, *action_spec.shape), act_dtype)
            spec["prev_reward"] = ((B,), torch.float32)
            spec["prev_done"] = ((B,), torch.bool)
    elif rl2:
        raise ValueError("rl2 inputs need a recurrent state: pass rnn_state_shape too")
    return spec


def fill_poison(tensor: torch.Tensor) -> None:
    """Overwrite ``tensor`` in place with its dtype's poison value (integer observations: see ``obs_written``)."""
    if tensor.dtype == torch.bool:
        tensor.view(torch.uint8).fill_(BOOL_POISON_BYTE)
    elif tensor.is_floating_point():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.int64:
        tensor.fill_(INT_POISON)
    else:  # narrow ints (uint8 pixels): any byte is legal data, the obs_written mask tracks them
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def poison_mask(tensor: torch.Tensor) -> torch.Tensor:
    """Bool mask of entries of ``tensor`` that still hold the poison value (all False for narrow ints)."""
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8) > 1
    if tensor.is_floating_point():
        return torch.isnan(tensor)
    if tensor.dtype == torch.int64:
        return tensor == INT_POISON
    return torch.zeros_like(tensor, dtype=torch.bool)


class SlotStateError(RuntimeError):
    """An illegal slot-state transition (a bug in the caller: e.g. training a slot that is still FILLING)."""


def store_bytes(spec: dict[str, tuple[tuple[int, ...], torch.dtype]], observation_spec: Spec, num_slots: int) -> int:
    """Bytes of a store of ``num_slots`` slots of ``spec`` (``trajectory_spec``), the ``obs_written`` mask of
    integer observations included."""
    slot = sum(math.prod(shape) * dtype.itemsize for shape, dtype in spec.values())
    if not observation_spec.dtype.is_floating_point:  # one bool per obs row and env: [T + 1, B]
        slot += math.prod(spec["obs"][0][:2])
    return num_slots * slot


class SharedMemoryTooSmall(MemoryError):
    """A shared store would not fit in the free shared memory (``/dev/shm``); the message says what to change."""


#: Where Linux keeps POSIX shared memory (``shm_open``, which torch's ``share_memory_`` uses): a tmpfs whose size a
#: container sets (docker's default is 64 MiB).
SHM_DIR = "/dev/shm"


def _free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free


def check_shared_memory(num_bytes: int, shm_dir: str = SHM_DIR) -> None:
    """Raise ``SharedMemoryTooSmall`` unless ``num_bytes`` (plus a 10% margin for the other shared buffers: the
    ParamStore, the episode ring) fit in ``shm_dir``'s free space. Without it, a store that does not fit fails inside
    torch's ``share_memory_`` with a traceback ("unable to allocate shared memory(shm) ... No space left on device",
    seen with ``env=pong`` under a 64 MiB /dev/shm) that names neither the cause nor the fix. A machine without
    ``shm_dir`` (macOS) is not checked."""
    try:
        free = _free_bytes(shm_dir)
    except OSError:
        return
    need = int(num_bytes * 1.1)
    if need > free:
        raise SharedMemoryTooSmall(
            f"the trajectory store needs {need / 2**20:,.0f} MiB of shared memory, but {shm_dir} has "
            f"{free / 2**20:,.0f} MiB free: give it more (docker run --shm-size={_gib_for(need)}g; Kubernetes: an "
            "emptyDir with medium: Memory mounted at /dev/shm), or make the slots smaller: fewer envs, a shorter "
            "rollout or fewer slots (env.num_envs, sampler.rollout_len, sampler.num_slots)"
        )


def _gib_for(num_bytes: int) -> int:
    """Whole GiB to ask for: twice the need, at least 1."""
    return max(1, math.ceil(2 * num_bytes / 2**30))


class StoreLockTimeout(TimeoutError):
    """The store's lock was not released within LOCK_TIMEOUT_S: the other process died or was stopped holding it."""


class TrajectoryStore:
    """Shared-memory rollout slots with a FREE/FILLING/READY/TRAINING state machine (layout: ``trajectory_spec``).

    Args:
        observation_spec, action_spec: the env's specs (``env.observation_spec``, ``env.action_spec``); the
            observations are stored in ``observation_spec.dtype``.
        rollout_len: T, steps per slot.
        num_envs: B, envs per slot (all splits of the sampler together).
        num_slots: slots in the ring; >= 2 lets the sampler fill one while the learner trains on another.
        max_episode_steps: the env's time limit (``env.max_episode_steps``); sizes the truncation side table
            (``final_obs_capacity``). None: the worst case, T rows per env.
        store_values: keep a ``values`` ``[T, B]`` key (the acting critic's predictions; the learner ignores it).
        rnn_state_shape, rl2, rnn_state_dtype: a recurrent policy's per-env state shape
            (``policy.rnn_state_shape``), whether it reads RL² inputs (``policy.rl2``) and the stored state's dtype:
            the slot then holds the state at its start, the reset flags and the RL² inputs (``trajectory_spec``).
        device: where the tensors live. Shared memory (``shared=True``) needs the CPU.
        shared: allocate in shared memory and guard states with ``ctx``'s condition, so a child process started
            with ``ctx`` can be handed this object. False: a plain in-process store with a threading condition.
        ctx: the multiprocessing context the child will be started with (spawn/forkserver).

    Attributes:
        obs_written: ``[num_slots, T + 1, B]`` bool, only for integer observations (uint8 pixels, which have no
            poison value): False until the sampler writes that obs row; ``poison`` clears it and ``find_poison``
            counts its False entries as ``obs`` (and the side table's rows through their int64 indices). None
            for float observations, whose NaN poison catches unwritten rows directly.
    """

    def __init__(
        self,
        observation_spec: Spec,
        action_spec: Spec,
        rollout_len: int,
        num_envs: int,
        num_slots: int,
        *,
        max_episode_steps: int | None = None,
        store_values: bool = False,
        rnn_state_shape: tuple[int, ...] | None = None,
        rl2: bool = False,
        rnn_state_dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        shared: bool = False,
        ctx: Any = None,
    ) -> None:
        for name, value, low in (
            ("rollout_len", rollout_len, 1),
            ("num_envs", num_envs, 1),
            ("num_slots", num_slots, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if max_episode_steps is not None and (not isinstance(max_episode_steps, int) or max_episode_steps < 1):
            raise ValueError(f"max_episode_steps must be an int >= 1 or None, got {max_episode_steps!r}")
        device = torch.device(device)
        if shared and device.type != "cpu":
            raise ValueError(f"a shared TrajectoryStore must live on the CPU (got device {device}); use shared=False")
        if shared and ctx is None:
            raise ValueError("shared=True needs ctx=multiprocessing.get_context('spawn') (the child's context)")
        self.rollout_len, self.num_envs, self.num_slots = rollout_len, num_envs, num_slots
        self.device = device
        self.shared = shared
        self.store_values = store_values
        self.rnn_state_shape = None if rnn_state_shape is None else tuple(rnn_state_shape)
        self.rl2 = rl2
        self.spec = trajectory_spec(
            observation_spec, action_spec, rollout_len, num_envs, max_episode_steps=max_episode_steps,
            store_values=store_values, rnn_state_shape=self.rnn_state_shape, rl2=rl2, rnn_state_dtype=rnn_state_dtype,
        )  # fmt: skip
        self.final_capacity = self.spec["final_obs"][0][0]
        if shared:  # before anything is allocated: a store too large for /dev/shm is refused with the fix
            check_shared_memory(store_bytes(self.spec, observation_spec, num_slots))
        tensors = {key: torch.empty((num_slots, *shape), dtype=dtype, device=device)
                   for key, (shape, dtype) in self.spec.items()}  # fmt: skip
        self.data = TensorDict(tensors, batch_size=[num_slots], device=device)
        self.obs_written: torch.Tensor | None = None
        if not observation_spec.dtype.is_floating_point:
            self.obs_written = torch.zeros((num_slots, rollout_len + 1, num_envs), dtype=torch.bool, device=device)
        self.poison()
        # states[i]: slot i's state; ready_seq[i]: order in which slots became READY (the learner takes the oldest);
        # counters[0]: next ready sequence number.
        self.states = torch.full((num_slots,), FREE, dtype=torch.int64)
        self.ready_seq = torch.zeros(num_slots, dtype=torch.int64)
        self.counters = torch.zeros(1, dtype=torch.int64)
        if shared:
            self.data.share_memory_()
            for t in (self.states, self.ready_seq, self.counters):
                t.share_memory_()
            if self.obs_written is not None:
                self.obs_written.share_memory_()
        self._ctx = ctx
        self._new_sync()

    def _new_sync(self) -> None:
        """The lock that guards the states, and one doorbell per state a process waits for (FREE: the sampler,
        READY: the learner). A waiter drains its doorbell, checks the states under the lock, and sleeps on the
        doorbell; whoever makes a slot FREE or READY rings it afterwards (``release``: never blocks). A ring between
        the check and the sleep leaves the count at 1, so no wake-up is lost; stale rings only cause a re-check."""
        if self.shared:
            self._lock = self._ctx.Lock()
            self._bells = {FREE: self._ctx.Semaphore(0), READY: self._ctx.Semaphore(0)}
        else:
            self._lock = threading.Lock()
            self._bells = {FREE: threading.Semaphore(0), READY: threading.Semaphore(0)}

    def bytes_per_slot(self) -> int:
        """Bytes of one slot's tensors (the ``obs_written`` mask included)."""
        total = sum(t.numel() * t.element_size() for t in self.data[0].values())
        if self.obs_written is not None:
            total += self.obs_written[0].numel()
        return total

    # ----- pickling: the condition is handed to the child at Process start; the TensorDict's leaves are shared
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if not self.shared:
            raise TypeError("an in-process TrajectoryStore (shared=False) cannot cross a process boundary")
        state["_ctx"] = None  # only the creating process replaces the lock (replace_writer)
        return state

    # ----- state machine --------------------------------------------------------------------------------------
    def state(self, slot_idx: int) -> int:
        return int(self.states[slot_idx])

    def state_names(self) -> list[str]:
        return [STATE_NAMES[int(s)] for s in self.states.tolist()]

    def _check_idx(self, slot_idx: int) -> None:
        if not 0 <= slot_idx < self.num_slots:
            raise IndexError(f"slot_idx {slot_idx} out of range [0, {self.num_slots})")

    def _transition_locked(self, slot_idx: int, new: int) -> None:
        old = int(self.states[slot_idx])
        if (old, new) not in LEGAL_TRANSITIONS:
            raise SlotStateError(
                f"illegal slot transition {STATE_NAMES[old]} -> {STATE_NAMES[new]} for slot {slot_idx}; "
                f"legal: FREE->FILLING->READY->TRAINING->FREE and FILLING->FREE (discard). States: {self.state_names()}"
            )
        self.states[slot_idx] = new

    def _ring(self, state: int) -> None:
        bell = self._bells.get(state)
        if bell is not None:
            bell.release()  # never blocks

    def transition(self, slot_idx: int, new: int) -> None:
        """Move ``slot_idx`` to ``new`` if that is legal from its current state, else raise SlotStateError.
        Raises StoreLockTimeout if the lock stays taken for LOCK_TIMEOUT_S (its holder died or was stopped)."""
        self._check_idx(slot_idx)
        if not self._lock.acquire(True, LOCK_TIMEOUT_S):  # SYNC: cross-process lock, held for microseconds
            raise StoreLockTimeout(
                f"slot {slot_idx} -> {STATE_NAMES[new]}: the store's lock was not released within {LOCK_TIMEOUT_S:g} s "
                "(the process holding it died or is stopped)"
            )
        try:
            self._transition_locked(slot_idx, new)
            if new == READY:
                self.ready_seq[slot_idx] = int(self.counters[0])
                self.counters[0] += 1
        finally:
            self._lock.release()
        self._ring(new)

    def _acquire(self, want: int, new: int, timeout_s: float, oldest: bool) -> int | None:
        deadline = time.monotonic() + timeout_s
        bell = self._bells[want]
        while True:
            while bell.acquire(False):  # drain stale rings: the states are read next, under the lock
                pass
            # SYNC: bounded by timeout_s (a lock held by a dead or stopped process reads as "nothing to take")
            if self._lock.acquire(True, max(deadline - time.monotonic(), 0.01)):
                try:
                    idx = (self.states == want).nonzero().flatten()
                    slot_idx = None
                    if idx.numel():
                        slot_idx = int(idx[torch.argmin(self.ready_seq[idx])]) if oldest else int(idx[0])
                        self._transition_locked(slot_idx, new)
                finally:
                    self._lock.release()
                if slot_idx is not None:
                    return slot_idx
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            bell.acquire(True, remaining)  # SYNC: sleeps until a ring or the deadline

    def acquire_free(self, timeout_s: float) -> int | None:
        """Take a FREE slot and mark it FILLING; None if none became free within ``timeout_s`` (backpressure)."""
        return self._acquire(FREE, FILLING, timeout_s, oldest=False)

    def acquire_ready(self, timeout_s: float) -> int | None:
        """Take the oldest READY slot and mark it TRAINING; None if none became ready within ``timeout_s``."""
        return self._acquire(READY, TRAINING, timeout_s, oldest=True)

    def mark_ready(self, slot_idx: int) -> None:
        """FILLING -> READY: every step of the slot has been written."""
        self.transition(slot_idx, READY)

    def release(self, slot_idx: int) -> None:
        """TRAINING -> FREE: the learner is done with the slot."""
        self.transition(slot_idx, FREE)

    def discard(self, slot_idx: int) -> None:
        """FILLING -> FREE: drop a partially written slot (sampler stopping or restarting)."""
        self.transition(slot_idx, FREE)

    def wake_all(self) -> None:
        """Wake every waiter (used at shutdown so waits end before their timeout)."""
        for state in self._bells:
            self._ring(state)

    def replace_writer(self, keep: tuple[int, ...] = ()) -> list[int]:
        """After the sampler (writer) process died and was joined: a fresh lock and doorbells (the dead process may
        hold the old lock, or be counted as a sleeper), and every slot that is neither READY (complete: the learner
        trains on it) nor listed in ``keep`` (slots the caller still owns) back to FREE, re-poisoned: the dead
        writer's partial FILLING slots, and TRAINING slots whose release timed out. Call it only while no other
        process uses the store; the next writer process must be started after it (it gets the new lock). Returns
        the slots freed."""
        self._new_sync()
        freed = []
        for slot_idx, state in enumerate(self.states.tolist()):
            if state != READY and state != FREE and slot_idx not in keep:
                self.poison(slot_idx)
                self.states[slot_idx] = FREE
                freed.append(slot_idx)
        return freed

    # ----- data -----------------------------------------------------------------------------------------------
    def slot(self, slot_idx: int) -> TensorDict:
        """Zero-copy ``[T, B]`` view of slot ``slot_idx`` (valid only while you own the slot's state)."""
        self._check_idx(slot_idx)
        return self.data[slot_idx]

    def poison(self, slot_idx: int | None = None) -> None:
        """Refill one slot (or all) with poison values, so stale data from an earlier rollout is caught too."""
        view = self.data if slot_idx is None else self.data[slot_idx]
        for tensor in view.values():
            fill_poison(tensor)
        if self.obs_written is not None:
            (self.obs_written if slot_idx is None else self.obs_written[slot_idx]).fill_(False)

    def find_poison(self, slot_idx: int) -> dict[str, int]:
        """Key -> number of still-poisoned entries in slot ``slot_idx`` (empty dict: fully written).

        Side table: ``final_count`` poisoned counts 1; otherwise only its first ``final_count`` rows are checked
        (the rest are legitimately unused). uint8 ``obs``: counts the unwritten rows of ``obs_written`` (rows, not
        entries); uint8 ``final_obs`` rows are written with their int64 indices, which are checked.
        """
        bad = {}
        slot = self.slot(slot_idx)
        count_t = slot["final_count"]
        count = None if bool(poison_mask(count_t)) else int(count_t)  # SYNC: host read
        for key, tensor in slot.items():
            if key == "final_count":
                num = int(count is None)
            elif key in FINAL_KEYS:
                num = 0 if count is None else int(poison_mask(tensor[:count]).sum())  # SYNC: host read
            else:
                num = int(poison_mask(tensor).sum())  # SYNC: host read
            if key == "obs" and self.obs_written is not None:
                num += int((~self.obs_written[slot_idx]).sum())
            if num:
                bad[key] = num
        return bad

    def check_written(self, slot_idx: int) -> None:
        """Raise RuntimeError naming the keys of slot ``slot_idx`` that hold unwritten (poison) data, or if its side
        table does not list exactly its truncated, not terminated steps."""
        bad = self.find_poison(slot_idx)
        if bad:
            raise RuntimeError(
                f"slot {slot_idx} holds unwritten data (poison values) in {bad} (key: entries); the sampler marked it "
                "READY before writing every step, or the policy produced NaN values/log-probs"
            )
        slot = self.slot(slot_idx)
        count = int(slot["final_count"])  # SYNC: host reads, ~1 ms per slot with check_slots
        live_trunc = slot["truncated"] & ~slot["terminated"]
        expected = int(live_trunc.sum())
        listed = live_trunc[slot["final_step_idx"][:count], slot["final_env_idx"][:count]] if count > 0 else None
        misplaced = listed is not None and not bool(listed.all())
        if count != expected or not 0 <= count <= self.final_capacity or misplaced:
            raise RuntimeError(
                f"slot {slot_idx}: the final-obs side table lists {count} rows (capacity {self.final_capacity}) but "
                f"the slot has {expected} truncated, not terminated steps; every such step needs its final obs"
            )
