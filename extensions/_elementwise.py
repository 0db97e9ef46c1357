"""Per-element maths of GAE and V-trace, written once for both numba backends.

Plain Python on scalars: ``_numba_cpu.py`` compiles these functions with ``numba.njit(inline="always")`` into its
vectorised row loops, ``_numba_cuda.py`` with ``numba.cuda.jit(device=True)`` into its one-thread-per-column
kernels (numba's CUDA simulator runs them as they are). The equations are those of ``_reference.py`` in its
operation order, so float64 results match it to rounding. Nothing here imports numba or holds a float literal:
a float64 literal would promote float32 arithmetic, so every zero comes in as ``zero`` of the input dtype.

numba's on-disk cache checks only the file of the jitted kernel, not this one: after editing this file delete the
cache (``extensions/__pycache__/*.nbi`` and ``*.nbc``, or ``NUMBA_CACHE_DIR``), or the kernels keep the old maths.
"""

from __future__ import annotations


def episode_cut(is_terminated, is_truncated, truncation_value, value_after, carried_after, zero):
    """``(next_value_t, carried_t)`` of step t, following the episode rules of ``_reference.next_values_reference``.

    ``next_value_t``: 0 where terminated, ``truncation_value`` where truncated (and not terminated), else
    ``value_after`` (``V_{t+1}``, the bootstrap value at ``t == T-1``). ``carried_t``: ``carried_after``
    (``A_{t+1}`` or ``vs_{t+1} - V_{t+1}``, 0 at ``t == T-1``) inside an episode, 0 at a done step.
    """
    # Selects, never a multiply by (1 - done): a NaN/inf in the next episode, or the poison that truncation_values
    # holds where not truncated, is never read into the sum. On the CPU the selects if-convert (loop vectorises).
    next_value = truncation_value if is_truncated else value_after
    next_value = zero if is_terminated else next_value
    carried = zero if (is_terminated or is_truncated) else carried_after
    return next_value, carried


def gae_step(reward, value, next_value, carried, gamma, gamma_lam):
    """GAE advantage ``A_t = (r_t + gamma * next_value_t - V_t) + gamma * lam * carried_t``."""
    return reward + gamma * next_value - value + gamma_lam * carried


def vtrace_step(ratio, reward, value, next_value, carried, gamma, lam, rho_clip, c_clip):
    """One V-trace element: ``(pg_adv_t, vs_t - V_t)`` from the importance ratio ``pi/mu`` of step t."""
    rho = rho_clip if ratio > rho_clip else ratio
    c = lam * (c_clip if ratio > c_clip else ratio)
    delta = reward + gamma * next_value - value
    # next_vs = vs_{t+1} = V_{t+1} + (vs_{t+1} - V_{t+1}) inside an episode, next_value at a boundary or at T-1
    # (carried is 0 there): the same sum, in the same order, as the reference's vs[t + 1], so bit-identical.
    next_vs = next_value + carried
    pg_adv = rho * (reward + gamma * next_vs - value)
    return pg_adv, rho * delta + gamma * c * carried
