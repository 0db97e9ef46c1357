"""Numba CPU kernels for GAE and V-trace on time-major ``[T, B]`` numpy arrays (the ``"numba"`` backend).

Owns the jitted loops and the thread/chunk policy; inputs arrive validated and C-contiguous from
``advantages.py``, outputs are written into caller-allocated arrays. Equations and episode rules are exactly those
of ``_reference.py`` (same operation order, so float64 results match it to rounding).

Layout: ``[T, B]`` row-major keeps B contiguous, so each thread owns a chunk of columns and walks time backwards
row by row; the inner loop over the chunk's columns is unit-stride and vectorises.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, uint64

# PERF: columns per parallel work item. 1024 float32 columns x 7 arrays ~ 28 KiB per row, so the row t+1 a chunk
# just wrote is still in L1/L2 when row t reads it. 256..4096 measured within noise at T=64, B=8192.
CHUNK_COLUMNS = 1024
# PERF: below this many elements one thread finishes before a second one wakes up (and on a loaded machine a
# parallel region waits for a descheduled worker: 20x slower measured with both cores busy); run serially.
MIN_PARALLEL_ELEMENTS = 1 << 16


@njit(cache=True, inline="always")
def _gae_block(
    rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets, b0, b1
):
    # PERF: b0/b1 are uint64 so numba drops its negative-index wraparound selects; with them LLVM would not
    # vectorise the inner loop (measured 2x slower single-threaded).
    num_steps = rewards.shape[0]
    zero = gamma - gamma  # a zero of the input dtype: a float64 literal would promote float32 math
    gamma_lam = gamma * lam
    t = num_steps - 1
    for b in range(b0, b1):
        # Every load is unconditional and the branches are pure selects, so the loop if-converts and vectorises;
        # truncation_values may hold poison (NaN) where not truncated, and a select never reads it into the sum.
        next_value = truncation_values[t, b] if truncated[t, b] else bootstrap_value[b]
        next_value = zero if terminated[t, b] else next_value
        value = values[t, b]
        advantage = rewards[t, b] + gamma * next_value - value
        adv[t, b] = advantage
        targets[t, b] = advantage + value
    for t in range(num_steps - 2, -1, -1):
        for b in range(b0, b1):
            is_terminated = terminated[t, b]
            is_truncated = truncated[t, b]
            truncation_value = truncation_values[t, b]
            value_after = values[t + 1, b]
            advantage_after = adv[t + 1, b]
            next_value = truncation_value if is_truncated else value_after
            next_value = zero if is_terminated else next_value
            carried = zero if (is_terminated or is_truncated) else advantage_after
            value = values[t, b]
            advantage = rewards[t, b] + gamma * next_value - value + gamma_lam * carried
            adv[t, b] = advantage
            targets[t, b] = advantage + value


@njit(cache=True, inline="always")
def _vtrace_block(
    behavior_logp,
    target_logp,
    rewards,
    values,
    bootstrap_value,
    terminated,
    truncated,
    truncation_values,
    gamma,
    lam,
    rho_clip,
    c_clip,
    pg_adv,
    vs,
    vs_minus_v,
    b0,
    b1,
):
    num_steps = rewards.shape[0]
    zero = gamma - gamma
    for t in range(num_steps - 1, -1, -1):
        last = t == num_steps - 1
        row_after = t if last else t + 1  # a valid row to load from at T-1; its values are then discarded
        for b in range(b0, b1):
            is_terminated = terminated[t, b]
            is_truncated = truncated[t, b]
            is_done = is_terminated or is_truncated
            truncation_value = truncation_values[t, b]
            value_after = bootstrap_value[b] if last else values[row_after, b]
            vs_after = vs[row_after, b]
            next_value = truncation_value if is_truncated else value_after
            next_value = zero if is_terminated else next_value
            # vs_minus_v[b] holds vs_{t+1} - V_{t+1} of this column (0 at T-1: set by the caller).
            carried = zero if is_done else vs_minus_v[b]
            next_vs = next_value if (is_done or last) else vs_after
            ratio = np.exp(target_logp[t, b] - behavior_logp[t, b])
            rho = rho_clip if ratio > rho_clip else ratio
            c = lam * (c_clip if ratio > c_clip else ratio)
            value = values[t, b]
            reward = rewards[t, b]
            delta = reward + gamma * next_value - value
            pg_adv[t, b] = rho * (reward + gamma * next_vs - value)
            x = rho * delta + gamma * c * carried
            vs_minus_v[b] = x
            vs[t, b] = value + x


def _gae_chunks(
    rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets, chunk
):
    num_columns = rewards.shape[1]
    num_chunks = (num_columns + chunk - 1) // chunk
    for chunk_idx in prange(num_chunks):
        b0 = uint64(chunk_idx * chunk)
        b1 = uint64(min(chunk_idx * chunk + chunk, num_columns))
        _gae_block(
            rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets, b0, b1
        )


def _vtrace_chunks(
    behavior_logp,
    target_logp,
    rewards,
    values,
    bootstrap_value,
    terminated,
    truncated,
    truncation_values,
    gamma,
    lam,
    rho_clip,
    c_clip,
    pg_adv,
    vs,
    vs_minus_v,
    chunk,
):
    num_columns = rewards.shape[1]
    num_chunks = (num_columns + chunk - 1) // chunk
    for chunk_idx in prange(num_chunks):
        b0 = uint64(chunk_idx * chunk)
        b1 = uint64(min(chunk_idx * chunk + chunk, num_columns))
        _vtrace_block(
            behavior_logp,
            target_logp,
            rewards,
            values,
            bootstrap_value,
            terminated,
            truncated,
            truncation_values,
            gamma,
            lam,
            rho_clip,
            c_clip,
            pg_adv,
            vs,
            vs_minus_v,
            b0,
            b1,
        )


# The same loops compiled twice: prange is a plain range in the serial build (no thread-pool round trip).
_gae_parallel = njit(parallel=True, cache=True)(_gae_chunks)
_gae_serial = njit(cache=True)(_gae_chunks)
_vtrace_parallel = njit(parallel=True, cache=True)(_vtrace_chunks)
_vtrace_serial = njit(cache=True)(_vtrace_chunks)


def _use_parallel(num_elements: int, num_threads: int | None) -> bool:
    """Parallel build only when there is enough work and more than one thread; sets numba's thread count."""
    threads = (
        numba.config.NUMBA_NUM_THREADS if num_threads is None else min(num_threads, numba.config.NUMBA_NUM_THREADS)
    )
    if threads <= 1 or num_elements < MIN_PARALLEL_ELEMENTS:
        return False
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)  # per calling thread, cheap
    return True


def gae_numba(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    truncation_values: np.ndarray,
    gamma: float,
    lam: float,
    adv: np.ndarray,
    targets: np.ndarray,
    num_threads: int | None = None,
) -> None:
    """Write GAE advantages and value targets into ``adv``/``targets`` (all ``[T, B]``, one float dtype, C order).

    ``truncation_values`` must be an array of the same shape even when nothing is truncated (pass ``values``: it is
    then never selected). ``num_threads`` caps the threads (None: numba's default, ``NUMBA_NUM_THREADS``).
    """
    scalar = rewards.dtype.type
    kernel = _gae_parallel if _use_parallel(rewards.size, num_threads) else _gae_serial
    kernel(
        rewards,
        values,
        bootstrap_value,
        terminated,
        truncated,
        truncation_values,
        scalar(gamma),
        scalar(lam),
        adv,
        targets,
        CHUNK_COLUMNS,
    )


def vtrace_numba(
    behavior_logp: np.ndarray,
    target_logp: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    truncation_values: np.ndarray,
    gamma: float,
    lam: float,
    rho_clip: float,
    c_clip: float,
    pg_adv: np.ndarray,
    vs: np.ndarray,
    num_threads: int | None = None,
) -> None:
    """Write V-trace policy-gradient advantages and ``vs`` targets into ``pg_adv``/``vs``; see ``gae_numba``."""
    scalar = rewards.dtype.type
    vs_minus_v = np.zeros(rewards.shape[1], dtype=rewards.dtype)  # vs_T - V_T = 0
    kernel = _vtrace_parallel if _use_parallel(rewards.size, num_threads) else _vtrace_serial
    kernel(
        behavior_logp,
        target_logp,
        rewards,
        values,
        bootstrap_value,
        terminated,
        truncated,
        truncation_values,
        scalar(gamma),
        scalar(lam),
        scalar(rho_clip),
        scalar(c_clip),
        pg_adv,
        vs,
        vs_minus_v,
        CHUNK_COLUMNS,
    )
