"""The APPO learner: V-trace targets + PPO clipped surrogate on ``[T, B]`` trajectory batches.

Owns the optimizer, the learning-rate schedule, the return-based reward scaler, the minibatch RNG, the policy-lag
mask and non-finite recovery (skip, then roll back to the last good state with a lower learning rate). It updates
the policy's observation statistics but never touches an env, a process or the ParamStore: the runner publishes
weights after ``train``. The math lives in ``sample_fast.losses``, ``sample_fast.targets`` (V-trace targets) and
``sample_fast.extensions`` (the V-trace kernels). See docs/learner.md for the objective and every config field.
A recurrent policy's slots are re-run from their stored state, minibatches are whole env columns, and replayed
recurrent segments can be burned in (docs/recurrent.md).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from sample_fast.losses import approx_kl, explained_variance, masked_mean, normalize_advantages, ppo_clip_loss
from sample_fast.losses import value_loss as value_loss_fn
from sample_fast.policy import ActorCritic
from sample_fast.recurrent import RL2_KEYS, RNN_KEYS, SequenceInputs, sequence_inputs
from sample_fast.targets import Targets, VTraceFn, _torch_vtrace, compute_targets, default_vtrace_fn, final_table

if TYPE_CHECKING:  # the replay module imports torchrl (seconds): only a run with replay on loads it
    from sample_fast.replay import TrajectoryReplay

__all__ = [  # compute_targets and its pieces moved to sample_fast.targets; importing them from here still works
    "Learner", "LearnerConfig", "LearnerConfigError", "ReturnScaler", "Targets", "VTraceFn", "_torch_vtrace",
    "compute_targets", "default_vtrace_fn", "final_table",
]  # fmt: skip

log = logging.getLogger(__name__)

#: The trajectory batch contract (docs/learner.md); ``policy_version`` is optional, ``values`` is never read.
_REQUIRED_KEYS = (
    "obs", "actions", "behavior_logp", "rewards", "terminated", "truncated",
    "final_obs", "final_step_idx", "final_env_idx", "final_count",
)  # fmt: skip


class LearnerConfigError(ValueError):
    """A bad ``LearnerConfig`` value; the message says what to change."""


@dataclass
class LearnerConfig:
    """APPO hyper-parameters. Defaults are tuned for continuous control (MuJoCo) with batches of a few thousand."""

    #: Adam learning rate (before schedule and non-finite back-off).
    lr: float = 3e-4
    #: "constant", "linear" (to 0 at total_env_steps) or "kl_adaptive" (Sample Factory style, see kl_target).
    lr_schedule: str = "constant"
    #: kl_adaptive: lr /= 1.5 when the batch's mean KL > 2 * kl_target, lr *= 1.5 when < kl_target / 2.
    kl_target: float = 0.008
    #: kl_adaptive: the learning rate stays within [lr_min, lr_max].
    lr_min: float = 1e-6
    lr_max: float = 1e-2
    #: Adam epsilon (CleanRL's 1e-5 is steadier than torch's 1e-8 for RL).
    adam_eps: float = 1e-5
    #: Discount factor.
    gamma: float = 0.99
    #: V-trace lambda (Espeholt et al. remark 1; 1.0 = plain V-trace).
    lam: float = 0.95
    #: V-trace truncation of the importance weights: rho (policy-gradient / value fixed point) and c (trace).
    rho_clip: float = 1.0
    c_clip: float = 1.0
    #: When to recompute V-trace targets with the current weights: "batch" (once per train call) or "epoch".
    recompute_targets: str = "epoch"
    #: PPO ratio clip: ratio in [1 - clip_eps, 1 + clip_eps].
    clip_eps: float = 0.2
    #: Dual-clip PPO (Ye et al. 2020): where A < 0 the objective is bounded by dual_clip * A (> 1); None disables.
    #: Guards against the huge ratios a stale behaviour policy can produce.
    dual_clip: float | None = 3.0
    #: What the PPO ratio is taken against: "behavior" (log mu, the acting policy: APPO as in Sample Factory; with a
    #: policy lag of L train calls the ratio also carries L calls of drift, so stale samples are clipped out) or
    #: "proximal" (the policy at the start of this train call, whose log-probabilities the V-trace targets already
    #: computed: decoupled PPO, Hilton et al. 2021; the off-policy correction is V-trace's clipped rho in the
    #: advantages, the clip bounds only this call's change). The clip fraction, ``kl`` and the kl penalty are
    #: measured against the same anchor.
    clip_anchor: str = "behavior"
    #: PPO2-style value clipping around the values the targets were computed with; None disables it.
    value_clip: float | None = None
    #: Loss = policy + value_coef * value - entropy_coef * entropy + kl_coef * KL(behaviour || current).
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    #: "constant" (entropy_coef throughout) or "linear": from entropy_coef at env step 0 to entropy_coef_final at
    #: total_env_steps (and held there after), by the learner's absolute env-step count as the linear lr schedule.
    entropy_schedule: str = "constant"
    entropy_coef_final: float = 0.0
    #: Gradient clipping by global norm; None disables it (the norm is still reported).
    max_grad_norm: float | None = 1.0
    #: Passes over each batch, and minibatches per pass (over the T*B flattened samples).
    num_epochs: int = 2
    num_minibatches: int = 4
    #: Normalise the V-trace policy-gradient advantages to zero mean, unit std over the batch.
    normalize_advantages: bool = True
    #: Divide rewards by the running std of the per-env discounted return (reset at episode ends).
    scale_rewards: bool = True
    #: With scale_rewards, scaled rewards are clipped to [-reward_clip, reward_clip]; None disables it.
    reward_clip: float | None = 10.0
    #: Clip the env's raw rewards to [-raw_reward_clip, raw_reward_clip] before anything else (Atari: 1.0, i.e.
    #: Mnih et al. 2015's clipping of the game score; for integer scores that is sign(r)); None disables it. Only the
    #: learner's rewards are clipped: the logged episode returns stay the raw game score.
    raw_reward_clip: float | None = None
    #: Samples whose policy_version lags the learner by more than this are masked out of the loss; None = never.
    max_policy_lag: int | None = 100
    #: Consecutive non-finite updates (skipped) before rolling back to the last good state.
    nonfinite_patience: int = 3
    #: The learning rate is multiplied by this at each rollback.
    nonfinite_lr_backoff: float = 0.5
    #: The in-memory last-good copy (weights, optimizer, reward scaler) is refreshed every this many good updates.
    good_state_interval: int = 10
    #: V-trace kernel: "auto", "torch", "numba", "cuda" (see sample_fast.extensions.compute_vtrace).
    advantage_backend: str = "auto"
    #: bf16 autocast for the network forward/backward on CUDA (ignored on the CPU).
    bf16: bool = True
    #: Seed of the learner's minibatch-shuffling generator.
    seed: int = 0

    def validate(self) -> None:
        """Raise ``LearnerConfigError`` naming the fix for any inconsistent setting."""
        if self.lr_schedule not in ("constant", "linear", "kl_adaptive"):
            raise LearnerConfigError(f"lr_schedule {self.lr_schedule!r} unknown; use constant, linear or kl_adaptive")
        if self.entropy_schedule not in ("constant", "linear"):
            raise LearnerConfigError(f"entropy_schedule {self.entropy_schedule!r} unknown; use constant or linear")
        for name in ("entropy_coef", "entropy_coef_final"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise LearnerConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.clip_anchor not in ("behavior", "proximal"):
            raise LearnerConfigError(f"clip_anchor {self.clip_anchor!r} unknown; use behavior or proximal")
        if self.recompute_targets not in ("batch", "epoch"):
            raise LearnerConfigError(f"recompute_targets {self.recompute_targets!r} unknown; use batch or epoch")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise LearnerConfigError(f"lr must be a positive number, got {self.lr}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise LearnerConfigError(f"gamma ({self.gamma}) and lam ({self.lam}) must be in [0, 1]")
        for name in ("rho_clip", "c_clip", "clip_eps", "kl_target"):
            if not getattr(self, name) > 0:
                raise LearnerConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise LearnerConfigError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {self.dual_clip}")
        for name in ("num_epochs", "num_minibatches", "nonfinite_patience", "good_state_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise LearnerConfigError(f"{name} must be a positive int, got {value!r}")
        if not 0.0 < self.nonfinite_lr_backoff <= 1.0:
            raise LearnerConfigError(f"nonfinite_lr_backoff must be in (0, 1], got {self.nonfinite_lr_backoff}")
        if not 0 < self.lr_min <= self.lr_max:
            raise LearnerConfigError(f"need 0 < lr_min <= lr_max, got lr_min={self.lr_min}, lr_max={self.lr_max}")
        if self.raw_reward_clip is not None and not self.raw_reward_clip > 0:
            raise LearnerConfigError(
                f"raw_reward_clip must be > 0 (e.g. 1.0 for Atari) or None, got {self.raw_reward_clip}"
            )
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise LearnerConfigError(f"max_policy_lag must be >= 0 or None, got {self.max_policy_lag}")


class _Prepared(NamedTuple):
    """A batch ready for the optimisation loop (``Learner._prepare``)."""

    data: dict[str, Tensor]  # the training batch: fresh columns, then replayed ones when replay is on
    fresh: dict[str, Tensor]  # the fresh columns as received (raw rewards): what the replay memory keeps
    rewards: Tensor  # [T, B'] scaled (and clipped) rewards of data
    mask: Tensor | None  # [T * B'] bool: samples that count (policy lag, replay age); None = all
    weights: Tensor | None  # [T * B'] float32 per-sample loss weights (replay IS weights); None = all 1
    replayed: Any  # the ReplaySample joined into data, or None
    final: tuple[Tensor, Tensor, Tensor]  # data's valid side-table rows (final_obs, final_step_idx, final_env_idx)
    num_steps: int  # T
    num_envs: int  # B: fresh env columns
    num_epochs: int  # cfg.num_epochs, or 0 when the mask selects nothing
    sequence: SequenceInputs | None = None  # recurrent policies: stored state, resets, RL² inputs of data's columns
    burn_in_cols: Tensor | None = None  # [B'] bool: the replayed columns, whose first burn_in rows are not trained
    burn_in: int = 0  # R2D2 burn-in rows (replay.burn_in) of the replayed columns


class ReturnScaler:
    """Scales rewards by the running std of each env's discounted return (as gymnasium's NormalizeReward).

    Per env column b: ``R_b <- gamma * R_b + r_t`` (reset to 0 after a terminated or truncated step); the running
    variance of all R values seen so far (float64, parallel update) gives ``r_scaled = r / sqrt(var + eps)``.
    The statistics are updated with the batch before it is scaled.
    """

    def __init__(self, gamma: float, eps: float = 1e-8):
        self.gamma = gamma
        self.eps = eps
        self.returns: Tensor | None = None  # [B] float32
        #: distributed: merges the batch's (count, mean, var) with the other ranks' (sample_fast.distributed.Sync)
        self.merge: Any = None
        self.count = 0.0
        self.mean = 0.0
        self.var = 1.0

    def scale(self, rewards: Tensor, done: Tensor) -> Tensor:
        """``rewards``/``done`` ``[T, B]`` -> scaled rewards ``[T, B]``."""
        num_steps, num_envs = rewards.shape
        if self.returns is None or self.returns.shape[0] != num_envs or self.returns.device != rewards.device:
            self.returns = torch.zeros(num_envs, dtype=torch.float32, device=rewards.device)
        discounted = torch.empty_like(rewards, dtype=torch.float32)
        ret = self.returns
        for t in range(num_steps):  # PERF: T small [B] ops (~1 ms for T=64), far below one training epoch
            ret = ret * self.gamma + rewards[t]
            discounted[t] = ret
            ret = torch.where(done[t], torch.zeros_like(ret), ret)
        self.returns = ret
        x = discounted.double().flatten()
        n = float(x.numel())
        # SYNC: two scalars read back per batch.
        batch_mean, batch_var = float(x.mean()), float(x.var(unbiased=False))
        if self.merge is not None:  # distributed: every rank applies the all-ranks batch's moments
            n, batch_mean, batch_var = self.merge(n, batch_mean, batch_var)
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total
        return rewards / math.sqrt(self.var + self.eps)

    def state_dict(self) -> dict[str, Any]:
        returns = None if self.returns is None else self.returns.detach().cpu().clone()
        return {"returns": returns, "count": self.count, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns = None if state["returns"] is None else state["returns"].clone()
        self.count, self.mean, self.var = float(state["count"]), float(state["mean"]), float(state["var"])


def _fused_ok(params: list[Tensor]) -> bool:
    """Whether torch's fused Adam takes these parameters: floating point, on the CPU or one CUDA device."""
    devices = {p.device for p in params}
    return (
        bool(params)
        and all(p.is_floating_point() for p in params)
        and len(devices) == 1
        and next(iter(devices)).type in ("cpu", "cuda")
    )


class Learner:
    """APPO: per ``train(batch)`` call, ``num_epochs`` passes of ``num_minibatches`` Adam steps on a ``[T, B]`` batch.

    Attributes:
        policy_version: incremented by 1 per ``train`` call that changed the weights (an update or a rollback).
        env_steps: env steps trained on so far (sum of T * B); drives the linear schedule.
        nonfinite_skips / rollbacks: cumulative counters, also reported in the metrics.
    """

    def __init__(
        self,
        policy: ActorCritic,
        cfg: LearnerConfig | None = None,
        device: torch.device | str = "cpu",
        total_env_steps: int | None = None,
        *,
        vtrace_fn: VTraceFn | None = None,
        replay: TrajectoryReplay | None = None,
    ):
        cfg = cfg if cfg is not None else LearnerConfig()
        cfg.validate()
        if cfg.lr_schedule == "linear" and not total_env_steps:
            raise LearnerConfigError("lr_schedule='linear' needs total_env_steps (the step at which lr reaches 0)")
        if cfg.entropy_schedule == "linear" and not total_env_steps:
            raise LearnerConfigError(
                "entropy_schedule='linear' needs total_env_steps (the step at which entropy_coef_final is reached)"
            )
        self.cfg = cfg
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        #: Recurrent policies re-run each slot from its stored state; minibatches then split env columns, not time.
        self.recurrent = bool(getattr(policy, "is_recurrent", False))
        self.rl2 = self.recurrent and bool(getattr(policy, "rl2", False))
        self.total_env_steps = total_env_steps
        self.vtrace_fn = vtrace_fn
        self.params = [p for p in policy.parameters() if p.requires_grad]
        # PERF: torch's fused Adam: one kernel over every tensor instead of the foreach default's few per tensor
        # (benchmarks/results/adam_cpu.md); the same update to float rounding.
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=cfg.adam_eps, fused=_fused_ok(self.params))
        self.reward_scaler = ReturnScaler(cfg.gamma)
        self.generator = torch.Generator()  # CPU: permutations are drawn on the host and moved once per epoch
        self.generator.manual_seed(cfg.seed)
        self.policy_version = 0
        self.env_steps = 0
        self.num_updates = 0
        self.lr_scale = 1.0  # product of non-finite back-offs
        self.adaptive_lr = cfg.lr  # kl_adaptive schedule state
        self.nonfinite_skips = 0
        self.rollbacks = 0
        self.consecutive_skips = 0
        self._good_updates = 0
        self._good_state: dict[str, Any] = {}
        self._snapshot_good_state()
        #: distributed=ddp: the collectives (sample_fast.distributed.Sync); None in a single process.
        self.sync: Any = None
        #: Prioritized trajectory replay, built from the ``replay:`` section by its owner (``wiring.build_replay``);
        #: None = off. Its memory is not checkpointed (docs/replay.md).
        self.replay = replay

    def _vtrace_fn(self) -> VTraceFn:
        if self.vtrace_fn is None:
            self.vtrace_fn = default_vtrace_fn()  # resolved once, lazily: extensions may import numba/CUDA
        return self.vtrace_fn

    # ----- learning rate ------------------------------------------------------------------------------------------
    def _anneal_left(self) -> float:
        """The linear schedules' remaining fraction: 1 at env step 0, 0 at total_env_steps and after."""
        return max(0.0, 1.0 - self.env_steps / float(self.total_env_steps))

    def current_lr(self) -> float:
        """The learning rate of the next update: schedule value times the non-finite back-off."""
        cfg = self.cfg
        if cfg.lr_schedule == "linear":
            base = cfg.lr * self._anneal_left()
        elif cfg.lr_schedule == "kl_adaptive":
            base = self.adaptive_lr
        else:
            base = cfg.lr
        return base * self.lr_scale

    def current_entropy_coef(self) -> float:
        """The entropy bonus's weight in the next update (cfg.entropy_schedule)."""
        cfg = self.cfg
        if cfg.entropy_schedule == "linear":
            return cfg.entropy_coef_final + (cfg.entropy_coef - cfg.entropy_coef_final) * self._anneal_left()
        return cfg.entropy_coef

    def _adapt_lr(self, kl: float) -> None:
        # Sample Factory's kl_adaptive rule, applied once per train call on the call's mean KL.
        if not math.isfinite(kl):
            return
        if kl > 2.0 * self.cfg.kl_target:
            self.adaptive_lr = max(self.adaptive_lr / 1.5, self.cfg.lr_min)
        elif kl < 0.5 * self.cfg.kl_target:
            self.adaptive_lr = min(self.adaptive_lr * 1.5, self.cfg.lr_max)

    # ----- non-finite recovery ------------------------------------------------------------------------------------
    def _snapshot_good_state(self) -> None:
        self._good_state = {
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "reward_scaler": self.reward_scaler.state_dict(),
        }

    def _rollback(self) -> None:
        good = self._good_state
        self.policy.load_state_dict(good["policy"])
        self.optimizer.load_state_dict(copy.deepcopy(good["optimizer"]))
        self.reward_scaler.load_state_dict(good["reward_scaler"])
        self.reward_scaler.returns = None  # the per-env accumulators may hold the bad values: restart them
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scale *= self.cfg.nonfinite_lr_backoff
        self.rollbacks += 1
        self.consecutive_skips = 0
        log.warning(
            "learner: %d consecutive non-finite updates; rolled back to the last good state, lr now %.3g (rollback %d)",
            self.cfg.nonfinite_patience, self.current_lr(), self.rollbacks,
        )  # fmt: skip

    # ----- training -----------------------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.bf16 and self.device.type == "cuda":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _unpack(self, batch: Any) -> dict[str, Tensor]:
        required = _REQUIRED_KEYS + (RNN_KEYS if self.recurrent else ()) + (RL2_KEYS if self.rl2 else ())
        missing = [k for k in required if k not in batch.keys()]
        if missing:
            raise KeyError(f"train(batch): batch lacks {missing}; see the trajectory batch table in docs/learner.md"
                           + (" and docs/recurrent.md" if self.recurrent else ""))  # fmt: skip
        data = {k: batch[k].to(self.device, non_blocking=True) for k in (*required, "policy_version")
                if k in batch.keys()}  # fmt: skip
        rewards, obs = data["rewards"], data["obs"]
        if rewards.ndim != 2:
            raise ValueError(f"train(batch): rewards must be [T, B], got shape {tuple(rewards.shape)}")
        if tuple(obs.shape[:2]) != (rewards.shape[0] + 1, rewards.shape[1]):
            raise ValueError(
                f"train(batch): obs must be [T + 1, B, ...] = {(rewards.shape[0] + 1, rewards.shape[1])} (row T is "
                f"the bootstrap observation), got {tuple(obs.shape)}"
            )
        if data["terminated"].dtype != torch.bool or data["truncated"].dtype != torch.bool:
            raise TypeError("train(batch): terminated and truncated must be bool tensors (keep them separate)")
        return data

    def _lag_mask(self, data: dict[str, Tensor]) -> Tensor | None:
        """``[T, B]`` bool: fresh samples at most ``max_policy_lag`` versions behind the learner (None: all)."""
        if self.cfg.max_policy_lag is None or "policy_version" not in data:
            return None
        return (self.policy_version - data["policy_version"]) <= self.cfg.max_policy_lag

    def _prepare(self, batch: Any) -> _Prepared:
        """Unpack, update the normaliser, scale rewards, build the lag mask and join replayed segments."""
        cfg = self.cfg
        data = self._unpack(batch)
        rewards, terminated, truncated = data["rewards"], data["terminated"], data["truncated"]
        num_steps, num_envs = rewards.shape
        fresh = data  # the fresh columns, raw: what the replay memory keeps after this call
        # 1. Observation statistics first, so targets and loss below see one consistent normaliser (the change
        #    relative to the behaviour policy's statistics is corrected by V-trace's importance ratios). Rows
        #    0..T-1 only: row T is the next slot's row 0 and would be counted twice.
        if self.sync is not None:  # distributed: the statistics of all ranks' batches, identical on every rank
            self.policy.update_normalizer(data["obs"][:-1], merge=self.sync.moments)
        else:
            self.policy.update_normalizer(data["obs"][:-1])
        # 2. Raw reward clipping, then scaling (statistics updated with this batch, then applied).
        if cfg.raw_reward_clip is not None:
            rewards = rewards.clamp(-cfg.raw_reward_clip, cfg.raw_reward_clip)
        if cfg.scale_rewards:
            rewards = self.reward_scaler.scale(rewards, terminated | truncated)
            if cfg.reward_clip is not None:
                rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
        # 3. Policy-lag mask.
        mask = self._lag_mask(data)
        # 4. Prioritized replay: replayed [T, b] segments join as extra env columns with IS weights and their own
        #    age limit (sample_fast.replay, docs/replay.md).
        weights, replayed = None, None
        if self.replay is not None:
            replayed = self.replay.sample(
                self.replay.num_segments_for(num_envs), self.policy_version,
                self.replay.beta(self.env_steps, self.total_env_steps),
            )  # fmt: skip
        if replayed is not None:
            from sample_fast.replay import frozen_reward_scale

            scale = None
            if cfg.scale_rewards or cfg.raw_reward_clip is not None:  # replayed rewards get what fresh ones get
                scale = functools.partial(frozen_reward_scale, scaler=self.reward_scaler if cfg.scale_rewards else None,
                                          clip=cfg.reward_clip, raw_clip=cfg.raw_reward_clip)  # fmt: skip
            data, rewards, mask, weights = self.replay.join(data, rewards, mask, replayed, self.policy_version, scale)
            weights = weights.reshape(-1)
        sequence, burn_in_cols, burn_in = None, None, 0
        if self.recurrent:
            sequence = sequence_inputs(data, self.rl2)
            burn_in = self.replay.cfg.burn_in if replayed is not None else 0
            if burn_in:  # R2D2: the replayed columns' first rows only refresh their stale stored state
                burn_in_cols = torch.arange(rewards.shape[1], device=self.device) >= num_envs
                mask[:burn_in, num_envs:] = False
        num_epochs = cfg.num_epochs
        if mask is not None:
            mask = mask.reshape(-1)
            # SYNC: an all-stale batch must not reach Adam (zero gradients would still move it through momentum).
            num_epochs = cfg.num_epochs if bool(mask.any()) else 0
        return _Prepared(data, fresh, rewards, mask, weights, replayed, final_table(data), num_steps, num_envs,
                         num_epochs, sequence, burn_in_cols, burn_in)  # fmt: skip

    def _targets(self, prep: _Prepared) -> Targets:
        """V-trace targets of the prepared batch with the current weights."""
        cfg, data = self.cfg, prep.data
        with self._autocast():
            return compute_targets(
                self.policy, data["obs"], data["actions"], data["behavior_logp"], prep.rewards, data["terminated"],
                data["truncated"], *prep.final, gamma=cfg.gamma, lam=cfg.lam, rho_clip=cfg.rho_clip,
                c_clip=cfg.c_clip, vtrace_fn=self._vtrace_fn(), backend=cfg.advantage_backend,
                sequence=prep.sequence,
            )  # fmt: skip

    def _optimize(self, prep: _Prepared) -> tuple[Targets, Targets, dict[str, list[Tensor]], bool]:
        """``num_epochs`` shuffled passes of ``num_minibatches`` updates; targets recomputed per cfg.

        Returns ``(first_targets, last_targets, sums, rolled_back)``; ``sums`` holds each good update's statistics.
        """
        cfg, data, mask, weights = self.cfg, prep.data, prep.mask, prep.weights
        flat = prep.rewards.numel()
        obs_f = data["obs"][:-1].reshape(flat, *data["obs"].shape[2:])
        act_f = data["actions"].reshape(flat, *data["actions"].shape[2:])
        anchor_f = data["behavior_logp"].reshape(flat).float()  # cfg.clip_anchor "proximal": replaced below
        sums: dict[str, list[Tensor]] = {}
        first_targets: Targets | None = None
        for epoch in range(max(prep.num_epochs, 1)):
            if epoch == 0 or cfg.recompute_targets == "epoch":
                targets = self._targets(prep)
                first_targets = first_targets if first_targets is not None else targets
                adv_f = targets.pg_advantages.reshape(flat)
                if cfg.normalize_advantages:
                    norm = self.sync.normalize_advantages if self.sync is not None else normalize_advantages
                    adv_f = norm(adv_f, mask)
                vs_f = targets.value_targets.reshape(flat)
                old_v_f = targets.values.reshape(flat)
                if epoch == 0 and cfg.clip_anchor == "proximal":  # this call's starting policy, fixed for its epochs
                    anchor_f = targets.target_logp.reshape(flat).detach().float()
            if prep.num_epochs == 0:
                break  # targets only, for the metrics
            for idx, evaluate in self._minibatches(prep, flat):
                mb_mask = mask[idx] if mask is not None else None
                mb_weights = weights[idx] if weights is not None else None
                obs_mb, act_mb = (obs_f[idx], act_f[idx]) if evaluate is None else (None, None)
                status = self._update(obs_mb, act_mb, anchor_f[idx], adv_f[idx], vs_f[idx], old_v_f[idx],
                                      mb_mask, sums, mb_weights, evaluate=evaluate)  # fmt: skip
                if status == "rollback":
                    return first_targets, targets, sums, True
        return first_targets, targets, sums, False

    def _minibatches(self, prep: _Prepared, flat: int) -> list[tuple[Tensor, Any]]:
        """One epoch's ``(flat sample indices, evaluate)`` minibatches. Feed-forward: random samples of the T * B'
        (``evaluate`` None: the flat obs/actions are evaluated). Recurrent: random groups of whole env columns
        (each re-run over its T + 1 rows from its stored state), the indices in the (t, column) order of the
        re-run's [T, b] outputs."""
        if not self.recurrent:
            perm = torch.randperm(flat, generator=self.generator).to(self.device, non_blocking=True)
            return [(idx, None) for idx in perm.chunk(self.cfg.num_minibatches)]
        num_cols = prep.rewards.shape[1]
        perm = torch.randperm(num_cols, generator=self.generator).to(self.device, non_blocking=True)
        rows = torch.arange(prep.num_steps, device=self.device).unsqueeze(1) * num_cols
        return [((rows + cols).reshape(-1), functools.partial(self._evaluate_columns, prep, cols))
                for cols in perm.chunk(self.cfg.num_minibatches)]  # fmt: skip

    def _evaluate_columns(self, prep: _Prepared, cols: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Differentiable ``(target_logp, entropy, values)`` ``[T * b]`` of env columns ``cols``, re-run from their
        stored states (truncated BPTT over the slot; resets mask the state at episode / trial starts)."""
        data = prep.data
        detach = prep.burn_in_cols[cols] if prep.burn_in_cols is not None else None
        logp, entropy, values, _ = self.policy.evaluate_sequence(
            data["obs"][:, cols], data["actions"][:, cols], prep.sequence.columns(cols), detach_cols=detach,
            detach_at=prep.burn_in,
        )  # fmt: skip
        return logp.reshape(-1), entropy.reshape(-1), values[:-1].reshape(-1)

    def _metrics(
        self, prep: _Prepared, first_targets: Targets, sums: dict[str, list[Tensor]], extra: dict[str, Tensor],
        num_updates: int,
    ) -> dict[str, float]:  # fmt: skip
        """Scalar metrics of one train call (statistics of the fresh columns; replay's in ``extra``)."""
        metrics = {k: torch.stack(v).mean() for k, v in sums.items()}
        metrics.update(extra)
        mask = prep.mask
        if prep.replayed is not None:  # the metrics below describe the fresh columns only, as with replay off
            first_targets = Targets(*(x[:, : prep.num_envs] for x in first_targets))
            mask = mask.reshape(prep.num_steps, -1)[:, : prep.num_envs].reshape(-1) if mask is not None else None
        pg_adv = first_targets.pg_advantages.reshape(-1)
        metrics["adv_mean"] = masked_mean(pg_adv, mask)
        metrics["adv_std"] = masked_mean((pg_adv - metrics["adv_mean"]).square(), mask).sqrt()
        metrics["explained_variance"] = explained_variance(
            first_targets.values.reshape(-1), first_targets.value_targets.reshape(-1), mask
        )
        metrics["masked_frac"] = 1.0 - mask.float().mean() if mask is not None else torch.zeros(())
        out = {k: float(v) for k, v in metrics.items()}  # SYNC: metrics read back once per train call
        if self.cfg.lr_schedule == "kl_adaptive" and "kl" in out:
            # distributed: the ranks' mean KL, so that every rank adapts its learning rate alike
            self._adapt_lr(self.sync.mean_scalar(out["kl"]) if self.sync is not None else out["kl"])
        out.update(
            lr=self.current_lr(), entropy_coef=self.current_entropy_coef(), num_updates=float(num_updates),
            nonfinite_skips=float(self.nonfinite_skips), rollbacks=float(self.rollbacks),
            policy_version=float(self.policy_version),
        )  # fmt: skip
        for key in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm"):
            out.setdefault(key, float("nan"))  # no good update in this call
        return out

    def train(self, batch: Any) -> dict[str, float]:
        """One APPO iteration on ``batch`` (a TensorDict or dict of trajectory tensors, see docs/learner.md).

        Returns scalar metrics: policy_loss, value_loss, entropy, kl, clip_frac, grad_norm (means over the good
        updates of this call), lr and entropy_coef (for the next update), adv_mean, adv_std (raw V-trace
        advantages), explained_variance, masked_frac, num_updates (this call), and the cumulative nonfinite_skips and
        rollbacks.
        """
        if self.sync is not None:
            self.sync.begin_update()  # distributed: a rank that does not arrive is named within the timeout
        prep = self._prepare(batch)
        updates_before = self.num_updates
        first_targets, last_targets, sums, rolled_back = self._optimize(prep)
        num_updates = self.num_updates - updates_before
        version_before = self.policy_version
        # INVARIANT: the one place env steps are counted; fresh steps only (replayed ones were counted when fresh).
        self.env_steps += prep.num_steps * prep.num_envs * (self.sync.world_size if self.sync is not None else 1)
        if num_updates > 0 or rolled_back:
            self.policy_version += 1
        extra: dict[str, Tensor] = {}
        if self.replay is not None:
            extra = self._replay_after_train(prep.fresh, last_targets, prep.replayed, prep.mask, prep.num_envs,
                                             version_before)  # fmt: skip
        return self._metrics(prep, first_targets, sums, extra, num_updates)

    def _replay_after_train(
        self, fresh: dict[str, Tensor], targets: Targets, replayed: Any, mask: Tensor | None, num_envs: int,
        version: int,
    ) -> dict[str, Tensor]:  # fmt: skip
        """Priorities from the last targets of this call: update the replayed segments', then store the fresh
        columns as new segments (after the update: storing may evict the replayed ones). Returns replay metrics."""
        from sample_fast.replay import segment_priorities

        replay = self.replay
        b = replay.cfg.segment_envs
        # Recurrent segments are trained after their burn-in rows only: their priority describes those rows.
        rows = slice(replay.cfg.burn_in if self.recurrent else 0, None)
        priorities = segment_priorities(
            targets.pg_advantages[rows],
            targets.value_targets[rows],
            targets.values[rows],
            b,
            replay.cfg.priority,
            replay.cfg.priority_eta,
        )
        num_fresh_segments = num_envs // b
        out: dict[str, Tensor] = {"replay_segments": torch.zeros(()), "replay_weight_mean": torch.ones(()),
                                  "replay_masked_frac": torch.zeros(())}  # fmt: skip
        if replayed is not None:
            replay.update_priorities(replayed.index, priorities[num_fresh_segments:])
            out["replay_segments"] = torch.tensor(float(replayed.index.numel()))
            out["replay_weight_mean"] = replayed.weights.mean()
            if mask is not None:
                out["replay_masked_frac"] = 1.0 - mask.reshape(targets.values.shape[0], -1)[:, num_envs:].float().mean()
        replay.add(fresh, priorities[:num_fresh_segments], policy_version=version)
        out["replay_size"] = torch.tensor(float(len(replay)))
        out["replay_beta"] = torch.tensor(replay.beta(self.env_steps, self.total_env_steps))
        return out

    def _update(
        self, obs: Tensor, actions: Tensor, anchor_logp: Tensor, advantages: Tensor, value_targets: Tensor,
        old_values: Tensor, mask: Tensor | None, sums: dict[str, list[Tensor]], weights: Tensor | None = None,
        evaluate: Any = None,
    ) -> str:  # fmt: skip
        """One minibatch step. ``anchor_logp``: what the ratio is taken against (cfg.clip_anchor). ``weights``
        ``[N]``: per-sample loss weights (replay's IS weights; None = all 1).
        ``evaluate``: returns ``(target_logp, entropy, values)`` in place of ``policy.evaluate(obs, actions)`` (a
        recurrent policy's sequence re-run). Returns "ok", "skipped" (non-finite) or "rollback"."""
        cfg = self.cfg
        with self._autocast():
            target_logp, entropy, values = evaluate() if evaluate is not None else self.policy.evaluate(obs, actions)
        # weights: replay's IS weights (1 for fresh columns); None without replay, the plain means bit for bit.
        policy_loss, clip_frac, _ = ppo_clip_loss(
            target_logp, anchor_logp, advantages, cfg.clip_eps, mask, dual_clip=cfg.dual_clip, weights=weights
        )
        v_loss = value_loss_fn(values, value_targets, old_values, cfg.value_clip, mask, weights=weights)
        mean_entropy = masked_mean(entropy, mask, weights)
        kl = approx_kl(target_logp, anchor_logp, mask, weights)
        loss = policy_loss + cfg.value_coef * v_loss - self.current_entropy_coef() * mean_entropy
        if cfg.kl_coef:
            loss = loss + cfg.kl_coef * kl
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        check = loss
        if self.sync is not None:  # SYNC: distributed: the ranks' mean gradient (and loss), one all_reduce
            check = self.sync.grads(self.params, loss)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        # SYNC: one host read per minibatch decides whether the step is taken.
        if not bool(torch.isfinite(check) & torch.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_skips += 1
            self.consecutive_skips += 1
            log.warning("learner: non-finite loss or gradient, update skipped (%d in a row)", self.consecutive_skips)
            if self.consecutive_skips >= cfg.nonfinite_patience:
                self._rollback()
                return "rollback"
            return "skipped"
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.num_updates += 1
        self.consecutive_skips = 0
        self._good_updates += 1
        if self._good_updates % cfg.good_state_interval == 0:
            self._snapshot_good_state()
        for key, value in (("policy_loss", policy_loss), ("value_loss", v_loss), ("entropy", mean_entropy),
                           ("kl", kl), ("clip_frac", clip_frac), ("grad_norm", grad_norm)):  # fmt: skip
            sums.setdefault(key, []).append(value.detach().float())
        return "ok"

    # ----- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer, counters, lr state, reward-scaler statistics and the minibatch RNG (not the policy weights:
        save ``policy.state_dict()`` beside it)."""
        return {
            # deepcopy: torch's optimizer state_dict shares the live moment tensors, which keep changing.
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "policy_version": self.policy_version,
            "env_steps": self.env_steps,
            "num_updates": self.num_updates,
            "lr_scale": self.lr_scale,
            "adaptive_lr": self.adaptive_lr,
            "reward_scaler": self.reward_scaler.state_dict(),
            "generator": self.generator.get_state(),
            "nonfinite_skips": self.nonfinite_skips,
            "rollbacks": self.rollbacks,
            "consecutive_skips": self.consecutive_skips,
            "good_updates": self._good_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; load the policy weights first. The restored state becomes the last
        good state for rollbacks."""
        # deepcopy: Adam.load_state_dict keeps tensors whose dtype/device already match, so without it two
        # learners restored from one in-memory state would share (and both advance) the same moment tensors.
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.policy_version = int(state["policy_version"])
        self.env_steps = int(state["env_steps"])
        self.num_updates = int(state["num_updates"])
        self.lr_scale = float(state["lr_scale"])
        self.adaptive_lr = float(state["adaptive_lr"])
        self.reward_scaler.load_state_dict(state["reward_scaler"])
        self.generator.set_state(state["generator"])
        self.nonfinite_skips = int(state["nonfinite_skips"])
        self.rollbacks = int(state["rollbacks"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self._good_updates = int(state["good_updates"])
        self._snapshot_good_state()
