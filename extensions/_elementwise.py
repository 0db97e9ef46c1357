"""Per-element maths of GAE and V-trace, written once for both numba backends.

Plain Python on scalars: ``_numba_cpu.py`` compiles these functions with ``numba.njit(inline="always")`` into its
vectorised row loops, ``_numba_cuda.py`` with ``numba.cuda.jit(device=True)`` into its one-thread-per-column
kernels (numba's CUDA simulator runs them as they are). The equations are those of ``_reference.py`` in its
operation order, so float64 results match it to rounding. Nothing here imports numba or holds a float literal:
a float64 literal would promote float32 arithmetic, so every zero comes in as ``zero`` of the input dtype.

numba's on-disk cache checks only the file of the jitted kernel, not this one, so both kernel modules call
``drop_stale_cache`` on import; with ``NUMBA_CACHE_DIR`` set elsewhere, delete that cache after editing this file.
"""

from __future__ import annotations

import glob
import os


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


def drop_stale_cache(module_file: str, dependency_file: str = __file__) -> int:
    """Delete numba's on-disk cache entries of ``module_file`` older than ``dependency_file``; return how many.

    numba's cache index checks only the jitted function's own file, so without this an edit of this file (inlined
    into every kernel of ``_numba_cpu.py`` and ``_numba_cuda.py``) would keep running the old maths from the cache.
    Both modules call it on import, before any kernel is loaded.
    Covers numba's default cache location (``__pycache__`` beside the module). Races with another process doing
    the same are harmless: a missing entry is recompiled.
    """
    try:
        dependency_mtime = os.path.getmtime(dependency_file)
    except OSError:
        return 0
    stem = os.path.splitext(os.path.basename(module_file))[0]
    pattern = os.path.join(os.path.dirname(module_file), "__pycache__", f"{stem}.*.nb[ic]")
    dropped = 0
    for path in glob.glob(pattern):
        try:
            if os.path.getmtime(path) < dependency_mtime:
                os.remove(path)
                dropped += 1
        except OSError:
            pass
    return dropped
