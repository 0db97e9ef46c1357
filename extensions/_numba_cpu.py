"""Numba CPU kernels for GAE and V-trace on time-major ``[T, B]`` numpy arrays (the ``"numba"`` backend).

Owns the jitted loops and the thread/chunk policy; inputs arrive validated and C-contiguous from
``advantages.py``, outputs are written into caller-allocated arrays. The per-element maths is ``_elementwise.py``'s
(shared with the CUDA kernels, inlined here): the equations and episode rules of ``_reference.py`` in the same
operation order, so float64 results match it to rounding.

Layout: ``[T, B]`` row-major keeps B contiguous, so each thread owns a chunk of columns and walks time backwards
row by row; the inner loop over the chunk's columns is unit-stride and vectorises.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types, uint64
from numba.extending import intrinsic, overload

from . import _elementwise
from ._elementwise import episode_cut, gae_step, vtrace_step

_elementwise.drop_stale_cache(__file__)  # before any kernel is loaded from the cache

# PERF: columns per parallel work item. 1024 float32 columns x 7 arrays ~ 28 KiB per row, so the row t+1 a chunk
# just wrote is still in L1/L2 when row t reads it. 256..4096 measured within noise at T=64, B=8192.
CHUNK_COLUMNS = 1024
# PERF: below this many elements one thread finishes before a second one wakes up (and on a loaded machine a
# parallel region waits for a descheduled worker: 20x slower measured with both cores busy); run serially.
MIN_PARALLEL_ELEMENTS = 1 << 16


# ---------------------------------------------------------------------------------------------------------------
# A vectorisable exp. PERF: numba calls libm's scalar exp (no SVML in this numba build), ~3.4 ns per element and
# a call that keeps LLVM from vectorising the loop around it. This branch-free version (Cody-Waite reduction,
# Taylor polynomial, exponent built from bits) vectorises in a loop of its own: 0.38 ms vs 1.7 ms for 512k float32
# exps on one core. Accuracy: <= 1.2 ulp against np.exp (tested); overflow gives inf, underflow 0, NaN stays NaN.


@intrinsic
def _bits_to_float32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@intrinsic
def _bits_to_float64(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


def _exp_float32(x):
    hi = np.float32(88.72283)  # ln(FLT_MAX)
    lo = np.float32(-104.0)  # below ln(smallest subnormal): exp is 0
    inside = x >= lo and x <= hi
    xs = x if inside else np.float32(0.0)  # out-of-range (and NaN) lanes compute exp(0) and are replaced below
    n = np.floor(xs * np.float32(1.4426950408889634) + np.float32(0.5))
    r = xs - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)  # ln 2 split (Cephes): n * hi is exact
    p = np.float32(1.0 / 5040.0)  # Taylor to r^7: |r| <= 0.35, truncation error 5e-9 relative
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    # 2^n as 2^(n//2) * 2^(n - n//2): both halves are normal floats for every n in range (-150..128), so the
    # largest results do not overflow early and subnormal results round once, in the last multiply.
    k = np.int32(n)
    half = k >> np.int32(1)
    scale_a = _bits_to_float32((half + np.int32(127)) << np.int32(23))
    scale_b = _bits_to_float32((k - half + np.int32(127)) << np.int32(23))
    out = p * scale_a * scale_b
    out = out if inside else (np.float32(np.inf) if x > hi else np.float32(0.0))
    return x if x != x else out


def _exp_float64(x):
    hi = 709.782712893384  # ln(DBL_MAX)
    lo = -746.0  # below ln(smallest subnormal): exp is 0
    inside = x >= lo and x <= hi
    xs = x if inside else 0.0
    n = np.floor(xs * 1.4426950408889634 + 0.5)
    r = xs - n * 6.93147180369123816490e-01 - n * 1.90821492927058770002e-10  # ln 2 split (fdlibm)
    p = 1.0 / 6227020800.0  # Taylor to r^13: |r| <= 0.35, truncation error 4e-18 relative
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    k = np.int64(n)
    half = k >> np.int64(1)
    scale_a = _bits_to_float64((half + np.int64(1023)) << np.int64(52))
    scale_b = _bits_to_float64((k - half + np.int64(1023)) << np.int64(52))
    out = p * scale_a * scale_b
    out = out if inside else (np.inf if x > hi else 0.0)
    return x if x != x else out


def fast_exp(x):
    """exp for numba-jitted code (float32 or float64 in, same out); see the comment above."""
    return math.exp(x)


@overload(fast_exp)
def _fast_exp_overload(x):
    if x == types.float32:
        return _exp_float32
    if x == types.float64:
        return _exp_float64
    return None


@njit(cache=True)
def fast_exp_array(x, out):
    """``out[i] = fast_exp(x[i])`` over 1-D arrays: the testable face of ``fast_exp``."""
    for i in range(x.shape[0]):
        out[i] = fast_exp(x[i])


# ---------------------------------------------------------------------------------------------------------------
# The kernels. Arguments travel as tuples in the public functions' order: arrays (``[T, B]`` except
# bootstrap_value ``[B]``), scalars of the arrays' dtype, outputs, then ``scratch``, a zeroed ``[B]`` row.

_episode_cut = njit(inline="always")(episode_cut)
_gae_step = njit(inline="always")(gae_step)
_vtrace_step = njit(inline="always")(vtrace_step)


@njit(cache=True, inline="always")
def _gae_block(arrays, scalars, outputs, scratch, b0, b1):
    # PERF: b0/b1 are uint64 so numba drops its negative-index wraparound selects; with them LLVM would not
    # vectorise the inner loop (measured 2x slower single-threaded).
    rewards, values, bootstrap_value, terminated, truncated, truncation_values = arrays
    gamma, lam = scalars
    adv, targets = outputs
    zero = gamma - gamma  # a zero of the input dtype: a float64 literal would promote float32 math
    gamma_lam = gamma * lam
    last = rewards.shape[0] - 1
    for t in range(last, -1, -1):
        # Row t+1 of V and A; at t == T-1 the bootstrap value and A_T = 0 (scratch is all zeros). PERF: row T-1 runs
        # through the same loop, whose vector body is the same 21 instructions per 8 float32 columns (asm compared)
        # as before row T-1 was folded in; its peeled loop of the earlier version compiled to gathers.
        values_after = bootstrap_value if t == last else values[t + 1]
        adv_after = scratch if t == last else adv[t + 1]
        for b in range(b0, b1):
            # Every load is unconditional and _episode_cut's branches are selects, so the loop if-converts and
            # vectorises; truncation_values may hold poison (NaN) where not truncated and is never selected there.
            value = values[t, b]
            next_value, carried = _episode_cut(
                terminated[t, b], truncated[t, b], truncation_values[t, b], values_after[b], adv_after[b], zero
            )
            advantage = _gae_step(rewards[t, b], value, next_value, carried, gamma, gamma_lam)
            adv[t, b] = advantage
            targets[t, b] = advantage + value


@njit(cache=True, inline="always")
def _vtrace_block(arrays, scalars, outputs, scratch, b0, b1):
    # Same loop as _gae_block. PERF: the importance ratios of a row go through fast_exp in a loop of their own
    # into an L1-sized buffer: inlined into the main loop, the vectoriser gave up on it (2x slower than libm exp);
    # split, the kernel is 2x faster than with libm (1.8 vs 3.5 ms, T=64, B=8192, one core). scratch[b] carries
    # vs_{t+1} - V_{t+1} of column b from one row to the next (zeros on entry: vs_T - V_T = 0).
    behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values = arrays
    gamma, lam, rho_clip, c_clip = scalars
    pg_adv, vs = outputs
    zero = gamma - gamma
    last = rewards.shape[0] - 1
    ratios = np.empty(b1 - b0, dtype=rewards.dtype)
    for t in range(last, -1, -1):
        values_after = bootstrap_value if t == last else values[t + 1]
        for b in range(b0, b1):
            ratios[b - b0] = fast_exp(target_logp[t, b] - behavior_logp[t, b])
        for b in range(b0, b1):
            value = values[t, b]
            next_value, carried = _episode_cut(
                terminated[t, b], truncated[t, b], truncation_values[t, b], values_after[b], scratch[b], zero
            )
            pg, x = _vtrace_step(
                ratios[b - b0], rewards[t, b], value, next_value, carried, gamma, lam, rho_clip, c_clip
            )
            pg_adv[t, b] = pg
            scratch[b] = x
            vs[t, b] = value + x


@njit(cache=True, inline="always")
def _chunk_columns(chunk_idx, chunk, num_columns):
    """Columns ``[b0, b1)`` of one work item, as uint64 (see _gae_block)."""
    return uint64(chunk_idx * chunk), uint64(min(chunk_idx * chunk + chunk, num_columns))


# Each thread owns a chunk of columns. The same two drivers compiled twice: prange is a plain range in the serial
# build (no thread-pool round trip).
def _gae_chunks(arrays, scalars, outputs, scratch, chunk):
    for chunk_idx in prange((scratch.shape[0] + chunk - 1) // chunk):
        b0, b1 = _chunk_columns(chunk_idx, chunk, scratch.shape[0])
        _gae_block(arrays, scalars, outputs, scratch, b0, b1)


def _vtrace_chunks(arrays, scalars, outputs, scratch, chunk):
    for chunk_idx in prange((scratch.shape[0] + chunk - 1) // chunk):
        b0, b1 = _chunk_columns(chunk_idx, chunk, scratch.shape[0])
        _vtrace_block(arrays, scalars, outputs, scratch, b0, b1)


_GAE_KERNELS = (njit(parallel=True, cache=True)(_gae_chunks), njit(cache=True)(_gae_chunks))
_VTRACE_KERNELS = (njit(parallel=True, cache=True)(_vtrace_chunks), njit(cache=True)(_vtrace_chunks))


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


def _launch(
    kernels: tuple, arrays: tuple, scalars: tuple, outputs: tuple[np.ndarray, np.ndarray], num_threads: int | None
) -> None:
    """Run the parallel or the serial build of a kernel pair; the scalars are cast to the arrays' dtype."""
    dtype = outputs[0].dtype
    # One zeroed [B] row per call (32 KiB at B=8192 float32, next to the ~12 MB a GAE call reads and writes).
    scratch = np.zeros(outputs[0].shape[1], dtype=dtype)
    parallel, serial = kernels
    kernel = parallel if _use_parallel(outputs[0].size, num_threads) else serial
    kernel(arrays, tuple(dtype.type(x) for x in scalars), outputs, scratch, CHUNK_COLUMNS)


def gae_numba(
    rewards: np.ndarray, values: np.ndarray, bootstrap_value: np.ndarray, terminated: np.ndarray,
    truncated: np.ndarray, truncation_values: np.ndarray, gamma: float, lam: float,
    adv: np.ndarray, targets: np.ndarray, num_threads: int | None = None,
) -> None:  # fmt: skip
    """Write GAE advantages and value targets into ``adv``/``targets`` (all ``[T, B]``, one float dtype, C order).

    ``truncation_values`` must be an array of the same shape even when nothing is truncated (pass ``values``: it is
    then never selected). ``num_threads`` caps the threads (None: numba's default, ``NUMBA_NUM_THREADS``).
    """
    arrays = (rewards, values, bootstrap_value, terminated, truncated, truncation_values)
    _launch(_GAE_KERNELS, arrays, (gamma, lam), (adv, targets), num_threads)


def vtrace_numba(
    behavior_logp: np.ndarray, target_logp: np.ndarray, rewards: np.ndarray, values: np.ndarray,
    bootstrap_value: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, truncation_values: np.ndarray,
    gamma: float, lam: float, rho_clip: float, c_clip: float,
    pg_adv: np.ndarray, vs: np.ndarray, num_threads: int | None = None,
) -> None:  # fmt: skip
    """Write V-trace policy-gradient advantages and ``vs`` targets into ``pg_adv``/``vs``; see ``gae_numba``."""
    arrays = (behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values)
    _launch(_VTRACE_KERNELS, arrays, (gamma, lam, rho_clip, c_clip), (pg_adv, vs), num_threads)
