"""Readable torch reference for GAE and V-trace: the source of truth every fast kernel is tested against.

Plain backward loops over time on time-major ``[T, B]`` tensors, in the dtype of the inputs (pass float64 for an
exact reference). No validation here: ``advantages.py`` checks shapes, dtypes and devices before calling in.
The fast kernels (``_numba_cpu.py``, ``_numba_cuda.py``) must give the same numbers up to float rounding.
"""

from __future__ import annotations

import torch


def next_values_reference(
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor | None,
) -> torch.Tensor:
    """V of the observation after step t, ``[T, B]``, following the episode rules.

    ``0`` where terminated (no future), ``truncation_values[t]`` where truncated and not terminated (the time limit
    cut a live episode: bootstrap from V(final_obs)), ``bootstrap_value`` at ``t == T-1``, else ``values[t+1]``.
    """
    next_values = torch.cat([values[1:], bootstrap_value[None]], dim=0)
    if truncation_values is not None:
        next_values = torch.where(truncated, truncation_values, next_values)
    return torch.where(terminated, torch.zeros_like(next_values), next_values)


def gae_reference(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor | None,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) with episode boundaries; returns ``(advantages, value_targets)``, both ``[T, B]``.

    ``delta_t = r_t + gamma * next_value_t - V_t`` and ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``
    with ``A_T = 0`` and ``done = terminated | truncated``; ``value_targets = A + V``.
    """
    num_steps = rewards.shape[0]
    next_values = next_values_reference(values, bootstrap_value, terminated, truncated, truncation_values)
    done = terminated | truncated
    advantages = torch.empty_like(rewards)
    next_advantage = torch.zeros_like(bootstrap_value)  # A_T = 0
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        # where, not a multiply by (1 - done): a NaN/inf in the next episode must not leak through 0 * inf.
        carried = torch.where(done[t], torch.zeros_like(next_advantage), next_advantage)
        next_advantage = delta + gamma * lam * carried
        advantages[t] = next_advantage
    return advantages, advantages + values


def vtrace_reference(
    behavior_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor | None,
    gamma: float,
    lam: float,
    rho_clip: float,
    c_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (Espeholt et al. 2018, eq. 1 and remark 1 for lambda); returns ``(pg_advantages, vs)``, ``[T, B]``.

    ``rho_t = min(rho_clip, pi/mu)``, ``c_t = lam * min(c_clip, pi/mu)``,
    ``vs_t - V_t = rho_t * delta_t + gamma * c_t * (1 - done_t) * (vs_{t+1} - V_{t+1})`` with ``vs_T - V_T = 0``,
    ``pg_adv_t = rho_t * (r_t + gamma * next_vs_t - V_t)`` where ``next_vs_t = vs_{t+1}`` inside an episode and
    ``next_value_t`` at a done step or at ``t == T-1``.
    """
    num_steps = rewards.shape[0]
    next_values = next_values_reference(values, bootstrap_value, terminated, truncated, truncation_values)
    done = terminated | truncated
    ratio = torch.exp(target_logp - behavior_logp)
    rho = torch.clamp(ratio, max=rho_clip)
    c = lam * torch.clamp(ratio, max=c_clip)
    vs = torch.empty_like(rewards)
    pg_advantages = torch.empty_like(rewards)
    vs_minus_v = torch.zeros_like(bootstrap_value)  # vs_T - V_T = 0
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        if t == num_steps - 1:
            next_vs = next_values[t]
        else:
            next_vs = torch.where(done[t], next_values[t], vs[t + 1])
        pg_advantages[t] = rho[t] * (rewards[t] + gamma * next_vs - values[t])
        carried = torch.where(done[t], torch.zeros_like(vs_minus_v), vs_minus_v)
        vs_minus_v = rho[t] * delta + gamma * c[t] * carried
        vs[t] = values[t] + vs_minus_v
    return pg_advantages, vs
