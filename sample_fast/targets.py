"""V-trace targets of a ``[T, B]`` trajectory batch with the policy's current weights: the learner's step 2.

Owns the critic bootstrapping rules (terminated: none; truncated: V(final_obs); the last step: V(obs[T]) unless it
truncated) and the choice of V-trace kernel; the recursion itself lives in ``sample_fast.extensions``. No state,
no optimiser, no gradients: ``sample_fast.learner`` calls ``compute_targets`` once per batch or epoch and
re-exports everything here. See step 2 ("Targets") of the objective in docs/learner.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sample_fast.policy import ActorCritic
from sample_fast.recurrent import SequenceInputs

log = logging.getLogger(__name__)

VTraceFn = Callable[..., tuple[Tensor, Tensor]]


class Targets(NamedTuple):
    """Output of ``compute_targets``; every field is ``[T, B]`` float32."""

    pg_advantages: Tensor  # V-trace policy-gradient advantages rho_t (r_t + gamma vs_{t+1} - V(x_t))
    value_targets: Tensor  # V-trace targets vs_t
    values: Tensor  # V(obs_t) under the current critic (the baseline; "old values" for value clipping)
    target_logp: Tensor  # log pi(a_t | obs_t) under the current policy


def _torch_vtrace(
    behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, *, gamma, lam=1.0,
    rho_clip=1.0, c_clip=1.0, truncation_values=None, backend="auto",
):  # fmt: skip
    from sample_fast.extensions._reference import vtrace_reference

    return vtrace_reference(
        behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values,
        gamma, lam, rho_clip, c_clip,
    )  # fmt: skip


def default_vtrace_fn() -> VTraceFn:
    """``sample_fast.extensions.compute_vtrace`` (fast kernels); the torch reference loop if it does not import."""
    try:
        from sample_fast.extensions import compute_vtrace
    except ImportError as e:
        log.warning("sample_fast.extensions.compute_vtrace unavailable (%s); using the torch reference loop", e)
        return _torch_vtrace
    return compute_vtrace


@torch.no_grad()
def compute_targets(
    policy: ActorCritic,
    obs: Tensor,
    actions: Tensor,
    behavior_logp: Tensor,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    final_obs: Tensor,
    final_step_idx: Tensor,
    final_env_idx: Tensor,
    *,
    gamma: float,
    lam: float,
    rho_clip: float,
    c_clip: float,
    vtrace_fn: VTraceFn | None = None,
    backend: str = "auto",
    sequence: SequenceInputs | None = None,
) -> Targets:
    """V-trace targets for a time-major batch with the policy's CURRENT weights and observation statistics.

    Args:
        obs: ``[T + 1, B, *obs_shape]`` raw observations; row T is the observation after the last step.
        actions: ``[T, B, *act_shape]``; behavior_logp, rewards: ``[T, B]`` float32 (rewards already scaled).
        terminated, truncated: ``[T, B]`` bool, kept separate.
        final_obs: ``[K, *obs_shape]`` the true final observation of each truncated, not terminated step, at
            ``(final_step_idx[k], final_env_idx[k])`` (``[K]`` int64); exactly the valid rows (no padding).
        sequence: a recurrent policy's stored state, resets and RL² inputs: the T + 1 rows are re-run from the
            state stored at the slot start, and each final obs is valued one step after the state its truncated
            step left (``ActorCritic.value_step``).

    Bootstrapping: terminated -> none; truncated -> V(final_obs); the last step of a column -> V(obs[T]), except
    where that step truncated: obs[T] is then the reset observation of the next episode and the bootstrap is
    V(final_obs) (never across an episode boundary). Only ``B + K`` rows go through the critic besides the T*B.
    The V-trace inputs are float32 whatever autocast produced.
    """
    num_steps, num_envs = rewards.shape
    flat = num_steps * num_envs
    if sequence is not None:
        target_logp, values, next_values = _recurrent_outputs(
            policy, obs, actions, final_obs, final_step_idx, final_env_idx, sequence
        )
    else:
        target_logp, _, values = policy.evaluate(
            obs[:-1].reshape(flat, *obs.shape[2:]), actions.reshape(flat, *actions.shape[2:])
        )
        next_values = policy.value(torch.cat([obs[-1], final_obs.to(obs.dtype)], dim=0)).float()
    target_logp = target_logp.float().reshape(num_steps, num_envs)
    values = values.float().reshape(num_steps, num_envs)

    truncation_values = torch.zeros_like(values)
    truncation_values[final_step_idx, final_env_idx] = next_values[num_envs:]
    # INVARIANT: a column whose last step truncated bootstraps from its true final obs, not from obs[T].
    last_truncated = truncated[-1] & ~terminated[-1]
    bootstrap_value = torch.where(last_truncated, truncation_values[-1], next_values[:num_envs])
    truncation_values[-1] = bootstrap_value

    fn = vtrace_fn if vtrace_fn is not None else default_vtrace_fn()
    # INVARIANT: float32 V-trace inputs whatever autocast produced (compute_vtrace rejects bf16); checked under
    # CPU autocast by tests/test_learner.py::test_bf16_autocast_trains_with_float32_targets_on_the_cpu.
    pg_advantages, value_targets = fn(
        behavior_logp.float(), target_logp, rewards.float(), values, bootstrap_value, terminated, truncated,
        gamma=gamma, lam=lam, rho_clip=rho_clip, c_clip=c_clip, truncation_values=truncation_values, backend=backend,
    )  # fmt: skip
    return Targets(pg_advantages.float(), value_targets.float(), values, target_logp)


def _recurrent_outputs(
    policy: ActorCritic, obs: Tensor, actions: Tensor, final_obs: Tensor, final_step_idx: Tensor,
    final_env_idx: Tensor, sequence: SequenceInputs,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """A recurrent policy's ``(target_logp [T, B], values [T, B], next_values [B + K])``: the slot's rows re-run
    from the stored state; ``next_values`` = V(obs[T]) then the final observations' values."""
    num_steps = actions.shape[0]
    target_logp, _, all_values, states = policy.evaluate_sequence(obs, actions, sequence)
    # A truncated step t left states[t]; its final obs is the next row of the same episode (no reset), whose
    # RL² inputs are step t's action and raw reward: row t + 1's (that row itself starts after the reset).
    prev = ()
    if sequence.prev_action is not None:
        prev = (sequence.prev_action[final_step_idx + 1, final_env_idx],
                sequence.prev_reward[final_step_idx + 1, final_env_idx])  # fmt: skip
    final_values = policy.value_step(final_obs.to(obs.dtype), states[final_step_idx, final_env_idx], *prev)
    next_values = torch.cat([all_values[num_steps], final_values]).float()
    return target_logp, all_values[:num_steps], next_values


def final_table(data: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The valid rows ``(final_obs [K, ...], final_step_idx [K], final_env_idx [K])`` of a batch's side table."""
    count = int(data["final_count"])  # SYNC: one host read sizes the table
    return data["final_obs"][:count], data["final_step_idx"][:count], data["final_env_idx"][:count]
