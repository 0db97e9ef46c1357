"""The APPO loss pieces as pure functions: PPO clipped surrogate, (clipped) value loss, KL estimate, statistics.

No state, no modules, no optimisers: every function takes flat tensors ``[N]`` and returns scalars, so each can be
checked by hand (``tests/test_learner.py``, ``tests/test_losses.py``). ``mask`` arguments are ``[N]`` bool: True
marks samples that count (policy-lag masking); ``None`` means all count. Masked-out entries may hold anything, NaN
included: they are removed with ``torch.where``, never multiplied by zero. The loss terms also take per-sample
``weights`` ``[N]`` (replay's IS weights, sample_fast.replay); ``None`` is the plain mean, bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor | None, weights: Tensor | None = None) -> Tensor:
    """Mean of ``x`` ``[N]`` (times ``weights`` ``[N]`` when given) over ``mask`` ``[N]`` bool; 0 when nothing is
    selected. Returns a 0-dim tensor.

    With weights: ``sum(w x) / count`` over the mask, the count of selected samples (not ``sum(w)``). A zero weight
    removes a finite sample (``0 * NaN`` is NaN: mask out samples that may be non-finite).
    """
    if weights is not None:
        x = weights * x
    if mask is None:
        return x.mean()
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    return total / mask.sum().clamp(min=1).to(x.dtype)


def ppo_clip_loss(
    target_logp: Tensor,
    behavior_logp: Tensor,
    advantages: Tensor,
    clip_eps: float,
    mask: Tensor | None = None,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), optionally dual-clipped, to minimise.

    Args:
        target_logp: ``[N]`` float32, log pi(a|s) under the policy being trained (differentiable).
        behavior_logp: ``[N]`` float32, log mu(a|s) under the policy that acted.
        advantages: ``[N]`` float32, e.g. V-trace policy-gradient advantages (treated as constants).
        clip_eps: the ratio is clipped to ``[1 - clip_eps, 1 + clip_eps]``.
        mask: ``[N]`` bool or None.
        dual_clip: if set (> 1, e.g. 3), where ``A < 0`` the objective is bounded below by ``dual_clip * A``
            (Ye et al. 2020, "Mastering complex control in MOBA games", eq. 5): with a stale behaviour policy r can
            be huge, and for A < 0 the plain PPO objective ``r A`` is not clipped, so one sample could dominate.
        weights: ``[N]`` float32 per-sample weights (treated as constants) or None (all 1).

    Returns:
        ``(loss, clip_frac, ratio)``: loss ``= -mean(w * min(r A, clip(r) A))`` with ``r = exp(target_logp -
        behavior_logp)``; clip_frac = fraction of samples where ``|r - 1| > clip_eps`` (unweighted: a diagnostic);
        ratio ``[N]``.
    """
    advantages = advantages.detach()
    ratio = torch.exp(target_logp - behavior_logp)
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    objective = torch.minimum(surrogate, clipped)
    if dual_clip is not None:
        objective = torch.where(advantages < 0, torch.maximum(objective, dual_clip * advantages), objective)
    loss = -masked_mean(objective, mask, weights.detach() if weights is not None else None)
    clip_frac = masked_mean(((ratio - 1.0).abs() > clip_eps).to(ratio.dtype), mask)
    return loss, clip_frac.detach(), ratio


def value_loss(
    values: Tensor,
    value_targets: Tensor,
    old_values: Tensor | None = None,
    clip_eps: float | None = None,
    mask: Tensor | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """Squared-error value loss ``0.5 * mean(w * (V - target)^2)``, optionally clipped as in PPO2.

    Args:
        values: ``[N]`` float32, the critic's current predictions (differentiable).
        value_targets: ``[N]`` float32, e.g. V-trace ``vs`` (treated as constants).
        old_values: ``[N]`` float32, predictions when the targets were computed; needed with ``clip_eps``.
        clip_eps: if set, ``V_clip = old + clamp(V - old, -clip_eps, clip_eps)`` and the loss per sample is
            ``0.5 * max((V - target)^2, (V_clip - target)^2)``.
        mask: ``[N]`` bool or None.
        weights: ``[N]`` float32 per-sample weights (treated as constants) or None (all 1).
    """
    value_targets = value_targets.detach()
    err = (values - value_targets).square()
    if clip_eps is not None:
        if old_values is None:
            raise ValueError("value_loss: clip_eps needs old_values (the predictions the targets were built with)")
        old_values = old_values.detach()
        v_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        err = torch.maximum(err, (v_clipped - value_targets).square())
    return 0.5 * masked_mean(err, mask, weights.detach() if weights is not None else None)


def approx_kl(
    target_logp: Tensor, behavior_logp: Tensor, mask: Tensor | None = None, weights: Tensor | None = None
) -> Tensor:
    """Sample estimate of KL(mu || pi) from actions drawn from mu: ``mean(w * ((r - 1) - log r))``, ``r = pi/mu``.

    The "k3" estimator (Schulman, "Approximating KL divergence", 2020): unbiased and never negative per sample.
    ``target_logp``/``behavior_logp`` are ``[N]`` float32; differentiable in ``target_logp`` (used as a penalty).
    ``weights`` ``[N]`` (constants) or None (all 1).
    """
    log_ratio = target_logp - behavior_logp
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask, weights.detach() if weights is not None else None)


def normalize_advantages(advantages: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """``(A - mean) / (std + eps)`` over the masked entries of ``advantages`` ``[N]`` (population std)."""
    mean = masked_mean(advantages, mask)
    var = masked_mean((advantages - mean).square(), mask)
    return (advantages - mean) / (var.sqrt() + eps)


def explained_variance(predictions: Tensor, targets: Tensor, mask: Tensor | None = None) -> Tensor:
    """``1 - Var(targets - predictions) / Var(targets)`` over the masked entries of ``[N]`` tensors.

    1 is a perfect critic, 0 is no better than a constant, negative is worse. NaN when the targets are constant.
    """
    t_mean = masked_mean(targets, mask)
    var_t = masked_mean((targets - t_mean).square(), mask)
    resid = targets - predictions
    r_mean = masked_mean(resid, mask)
    var_r = masked_mean((resid - r_mean).square(), mask)
    return 1.0 - var_r / var_t
