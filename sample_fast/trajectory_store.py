"""TrajectoryStore: the shared-memory ring of rollout slots between the sampler and the learner.

It owns one ``TensorDict`` ``[num_slots, T, B, ...]`` (keys in ``docs/sampler.md``) allocated once, poisoned at
allocation, and a small shared int tensor of slot states guarded by one multiprocessing condition:

    FREE --acquire_free--> FILLING --mark_ready--> READY --acquire_ready--> TRAINING --release--> FREE
                              \\--discard (partial slot of a stopped/restarted sampler)--> FREE

Only slot indices cross process boundaries; tensors stay where they were allocated. It never steps envs and never
computes losses.
"""

from __future__ import annotations

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
INT_POISON = -(2**62)
BOOL_POISON_BYTE = 255


class SlotStateError(RuntimeError):
    """An illegal slot-state transition (a bug in the caller: e.g. training a slot that is still FILLING)."""


def trajectory_spec(observation_spec: Spec, action_spec: Spec) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-step key -> (shape, dtype) of the trajectory batch (the contract in docs/sampler.md)."""
    act_dtype = torch.int64 if action_spec.is_discrete else torch.float32
    obs_shape = tuple(observation_spec.shape)
    return {
        "obs": (obs_shape, torch.float32),
        "actions": (tuple(action_spec.shape), act_dtype),
        "behavior_logp": ((), torch.float32),
        "values": ((), torch.float32),
        "rewards": ((), torch.float32),
        "terminated": ((), torch.bool),
        "truncated": ((), torch.bool),
        "next_obs": (obs_shape, torch.float32),
        "policy_version": ((), torch.int64),
    }


def fill_poison(tensor: torch.Tensor) -> None:
    """Overwrite ``tensor`` in place with its dtype's poison value."""
    if tensor.dtype == torch.bool:
        tensor.view(torch.uint8).fill_(BOOL_POISON_BYTE)
    elif tensor.is_floating_point():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(INT_POISON)


def poison_mask(tensor: torch.Tensor) -> torch.Tensor:
    """Bool mask of entries of ``tensor`` that still hold the poison value."""
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8) > 1
    if tensor.is_floating_point():
        return torch.isnan(tensor)
    return tensor == INT_POISON


class TrajectoryStore:
    """Shared-memory rollout slots ``[num_slots, T, B, ...]`` with a FREE/FILLING/READY/TRAINING state machine.

    Args:
        observation_spec, action_spec: the env's specs (``env.observation_spec``, ``env.action_spec``).
        rollout_len: T, steps per slot.
        num_envs: B, envs per slot (all splits of the sampler together).
        num_slots: slots in the ring; >= 2 lets the sampler fill one while the learner trains on another.
        device: where the tensors live. Shared memory (``shared=True``) needs the CPU.
        shared: allocate in shared memory and guard states with ``ctx``'s condition, so a child process started
            with ``ctx`` can be handed this object. False: a plain in-process store with a threading condition.
        ctx: the multiprocessing context the child will be started with (spawn/forkserver).
    """

    def __init__(
        self,
        observation_spec: Spec,
        action_spec: Spec,
        rollout_len: int,
        num_envs: int,
        num_slots: int,
        *,
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
        device = torch.device(device)
        if shared and device.type != "cpu":
            raise ValueError(f"a shared TrajectoryStore must live on the CPU (got device {device}); use shared=False")
        if shared and ctx is None:
            raise ValueError("shared=True needs ctx=multiprocessing.get_context('spawn') (the child's context)")
        self.rollout_len, self.num_envs, self.num_slots = rollout_len, num_envs, num_slots
        self.device = device
        self.shared = shared
        self.spec = trajectory_spec(observation_spec, action_spec)
        tensors = {
            key: torch.empty((num_slots, rollout_len, num_envs, *shape), dtype=dtype, device=device)
            for key, (shape, dtype) in self.spec.items()
        }
        for tensor in tensors.values():
            fill_poison(tensor)
        self.data = TensorDict(tensors, batch_size=[num_slots, rollout_len, num_envs], device=device)
        # states[i]: slot i's state; ready_seq[i]: order in which slots became READY (the learner takes the oldest);
        # counters[0]: next ready sequence number.
        self.states = torch.full((num_slots,), FREE, dtype=torch.int64)
        self.ready_seq = torch.zeros(num_slots, dtype=torch.int64)
        self.counters = torch.zeros(1, dtype=torch.int64)
        if shared:
            self.data.share_memory_()
            for t in (self.states, self.ready_seq, self.counters):
                t.share_memory_()
            self._cond = ctx.Condition(ctx.Lock())
        else:
            self._cond = threading.Condition(threading.Lock())

    # ----- pickling: the condition is handed to the child at Process start; the TensorDict's leaves are shared
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if not self.shared:
            raise TypeError("an in-process TrajectoryStore (shared=False) cannot cross a process boundary")
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

    def transition(self, slot_idx: int, new: int) -> None:
        """Move ``slot_idx`` to ``new`` if that is legal from its current state, else raise SlotStateError."""
        self._check_idx(slot_idx)
        with self._cond:  # SYNC: cross-process lock, held for a few tensor element writes
            self._transition_locked(slot_idx, new)
            if new == READY:
                self.ready_seq[slot_idx] = int(self.counters[0])
                self.counters[0] += 1
            self._cond.notify_all()

    def _acquire(self, want: int, new: int, timeout_s: float, oldest: bool) -> int | None:
        deadline = time.monotonic() + timeout_s

        def pick() -> int | None:
            idx = (self.states == want).nonzero().flatten()
            if idx.numel() == 0:
                return None
            if oldest:
                return int(idx[torch.argmin(self.ready_seq[idx])])
            return int(idx[0])

        with self._cond:  # SYNC: waits at most timeout_s for another process's notify
            while True:
                slot_idx = pick()
                if slot_idx is not None:
                    self._transition_locked(slot_idx, new)
                    self._cond.notify_all()
                    return slot_idx
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(timeout=remaining)

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
        with self._cond:
            self._cond.notify_all()

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

    def find_poison(self, slot_idx: int) -> dict[str, int]:
        """Key -> number of still-poisoned entries in slot ``slot_idx`` (empty dict: fully written)."""
        bad = {}
        for key, tensor in self.slot(slot_idx).items():
            count = int(poison_mask(tensor).sum())  # SYNC: host read
            if count:
                bad[key] = count
        return bad

    def check_written(self, slot_idx: int) -> None:
        """Raise RuntimeError naming the keys of slot ``slot_idx`` that hold unwritten (poison) data."""
        bad = self.find_poison(slot_idx)
        if bad:
            raise RuntimeError(
                f"slot {slot_idx} holds unwritten data (poison values) in {bad} (key: entries); the sampler marked it "
                "READY before writing every step, or the policy produced NaN values/log-probs"
            )
