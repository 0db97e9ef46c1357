"""Prioritized trajectory replay for APPO: trained ``[T, b]`` segments replayed under V-trace's age correction.

Owns the replay memory (a torchrl ``ReplayBuffer`` on a ``LazyTensorStorage`` on the learner's device, FIFO through
torchrl's ``RoundRobinWriter``), the per-segment priorities and their sampler, the importance-sampling weights
(Schaul et al. 2016, "Prioritized Experience Replay", ICLR), beta annealing, and the join of replayed segments to
a fresh batch (their IS weights then weight the learner's loss terms: the ``weights`` of ``sample_fast.losses``).
It never touches an env, a process or the ParamStore; the learner calls it (``Learner.replay``), so serial and
async runs both get it. The trainer builds it from the ``replay:`` config section (``ReplayConfig``, defined in
``sample_fast.replay_config``) and hands it to the learner. Off by default, and imported only when on (torchrl
takes seconds to import). See docs/replay.md.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchrl.data import LazyTensorStorage, ReplayBuffer, RoundRobinWriter
from torchrl.data.replay_buffers.samplers import Sampler

from sample_fast.replay_config import PRIORITY_KINDS, ReplayConfig, ReplayConfigError

__all__ = [
    "FINAL_KEYS", "PRIORITY_KINDS", "SEGMENT_KEYS", "ReplayConfig", "ReplayConfigError", "ReplaySample",
    "SegmentPrioritySampler", "TrajectoryReplay", "frozen_reward_scale", "segment_priorities",
]  # fmt: skip

#: The per-step ``[T, b]`` keys a segment keeps. ``values`` is informational in the batch and is not replayed (V-trace
#: recomputes values with the current critic); ``policy_version`` is optional in the batch and filled if absent.
#: Besides them a segment keeps its ``obs`` rows ``[T + 1, b]`` (row T: its bootstrap observation) and its own
#: truncation side table (``FINAL_KEYS``: the final observations of its truncated steps, env indices local to it).
SEGMENT_KEYS = ("actions", "behavior_logp", "rewards", "terminated", "truncated", "policy_version")
FINAL_KEYS = ("final_obs", "final_step_idx", "final_env_idx", "final_count")


class SegmentPrioritySampler(Sampler):
    """Proportional prioritized sampling over a dense priority vector on the learner's device.

    Why not torchrl's ``PrioritizedSampler``: its sum/min segment trees live in torchrl's C++ extension, which
    does not load with this project's torch (torchrl 0.14.1 against torch 2.13: undefined symbol), so the
    sampler cannot even be constructed here. Replay capacity is counted in segments (hundreds to a few
    thousand), so one ``torch.multinomial`` over the dense vector costs O(capacity) on the device, no host
    sync and no tree; benchmarks/bench_replay.py measures it against torchrl's uniform sampler (and against
    the PrioritizedSampler where the extension loads).

    ``live_from`` (set by ``TrajectoryReplay`` before each draw) excludes segments whose newest step is older
    than the replay age limit: they get probability 0 and do not count in N.
    """

    def __init__(self, capacity: int, alpha: float, eps: float = 1e-6, device: torch.device | str = "cpu",
                 seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        device = torch.device(device)
        self.capacity, self.alpha, self.eps, self.device = capacity, alpha, eps, device
        self.priority = torch.zeros(capacity, dtype=torch.float32, device=device)  # raw p_i
        self.newest_version = torch.full((capacity,), -(2**62), dtype=torch.int64, device=device)
        self.live_from: int | None = None  # oldest policy_version still usable
        self.max_priority = 1.0  # priority of segments added without one (Schaul et al.: the max seen)
        self.beta = 1.0
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def probabilities(self, num_stored: int) -> Tensor:
        """P(i) over the first ``num_stored`` entries ``[num_stored]`` float32 (0 for dead segments)."""
        scaled = (self.priority[:num_stored] + self.eps).pow(self.alpha)
        if self.live_from is not None:
            scaled = torch.where(self.newest_version[:num_stored] >= self.live_from, scaled, 0.0)
        return scaled / scaled.sum()

    def sample(self, storage: Any, batch_size: int) -> tuple[Tensor, dict]:
        num_stored = len(storage)
        if num_stored == 0:
            raise RuntimeError("replay: cannot sample from an empty memory; add segments first")
        probs = self.probabilities(num_stored)
        # PERF: O(capacity) on the device; 1k segments x 64 draws ~ 30 us on one CPU core.
        index = torch.multinomial(probs, batch_size, replacement=True, generator=self.generator)
        # IS weights (Schaul et al. 2016, sec. 3.4): w_i = (N P(i))^-beta / max_j (N P(j))^-beta, the max over
        # the live memory (as in OpenAI baselines and torchrl), i.e. w_i = (P(i) / P_min)^-beta.
        live = probs > 0
        p_min = torch.where(live, probs, torch.ones_like(probs)).min()
        weight = (probs[index] / p_min).pow(-self.beta)
        return index, {"priority_weight": weight}

    def extend(self, index: Tensor) -> None:
        index = torch.as_tensor(index, device=self.device).reshape(-1)
        self.priority[index] = self.max_priority

    def add(self, index: int) -> None:
        self.extend(torch.as_tensor([index]))

    def update_priority(self, index: Tensor, priority: Tensor, *, storage: Any = None) -> None:
        index = torch.as_tensor(index, device=self.device).reshape(-1)
        priority = torch.as_tensor(priority, dtype=torch.float32, device=self.device).reshape(-1)
        # A non-finite priority (a skipped, non-finite update) must not poison the distribution.
        priority = torch.where(torch.isfinite(priority), priority, torch.full_like(priority, self.max_priority))
        self.priority[index] = priority.clamp(min=0.0)
        # SYNC: one scalar per update keeps the running max on the host for new segments.
        self.max_priority = max(self.max_priority, float(priority.max())) if priority.numel() else self.max_priority

    def _empty(self) -> None:
        self.priority.zero_()
        self.newest_version.fill_(-(2**62))
        self.max_priority = 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"priority": self.priority.clone(), "newest_version": self.newest_version.clone(),
                "max_priority": self.max_priority}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.priority.copy_(state_dict["priority"])
        self.newest_version.copy_(state_dict["newest_version"])
        self.max_priority = float(state_dict["max_priority"])

    def dumps(self, path: Any) -> None:
        torch.save(self.state_dict(), f"{path}/segment_sampler.pt")

    def loads(self, path: Any) -> None:
        self.load_state_dict(torch.load(f"{path}/segment_sampler.pt"))


class ReplaySample(NamedTuple):
    """Segments drawn from memory, laid out as extra env columns: ``data[k]`` is ``[T, n * b, ...]``."""

    data: dict[str, Tensor]
    index: Tensor  # [n] int64 memory indices of the segments (for the priority update)
    weights: Tensor  # [T, n * b] float32 IS weight of each sample (its segment's weight)


def segment_priorities(
    pg_advantages: Tensor, value_targets: Tensor, values: Tensor, segment_envs: int, kind: str = "pg_advantage"
) -> Tensor:
    """Per-segment priorities ``[B / b]`` from ``[T, B]`` float32 targets (B = a multiple of ``segment_envs``).

    ``pg_advantage``: mean over the segment's T * b samples of |A_t| (raw V-trace pg advantages, not normalised);
    ``value_error``: mean of |vs_t - V(x_t)|.
    """
    if kind == "pg_advantage":
        err = pg_advantages.abs()
    elif kind == "value_error":
        err = (value_targets - values).abs()
    else:
        raise ReplayConfigError(f"replay.priority {kind!r} unknown; use one of {PRIORITY_KINDS}")
    num_steps, num_envs = err.shape
    return err.float().reshape(num_steps, num_envs // segment_envs, segment_envs).mean(dim=(0, 2))


class TrajectoryReplay:
    """Prioritized memory of trained ``[T, b]`` segments, on ``device``; capacity in segments, FIFO eviction.

    Attributes:
        cfg: the ``ReplayConfig``.
        buffer: the torchrl ``ReplayBuffer`` (``LazyTensorStorage`` + ``RoundRobinWriter`` + the segment sampler).
        num_added / num_sampled: segments added and drawn so far.
    """

    def __init__(self, cfg: ReplayConfig, device: torch.device | str = "cpu", seed: int = 0):
        cfg.validate()
        self.cfg = cfg
        self.device = torch.device(device)
        self.sampler = SegmentPrioritySampler(cfg.capacity, cfg.alpha, cfg.eps, self.device, seed)
        # The storage is allocated lazily by the first extend, with the segment shape [capacity, T, b, ...].
        self.buffer = ReplayBuffer(
            storage=LazyTensorStorage(cfg.capacity, device=self.device), sampler=self.sampler,
            writer=RoundRobinWriter(), batch_size=None,
        )  # fmt: skip
        self.segment_shape: tuple[int, int] | None = None  # (T, b) once the first segments arrive
        self.final_rows: int | None = None  # rows of each segment's truncation side table, once known
        self.num_added = 0
        self.num_sampled = 0

    def __len__(self) -> int:
        return len(self.buffer)

    def beta(self, env_steps: int, total_env_steps: int | None = None) -> float:
        """beta annealed linearly from ``cfg.beta`` to 1 over ``beta_steps`` fresh env steps (Schaul et al. 2016)."""
        horizon = self.cfg.beta_steps or total_env_steps or 5_000_000
        frac = min(1.0, max(0.0, env_steps / float(horizon)))
        return self.cfg.beta + (1.0 - self.cfg.beta) * frac

    def num_segments_for(self, num_envs: int) -> int:
        """Segments to replay beside a fresh batch of ``num_envs`` columns: round(ratio * B / b)."""
        return int(round(self.cfg.ratio * num_envs / self.cfg.segment_envs))

    def _check_width(self, num_steps: int, num_envs: int) -> None:
        b = self.cfg.segment_envs
        if num_envs % b:
            divisors = [d for d in range(1, num_envs + 1) if num_envs % d == 0]
            near = min(divisors, key=lambda d: abs(d - b))
            raise ReplayConfigError(
                f"replay.segment_envs={b} must divide the batch's {num_envs} env columns; "
                f"try replay.segment_envs={near}"
            )
        if self.segment_shape is not None and self.segment_shape[0] != num_steps:
            raise ReplayConfigError(
                f"replay: segments hold T={self.segment_shape[0]} steps but this batch has T={num_steps}; "
                "the rollout length must stay fixed while replay is on"
            )

    @torch.no_grad()
    def add(self, batch: dict[str, Tensor], priorities: Tensor | None = None, policy_version: int = 0) -> Tensor:
        """Cut a ``[T, B]`` batch (raw rewards, the original ``behavior_logp``) into ``B / b`` segments and store them.

        ``batch`` follows the trajectory contract (docs/learner.md): ``obs`` ``[T + 1, B, ...]`` and the side table
        ``final_obs [K, ...]``, ``final_step_idx``/``final_env_idx`` ``[K]``, ``final_count``. Each segment keeps
        its ``T + 1`` obs rows and its truncations in a table of ``b * ceil(K / B)`` rows (the slot's per-env worst
        case). ``priorities`` ``[B / b]`` (None: the max priority seen so far). ``policy_version`` fills the
        per-step versions when the batch has none. Returns the memory indices ``[B / b]``. The oldest segments
        are overwritten once the memory is full (FIFO).
        """
        from tensordict import TensorDict

        num_steps, num_envs = batch["rewards"].shape
        self._check_width(num_steps, num_envs)
        b = self.cfg.segment_envs
        num_segments = num_envs // b
        fields = {}
        for key in (*SEGMENT_KEYS, "obs"):
            if key == "policy_version" and key not in batch:
                value = torch.full((num_steps, num_envs), policy_version, dtype=torch.int64, device=self.device)
            else:
                value = batch[key].to(self.device)
            # [T, B, ...] -> [T, n, b, ...] -> [n, T, b, ...]: each segment keeps its time axis and its columns.
            fields[key] = value.reshape(value.shape[0], num_segments, b, *value.shape[2:]).transpose(0, 1)
        fields.update(self._segment_tables(batch, num_envs))
        segments = TensorDict(fields, batch_size=[num_segments], device=self.device)
        index = self.buffer.extend(segments)
        index = torch.as_tensor(index, device=self.device)
        self.sampler.newest_version[index] = fields["policy_version"].amax(dim=(1, 2))
        if priorities is not None:
            self.sampler.update_priority(index, priorities)
        self.segment_shape = (num_steps, b)
        self.num_added += num_segments
        return index

    def _segment_tables(self, batch: dict[str, Tensor], num_envs: int) -> dict[str, Tensor]:
        """Split a batch's truncation side table into per-segment tables ``[n, rows, ...]`` (rows padded)."""
        b = self.cfg.segment_envs
        num_segments = num_envs // b
        rows = b * -(-batch["final_obs"].shape[0] // num_envs)  # ceil(K / B) rows per env column
        if self.final_rows is not None and rows != self.final_rows:
            raise ReplayConfigError(
                f"replay: segments hold {self.final_rows} final-obs rows but this batch needs {rows}; the rollout "
                "length and the env's max_episode_steps must stay fixed while replay is on"
            )
        count = int(batch["final_count"])  # SYNC: one host read sizes the table
        final_obs = batch["final_obs"][:count].to(self.device)
        step_idx = batch["final_step_idx"][:count].to(self.device)
        env_idx = batch["final_env_idx"][:count].to(self.device)
        segment = env_idx // b
        order = torch.argsort(segment, stable=True)
        segment, final_obs, step_idx, env_idx = segment[order], final_obs[order], step_idx[order], env_idx[order]
        counts = torch.bincount(segment, minlength=num_segments)
        # position of each row within its segment's table: its rank among the rows of the same segment
        pos = torch.arange(count, device=self.device) - (torch.cumsum(counts, 0) - counts)[segment]
        if count and int(counts.max()) > rows:  # SYNC: only with truncations
            raise ReplayConfigError(f"replay: a segment has {int(counts.max())} truncated steps, more than {rows} rows")
        out_obs = torch.zeros(num_segments, rows, *final_obs.shape[1:], dtype=final_obs.dtype, device=self.device)
        out_step = torch.zeros(num_segments, rows, dtype=torch.int64, device=self.device)
        out_env = torch.zeros(num_segments, rows, dtype=torch.int64, device=self.device)
        out_obs[segment, pos] = final_obs
        out_step[segment, pos] = step_idx
        out_env[segment, pos] = env_idx % b  # local column within the segment
        self.final_rows = rows
        return {"final_obs": out_obs, "final_step_idx": out_step, "final_env_idx": out_env, "final_count": counts}

    @torch.no_grad()
    def sample(self, num_segments: int, learner_version: int, beta: float) -> ReplaySample | None:
        """Draw ``num_segments`` segments by priority among those whose newest step is at most ``max_age`` versions
        behind ``learner_version``; None when the memory holds none (or ``num_segments`` is 0)."""
        if num_segments <= 0 or len(self.buffer) == 0:
            return None
        self.sampler.live_from = learner_version - self.cfg.max_age
        self.sampler.beta = beta
        # SYNC: one scalar: are any segments young enough?
        if not bool((self.sampler.newest_version[: len(self.buffer)] >= self.sampler.live_from).any()):
            return None
        segments, info = self.buffer.sample(num_segments, return_info=True)
        index = torch.as_tensor(info["index"], device=self.device)
        b = self.cfg.segment_envs
        # [n, T, b, ...] -> [T, n * b, ...]: replayed segments become extra env columns of the batch.
        data = {key: segments[key].transpose(0, 1).reshape(segments[key].shape[1], num_segments * b,
                                                           *segments[key].shape[3:])
                for key in (*SEGMENT_KEYS, "obs")}  # fmt: skip
        # The segments' side tables, compacted into one table of the drawn columns (env index = column in data).
        valid = torch.arange(self.final_rows, device=self.device) < segments["final_count"].unsqueeze(1)
        offset = (torch.arange(num_segments, device=self.device) * b).unsqueeze(1)
        data["final_obs"] = segments["final_obs"][valid]
        data["final_step_idx"] = segments["final_step_idx"][valid]
        data["final_env_idx"] = (segments["final_env_idx"] + offset)[valid]
        data["final_count"] = torch.tensor(data["final_obs"].shape[0], device=self.device)
        weights = info["priority_weight"].float().to(self.device)
        num_steps = data["rewards"].shape[0]
        weights = weights.repeat_interleave(b).unsqueeze(0).expand(num_steps, -1)
        self.num_sampled += num_segments
        return ReplaySample(data, index, weights)

    @torch.no_grad()
    def update_priorities(self, index: Tensor, priorities: Tensor) -> None:
        """Set the priorities ``[n]`` of the segments at memory ``index`` ``[n]`` (duplicates: the last wins)."""
        self.sampler.update_priority(index, priorities)

    @torch.no_grad()
    def join(
        self, fresh: dict[str, Tensor], fresh_rewards: Tensor, fresh_mask: Tensor | None, sample: ReplaySample,
        learner_version: int, scale_rewards: Any = None,
    ) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:  # fmt: skip
        """Append replayed segments to a fresh ``[T, B]`` batch as extra env columns ``[T, B + n b]``.

        Args:
            fresh: the fresh batch (``[T, B, ...]`` tensors on the learner's device).
            fresh_rewards: ``[T, B]`` the fresh rewards as the learner trains on them (already scaled).
            fresh_mask: ``[T, B]`` bool policy-lag mask of the fresh columns, or None (all count).
            sample: from ``sample``.
            learner_version: the learner's policy_version; replayed samples older than ``max_age`` are masked.
            scale_rewards: maps replayed raw rewards ``[T, n b]`` to training rewards (e.g. ``frozen_reward_scale``
                bound to the learner's scaler); None keeps them raw.

        Returns ``(data, rewards, mask, weights)``: data holds the keys V-trace and the loss need (behaviour logp
        stays the acting policy's: V-trace's ratios correct for the segment's age; ``obs`` ``[T + 1, B + n b]``; one
        side table whose ``final_count`` rows are all valid), mask ``[T, B + n b]`` bool,
        weights ``[T, B + n b]`` float32 (1 for fresh columns, the IS weight for replayed ones).
        """
        replayed = sample.data
        num_steps, num_envs = fresh_rewards.shape
        device = fresh_rewards.device
        data = {key: torch.cat([fresh[key], replayed[key].to(device)], dim=1)
                for key in ("obs", *SEGMENT_KEYS[:-1])}  # fmt: skip
        # One side table for the joined columns: the fresh rows, then the replayed ones shifted past the B fresh.
        count = int(fresh["final_count"])  # SYNC: one host read sizes the fresh table
        data["final_obs"] = torch.cat([fresh["final_obs"][:count], replayed["final_obs"].to(device)])
        data["final_step_idx"] = torch.cat([fresh["final_step_idx"][:count], replayed["final_step_idx"].to(device)])
        data["final_env_idx"] = torch.cat([fresh["final_env_idx"][:count],
                                           replayed["final_env_idx"].to(device) + num_envs])  # fmt: skip
        data["final_count"] = torch.tensor(data["final_obs"].shape[0], device=device)
        replay_rewards = replayed["rewards"].to(device)
        if scale_rewards is not None:
            replay_rewards = scale_rewards(replay_rewards)
        rewards = torch.cat([fresh_rewards, replay_rewards.to(fresh_rewards.dtype)], dim=1)
        # INVARIANT: replayed data is never dropped by the learner's max_policy_lag, only by replay's own max_age.
        replay_mask = (learner_version - replayed["policy_version"].to(device)) <= self.cfg.max_age
        if fresh_mask is None:
            fresh_mask = torch.ones(num_steps, num_envs, dtype=torch.bool, device=device)
        mask = torch.cat([fresh_mask, replay_mask], dim=1)
        weights = torch.cat([torch.ones(num_steps, num_envs, device=device), sample.weights.to(device)], dim=1)
        return data, rewards, mask, weights


def frozen_reward_scale(rewards: Tensor, scaler: Any, clip: float | None, raw_clip: float | None = None) -> Tensor:
    """Replayed raw rewards ``[T, n]`` as the learner treats fresh ones: clipped to ``raw_clip`` first (if set),
    then scaled with the learner's CURRENT return statistics without updating them (``scaler`` None: no scaling,
    and ``clip`` is not applied, as for fresh rewards without ``scale_rewards``).

    The scaler's per-env discounted-return accumulators follow the fresh env columns; replayed columns must not
    advance them (nor count twice in the running variance).
    """
    if raw_clip is not None:
        rewards = rewards.clamp(-raw_clip, raw_clip)
    if scaler is None:
        return rewards
    scaled = rewards / math.sqrt(scaler.var + scaler.eps)
    return scaled.clamp(-clip, clip) if clip is not None else scaled
