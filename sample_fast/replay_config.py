"""The ``replay:`` config section: ``ReplayConfig``, the settings of prioritized trajectory replay.

Kept apart from ``sample_fast.replay`` (which imports torchrl, seconds to load) so that composing and resolving a
config never imports torchrl; ``sample_fast.replay`` re-exports both names. The trainer builds the memory from this
section (``sample_fast.wiring.build_replay``) and hands it to the learner. See docs/replay.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PRIORITY_KINDS", "ReplayConfig", "ReplayConfigError"]

PRIORITY_KINDS = ("pg_advantage", "value_error")


class ReplayConfigError(ValueError):
    """A bad replay setting; the message says what to change."""


@dataclass
class ReplayConfig:
    """Prioritized trajectory replay (``replay.*`` on the command line). Off unless ``ratio > 0``."""

    #: Replayed env columns per fresh batch as a fraction of its B columns (0.5: B/2 replayed columns = B/(2b)
    #: segments). 0 = replay off (the default).
    ratio: float = 0.0
    #: Memory size in segments; the oldest segment is evicted first (FIFO). Live segments <= max_age * B / b.
    capacity: int = 128
    #: b: env columns per segment (must divide the batch's B). Segments keep all T steps.
    segment_envs: int = 8
    #: Priority exponent: P(i) = p_i^alpha / sum_j p_j^alpha (0 = uniform).
    alpha: float = 0.6
    #: Initial importance-sampling exponent, annealed linearly to 1 over beta_steps fresh env steps.
    beta: float = 0.4
    #: Fresh env steps over which beta reaches 1; None = the learner's total_env_steps (5M if that is unknown).
    beta_steps: int | None = None
    #: Replayed samples whose policy_version lags the learner by more than this many versions are masked out;
    #: segments entirely older than this are no longer sampled (replay ignores learner.max_policy_lag).
    max_age: int = 32
    #: Segment priority: mean |V-trace pg advantage| ("pg_advantage") or mean |vs - V(x)| ("value_error").
    priority: str = "pg_advantage"
    #: Added to priorities so that no live segment has probability 0.
    eps: float = 1e-6

    def validate(self) -> None:
        """Raise ``ReplayConfigError`` naming the fix for any inconsistent setting."""
        if not (0.0 <= self.ratio and math.isfinite(self.ratio)):
            raise ReplayConfigError(f"replay.ratio must be >= 0 (0 = off, e.g. 0.5), got {self.ratio}")
        for name in ("capacity", "segment_envs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ReplayConfigError(f"replay.{name} must be a positive int, got {value!r}")
        if self.alpha < 0:
            raise ReplayConfigError(f"replay.alpha must be >= 0 (0 = uniform), got {self.alpha}")
        if not 0.0 <= self.beta <= 1.0:
            raise ReplayConfigError(f"replay.beta must be in [0, 1] (it is annealed to 1), got {self.beta}")
        if self.beta_steps is not None and self.beta_steps < 1:
            raise ReplayConfigError(f"replay.beta_steps must be >= 1 or None, got {self.beta_steps}")
        if not isinstance(self.max_age, int) or self.max_age < 0:
            raise ReplayConfigError(f"replay.max_age must be an int >= 0 (policy versions), got {self.max_age!r}")
        if self.priority not in PRIORITY_KINDS:
            raise ReplayConfigError(f"replay.priority {self.priority!r} unknown; use one of {PRIORITY_KINDS}")
        if not self.eps > 0:
            raise ReplayConfigError(f"replay.eps must be > 0, got {self.eps}")
