"""Sampler: acts in the envs with a policy copy and writes ``[T, B]`` rollouts into TrajectoryStore slots.

Double buffering: the envs are ``num_splits`` groups, each its own ``BatchedEnv`` built by one ``env_fn()`` call.
The loop visits the groups round-robin: ``recv`` group i's step, write it, compute group i's next actions, ``send``
them; while group i's policy forward runs, the other groups' physics runs on the env's worker threads (mujoco
backend; for backends whose ``send`` is a no-op the order is the same and only the overlap is lost). Each group
fills its own slot ``[T, num_envs_per_split]``, so a slot becomes READY every T steps of one group. Each slot
stores the observations once (``obs [T + 1, B]``: row T, the bootstrap, is written with the slot's last step) and
the true final observations of truncated steps in a compact side table (layout in docs/sampler.md).

It owns the envs, the acting policy copy and the per-split rollout state. It never computes losses and never
touches the learner; weights arrive through the ParamStore (async) or a version callback (serial).
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sample_fast.envs import BatchedEnv
from sample_fast.param_store import ParamStore
from sample_fast.procs import CTRL_SAMPLER_HEARTBEAT, CTRL_SAMPLER_STEPS, CTRL_SAMPLER_WAIT_S
from sample_fast.trajectory_store import TrajectoryStore


@dataclass
class SamplerConfig:
    """What the sampler collects and how: rollout shape, splits, slots, seeds, the acting process's threads.

    The runner's process and timeout settings (poll interval, heartbeats, start method, learner threads, restarts)
    are ``sample_fast.runner.RunnerConfig``."""

    rollout_len: int = 64  #: T: steps per slot
    num_splits: int = 2  #: envs in k groups (double buffering); env_fn() is called once per group
    num_slots: int = 4  #: slots in the TrajectoryStore; must be >= num_splits + 1 (2 * num_splits recommended)
    seed: int | None = None  #: split i is reset with seed + i; None: split seeds drawn from the main torch RNG
    inference_threads: int = 1  #: torch intra-op threads of the sampler process (policy forward)
    check_slots: bool = True  #: re-poison a slot when it starts FILLING and verify it before training (~1 ms)
    #: async mode: when the sampler picks up newer weights: "step" (before every policy forward; a version check is
    #: ~1 us, a copy happens only when the learner published) or "slot" (only when a split starts a slot). On Ant
    #: "step" cut the mean policy lag from 2.5 to 0.7-1.0 versions, so V-trace clips less of each batch.
    weights_refresh: str = "step"
    #: Run the critic in the sampler and store its predictions as a ``values`` key. The learner recomputes values
    #: with its current critic and never reads them, so the default skips the critic forward (and the key).
    store_values: bool = False
    #: ``sys.setswitchinterval`` of the acting process while the Sampler lives (restored by ``close``); None leaves
    #: Python's 5 ms. A lever for the GIL waits of the simulator's worker threads (they take the GIL back after each
    #: MuJoCo call); on 2 cores 1 ms / 200 µs / 50 µs measured 1.00x / 0.99x / 0.99x of the default's +inference at
    #: 128 Ant envs (benchmarks/results/levers_gil_cpu.md): the waits are short, not switch-interval long.
    gil_switch_interval_s: float | None = None
    #: async mode: where the sampler process's acting policy copy runs: "cpu", "cuda" or "cuda:<index>"; "auto" is
    #: the CPU here, and the trainer's config check fits it (``sample_fast.config.resolve``: the learner's CUDA device
    #: for a CNN policy, where a forward of a few hundred frames on one CPU thread would set the pace, else the CPU).
    #: Serial mode acts with the learner's own policy, on the learner's device.
    device: str = "auto"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("rollout_len", "num_splits", "num_slots", "inference_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"sampler.{name} must be a positive int, got {value!r}")
        if self.num_slots < self.num_splits + 1:
            raise ValueError(
                f"sampler.num_slots={self.num_slots} must be >= num_splits + 1 = {self.num_splits + 1} (each split "
                f"fills its own slot and the learner needs one); try num_slots={2 * self.num_splits}"
            )
        if self.weights_refresh not in ("step", "slot"):
            raise ValueError(f"sampler.weights_refresh must be step or slot, got {self.weights_refresh!r}")
        try:
            acting_device(self.device)
        except ValueError as e:
            raise ValueError(f"sampler.device={self.device!r}: {e}") from None
        si = self.gil_switch_interval_s
        if si is not None and (isinstance(si, bool) or not isinstance(si, (int, float)) or not 0 < si <= 1):
            raise ValueError(
                f"sampler.gil_switch_interval_s must be a number of seconds in (0, 1] or null (Python's default), "
                f"got {si!r}"
            )


def acting_device(device: str) -> torch.device:
    """The ``torch.device`` of ``SamplerConfig.device`` (``auto``: the CPU); ValueError naming the choices."""
    if device == "auto":
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError("not a device the sampler can act on; use auto, cpu, cuda or cuda:<index>")
    return dev


class EpisodeRing:
    """Finished-episode (return, length) pairs from the sampler to the main process: a shared ring buffer.

    One writer (``push``), one reader (``drain``). A reader that falls more than ``capacity`` episodes behind loses
    the oldest ones and counts them in ``dropped``; nothing ever blocks.
    """

    def __init__(self, capacity: int, shared: bool) -> None:
        self.capacity = capacity
        self.buf = torch.zeros(capacity, 2, dtype=torch.float64)
        self.count = torch.zeros(1, dtype=torch.int64)  # episodes ever written
        if shared:
            self.buf.share_memory_()
            self.count.share_memory_()
        self.read_idx = 0
        self.dropped = 0

    def push(self, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        n = returns.numel()
        if n == 0:
            return
        start = int(self.count[0])
        if n > self.capacity:
            returns, lengths, start, n = (
                returns[-self.capacity :],
                lengths[-self.capacity :],
                start + n - self.capacity,
                self.capacity,
            )
        idx = torch.arange(start, start + n) % self.capacity
        self.buf[idx, 0] = returns.detach().to("cpu", torch.float64)
        self.buf[idx, 1] = lengths.detach().to("cpu", torch.float64)
        self.count[0] = start + n  # INVARIANT: entries are written before the count that publishes them

    def drain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All episodes written since the last drain: ``(returns [n] float32, lengths [n] int64)``."""
        end = int(self.count[0])
        start = max(self.read_idx, end - self.capacity)
        self.dropped += start - self.read_idx
        idx = torch.arange(start, end) % self.capacity
        rows = self.buf[idx].clone()
        # Entries the writer overwrote while we copied are stale: drop them from the front.
        overwritten = max(0, int(self.count[0]) - self.capacity - start)
        if overwritten:
            rows = rows[overwritten:]
            self.dropped += min(overwritten, end - start)
        self.read_idx = end
        return rows[:, 0].to(torch.float32), rows[:, 1].to(torch.int64)


@dataclass
class _Split:
    env: BatchedEnv
    obs: torch.Tensor | None = None
    slot_idx: int | None = None
    t: int = 0
    pending: bool = False
    views: dict[str, torch.Tensor] | None = None
    written: torch.Tensor | None = None  # the slot's obs_written rows (integer observations only)
    num_final: int = 0  # rows of the slot's final-obs side table written so far (host copy of final_count)
    # Recurrent policies (docs/recurrent.md), on the policy's device, one row per env of this split:
    rnn_state: torch.Tensor | None = None  # [B, *state] the state after the last step (before its reset)
    reset: torch.Tensor | None = None  # [B] bool: zero the state before the next step (episode / trial ended)
    prev_action: torch.Tensor | None = None  # RL² inputs: the last step's action, raw reward and done flag
    prev_reward: torch.Tensor | None = None
    prev_done: torch.Tensor | None = None


def _check_rnn_layout(policy: Any, store: TrajectoryStore, recurrent: bool, rl2: bool) -> None:
    """The store's slots hold exactly what this policy's recurrence needs (docs/recurrent.md)."""
    shape = getattr(policy, "rnn_state_shape", None)
    if recurrent and store.rnn_state_shape != tuple(shape):
        raise ValueError(
            f"the policy is recurrent (state {tuple(shape)} per env) but the store's slots hold "
            f"{'no state' if store.rnn_state_shape is None else f'a state of {store.rnn_state_shape}'}; build it "
            "with TrajectoryStore(..., rnn_state_shape=policy.rnn_state_shape, rl2=policy.rl2)"
        )
    if not recurrent and store.rnn_state_shape is not None:
        raise ValueError("the store's slots hold a recurrent state but the policy is feed-forward; build it without "
                         "rnn_state_shape")  # fmt: skip
    if rl2 != store.rl2:
        raise ValueError(f"policy.rl2={rl2} (memory=trial) but the store was built with rl2={store.rl2}")


def build_split_envs(
    env_fn: Callable[[], BatchedEnv], num_splits: int, first: BatchedEnv | None = None
) -> list[BatchedEnv]:
    """Call ``env_fn()`` once per split (reusing ``first`` as split 0 if given) and check the groups agree."""
    envs = [first] if first is not None else []
    try:
        while len(envs) < num_splits:
            envs.append(env_fn())
        ref = envs[0]
        for i, env in enumerate(envs):
            if not isinstance(env, BatchedEnv):
                raise TypeError(f"env_fn() must return a BatchedEnv (sample_fast.envs.make), got {type(env).__name__}")
            same = (env.num_envs, env.observation_spec.shape, env.action_spec.shape, env.action_spec.dtype) == (
                ref.num_envs,
                ref.observation_spec.shape,
                ref.action_spec.shape,
                ref.action_spec.dtype,
            )
            if not same:
                raise ValueError(f"env_fn() built different env groups: split 0 is {ref!r}, split {i} is {env!r}")
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


class Sampler:
    """Double-buffered rollout collection into a TrajectoryStore (see the module docstring).

    Args:
        envs: one BatchedEnv per split, all with ``num_envs == store.num_envs``.
        policy: acting policy with ``act(obs) -> (actions, behavior_logp, values)`` (ActorCritic contract). When
            ``act`` takes a ``with_value`` keyword it is called with ``with_value=cfg.store_values`` (no critic
            forward by default); otherwise its values are discarded unless stored.
        store: the TrajectoryStore; slots are ``[T, num_envs_per_split]``; it has a ``values`` key exactly when
            ``cfg.store_values``, and a recurrent policy's keys (``rnn_state``, ``rnn_reset``; RL²: ``prev_*``)
            exactly when the policy is recurrent (``policy.is_recurrent``; it then acts with ``act_recurrent``).
        cfg: SamplerConfig.
        param_store: async mode: newest weights are loaded from here before each policy forward (or at each slot
            start, per cfg.weights_refresh).
        version_fn: serial mode: returns the version of ``policy``'s current weights (the policy is the learner's).
        episodes: where finished episodes go.
        control: the shared control tensor (heartbeat, counters), or None.
        split_seeds: reset seed of each split.
    """

    def __init__(
        self,
        envs: list[BatchedEnv],
        policy: Any,
        store: TrajectoryStore,
        cfg: SamplerConfig,
        *,
        param_store: ParamStore | None = None,
        version_fn: Callable[[], int] | None = None,
        episodes: EpisodeRing | None = None,
        control: torch.Tensor | None = None,
        split_seeds: list[int] | None = None,
    ) -> None:
        if (param_store is None) == (version_fn is None):
            raise ValueError("pass exactly one of param_store (async) or version_fn (serial)")
        if len(envs) != cfg.num_splits:
            raise ValueError(f"got {len(envs)} envs for num_splits={cfg.num_splits}")
        for env in envs:
            if env.num_envs != store.num_envs:
                raise ValueError(f"env has {env.num_envs} envs but store slots hold {store.num_envs}")
        if store.rollout_len != cfg.rollout_len:
            raise ValueError(f"store rollout_len {store.rollout_len} != sampler.rollout_len {cfg.rollout_len}")
        if store.store_values != cfg.store_values:
            raise ValueError(
                f"sampler.store_values={cfg.store_values} but the store was built with store_values="
                f"{store.store_values}; build it with TrajectoryStore(..., store_values=cfg.store_values)"
            )
        self.recurrent = bool(getattr(policy, "is_recurrent", False))
        self.rl2 = self.recurrent and bool(getattr(policy, "rl2", False))  # RL²: state kept across a trial
        _check_rnn_layout(policy, store, self.recurrent, self.rl2)
        self.cfg, self.store, self.policy = cfg, store, policy
        self.param_store, self.version_fn = param_store, version_fn
        self.episodes, self.control = episodes, control
        self.splits = [_Split(env) for env in envs]
        self._act = policy.act
        if "with_value" in inspect.signature(policy.act).parameters:
            self._act = functools.partial(policy.act, with_value=cfg.store_values)
        first_param = next(iter(policy.parameters()), None) if hasattr(policy, "parameters") else None
        self._policy_device = first_param.device if first_param is not None else envs[0].device
        self.version = -1
        self.env_steps = 0  # steps written into READY slots
        self.wait_s = 0.0  # time spent waiting for a FREE slot (backpressure)
        seeds = split_seeds if split_seeds is not None else [None] * len(envs)
        for split, seed in zip(self.splits, seeds, strict=True):
            split.obs, _ = split.env.reset(seed=seed)
            if self.recurrent:
                self._reset_memory(split)
        self._refresh_weights()
        if self.version < 0:
            raise RuntimeError("the sampler has no weights: publish to the ParamStore before starting the sampler")
        self._old_switch_interval: float | None = None
        if cfg.gil_switch_interval_s is not None:  # last: nothing below can fail and leave it changed
            self._old_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(float(cfg.gil_switch_interval_s))

    def _reset_memory(self, split: _Split) -> None:
        """Zero state, reset flags set (every env starts an episode and a trial), zero RL² inputs."""
        n, dev = split.env.num_envs, self._policy_device
        split.rnn_state = self.policy.initial_state(n, dev)
        split.reset = torch.ones(n, dtype=torch.bool, device=dev)
        if self.rl2:
            act = split.env.action_spec
            split.prev_action = torch.zeros((n, *act.shape), dtype=self.store.spec["prev_action"][1], device=dev)
            split.prev_reward = torch.zeros(n, dtype=torch.float32, device=dev)
            split.prev_done = torch.zeros(n, dtype=torch.bool, device=dev)

    # ----- weights --------------------------------------------------------------------------------------------
    def _refresh_weights(self) -> None:
        if self.param_store is not None:
            self.version = self.param_store.load_if_newer(self.policy, self.version)  # never blocks
        else:
            self.version = int(self.version_fn())

    # ----- main loop ------------------------------------------------------------------------------------------
    def advance(self, wait_s: float) -> int:
        """One round-robin pass: each split receives its pending step, writes it, and sends its next actions.

        A split without a slot waits up to ``wait_s`` for a FREE one (backpressure) and is skipped if none frees.
        Returns the number of slots this pass marked READY.
        """
        num_ready = 0
        for split in self.splits:
            if split.pending:
                num_ready += self._receive(split)
            if split.slot_idx is None and not self._start_slot(split, wait_s):
                continue
            self._act_and_send(split)
        if self.control is not None:
            self.control[CTRL_SAMPLER_HEARTBEAT] = time.time()
        return num_ready

    def _start_slot(self, split: _Split, wait_s: float) -> bool:
        t0 = time.monotonic()
        slot_idx = self.store.acquire_free(timeout_s=wait_s)  # SYNC: backpressure wait, bounded by wait_s
        self.wait_s += time.monotonic() - t0
        if self.control is not None:
            self.control[CTRL_SAMPLER_WAIT_S] = self.wait_s
        if slot_idx is None:
            return False
        if self.cfg.check_slots:
            self.store.poison(slot_idx)
        split.slot_idx, split.t, split.num_final = slot_idx, 0, 0
        slot = self.store.slot(slot_idx)
        split.views = {key: slot[key] for key in slot.keys()}
        split.views["final_count"].fill_(0)  # INVARIANT: written even without check_slots (a reused slot's count)
        split.written = self.store.obs_written[slot_idx] if self.store.obs_written is not None else None
        self._refresh_weights()  # newest weights at every slot start; each step records its version
        return True

    def _act_and_send(self, split: _Split) -> None:
        # PERF: one policy forward for this split; the other splits' physics runs meanwhile on the env threads.
        obs = split.obs
        if self.version_fn is not None:  # serial: the policy IS the learner's, so its version can change any step
            self.version = int(self.version_fn())
        elif self.cfg.weights_refresh == "step" and split.t > 0:  # t == 0: _start_slot has just refreshed
            self.version = self.param_store.load_if_newer(self.policy, self.version)  # never blocks
        v, t = split.views, split.t
        if self.recurrent:
            actions, logp, values = self._act_recurrent(split, obs.to(self._policy_device))
        else:
            actions, logp, values = self._act(obs.to(self._policy_device))
        actions = actions.to(split.env.device)
        v["obs"][t].copy_(obs)
        if split.written is not None:
            split.written[t].fill_(True)
        v["actions"][t].copy_(actions)
        v["behavior_logp"][t].copy_(logp)
        if self.cfg.store_values:
            v["values"][t].copy_(values)
        v["policy_version"][t].fill_(self.version)
        split.env.send(actions)
        split.pending = True

    def _act_recurrent(self, split: _Split, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The recurrent forward of all this split's envs at once (batched: no per-env loop); the state entering
        the slot and every row's reset flag go into the slot, so the learner can re-run the sequence."""
        v, t = split.views, split.t
        if t == 0:  # INVARIANT: the slot holds the state before row 0's reset, and row 0's RL² inputs
            v["rnn_state"].copy_(split.rnn_state)
            if self.rl2:
                v["prev_action"].copy_(split.prev_action)
                v["prev_reward"].copy_(split.prev_reward)
                v["prev_done"].copy_(split.prev_done)
        v["rnn_reset"][t].copy_(split.reset)
        prev = (split.prev_action, split.prev_reward, split.prev_done) if self.rl2 else (None, None, None)
        actions, logp, values, split.rnn_state = self.policy.act_recurrent(
            obs, split.rnn_state, split.reset, *prev, with_value=self.cfg.store_values
        )
        if self.rl2:
            split.prev_action = actions
        return actions, logp, values

    def _receive(self, split: _Split) -> int:
        res = split.env.recv()  # SYNC: waits for this split's physics
        split.pending = False
        v, t = split.views, split.t
        v["rewards"][t].copy_(res.reward)
        v["terminated"][t].copy_(res.terminated)
        v["truncated"][t].copy_(res.truncated)
        split.obs = res.obs
        done = res.terminated | res.truncated
        if self.recurrent:  # the next step starts from a zero state where this one ended an episode (or a trial)
            dev = self._policy_device
            if self.rl2:
                if "trial_end" not in res.info:
                    raise RuntimeError(
                        f"policy.memory=trial keeps the state across the episodes of a trial, but {split.env!r} does "
                        "not mark trial ends (info['trial_end']); use an env with trials (toy kind=bandit) or "
                        "policy.memory=episode"
                    )
                split.reset = res.info["trial_end"].to(dev)
                split.prev_reward = res.reward.to(dev)
                split.prev_done = done.to(dev)
            else:
                split.reset = done.to(dev)
        if bool(done.any()):  # SYNC: one host read per split-step (CPU: ~1 us)
            if self.episodes is not None:
                self.episodes.push(res.info["episode_return"][done], res.info["episode_length"][done])
            live_trunc = res.truncated & ~res.terminated  # terminated steps need no bootstrap, hence no final obs
            if bool(live_trunc.any()):  # SYNC: only on steps where an episode ended
                self._record_final_obs(split, live_trunc, res.info["final_obs"])
        split.t += 1
        if split.t < self.cfg.rollout_len:
            return 0
        # The bootstrap row: the observation after the slot's last step (also the next slot's row 0). Where that
        # step truncated, it is the reset observation and the learner bootstraps from the side table instead.
        v["obs"][split.t].copy_(res.obs)
        if split.written is not None:
            split.written[split.t].fill_(True)
        if self.recurrent:
            v["rnn_reset"][split.t].copy_(split.reset)  # row T: the bootstrap row's reset (the next slot's row 0)
        self.store.mark_ready(split.slot_idx)
        split.slot_idx, split.views, split.written = None, None, None
        self.env_steps += self.cfg.rollout_len * self.store.num_envs
        if self.control is not None:
            self.control[CTRL_SAMPLER_STEPS] = self.env_steps
        return 1

    def _record_final_obs(self, split: _Split, live_trunc: torch.Tensor, final_obs: torch.Tensor) -> None:
        """Append the true final observations of this step's truncated envs to the slot's side table."""
        env_idx = live_trunc.nonzero().flatten()
        start, num = split.num_final, env_idx.numel()
        end = start + num
        capacity = self.store.final_capacity
        if end > capacity:
            raise RuntimeError(
                f"slot side table overflow: {end} truncated steps in one slot, capacity {capacity} (sized from "
                f"max_episode_steps); an env truncates more often than its time limit allows: build the "
                "TrajectoryStore with max_episode_steps=None (T rows per env)"
            )
        v = split.views
        v["final_obs"][start:end].copy_(final_obs[env_idx])
        v["final_step_idx"][start:end].fill_(split.t)
        v["final_env_idx"][start:end].copy_(env_idx)
        # INVARIANT: the rows are written before the count that publishes them.
        v["final_count"].fill_(end)
        split.num_final = end

    # ----- shutdown -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Collect pending steps and discard partially written slots (FILLING -> FREE). Idempotent."""
        for split in self.splits:
            if split.pending:
                try:
                    split.env.recv()
                except Exception:
                    pass
                split.pending = False
            if split.slot_idx is not None:
                self.store.discard(split.slot_idx)
                split.slot_idx, split.views, split.written = None, None, None

    def close(self) -> None:
        """``stop()``, close every env and restore the process's GIL switch interval."""
        try:
            self.stop()
        finally:
            if self._old_switch_interval is not None:
                sys.setswitchinterval(self._old_switch_interval)
                self._old_switch_interval = None
            for split in self.splits:
                split.env.close()
