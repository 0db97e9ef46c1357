"""Numba CUDA kernels for GAE and V-trace (the ``"cuda"`` backend): one thread per env column, time walked backwards.

Owns the kernels and their launch. ``launch_gae``/``launch_vtrace`` take anything numba accepts as a kernel argument
(device arrays, or numpy arrays under ``NUMBA_ENABLE_CUDASIM=1``, which is how the CPU-only test suite runs these
kernels in numba's CUDA simulator); ``launch_on_torch`` runs either on torch CUDA tensors (validated, contiguous, by
``advantages.py``), viewed through ``__cuda_array_interface__`` without a copy and queued on torch's current stream,
so the call is ordered with the surrounding torch work and never syncs the host.
The per-element maths is ``_elementwise.py``'s, shared with the CPU kernels.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
from numba import cuda

from . import _elementwise
from ._elementwise import episode_cut, gae_step, vtrace_step

_elementwise.drop_stale_cache(__file__)  # before any kernel is loaded from the cache

# PERF: one thread per column gives only B threads in all, so at small B the block size decides how many SMs
# take part: 256-thread blocks for B >= 32768 (>= 128 blocks), else 64-thread blocks to spread the columns over
# 4x more SMs. Reasoned from the occupancy model, not yet measured: `bench_advantages.py --device cuda
# --num-envs N` is the check.
THREADS_PER_BLOCK = 256
SMALL_THREADS_PER_BLOCK = 64

# numba warns on every new grid below 128 blocks; here the grid is set by the number of envs, so the warning is
# not actionable (the block size above already spreads small grids out).
warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-utilization")


_episode_cut = cuda.jit(device=True)(episode_cut)
_gae_step = cuda.jit(device=True)(gae_step)
_vtrace_step = cuda.jit(device=True)(vtrace_step)


@cuda.jit(device=True)
def _next_value_carried(terminated, truncated, truncation_values, t, b, value_after, carried_after, zero):
    """``episode_cut`` of element ``[t, b]``, reading ``truncation_values[t, b]`` only where truncated."""
    is_truncated = truncated[t, b]
    # Read only where truncated (elsewhere it may hold poison). PERF: a predicated load, so rows without truncation
    # do not pay its memory traffic (reasoned, not measured; the CPU kernels load it unconditionally to vectorise).
    truncation_value = truncation_values[t, b] if is_truncated else zero
    return _episode_cut(terminated[t, b], is_truncated, truncation_value, value_after, carried_after, zero)


# The kernels take tuples in the launch functions' order: arrays, scalars (of the arrays' dtype), outputs. Thread b
# owns column b and walks time backwards with A_{t+1} (or vs_{t+1} - V_{t+1}) and V_{t+1} in registers.
# PERF: thread b reads column b: neighbouring threads read neighbouring addresses of one row (coalesced).


@cuda.jit(cache=True)
def _gae_kernel(arrays, scalars, outputs):
    rewards, values, bootstrap_value, terminated, truncated, truncation_values = arrays
    gamma, lam = scalars
    adv, targets = outputs
    b = cuda.grid(1)
    if b >= rewards.shape[1]:
        return
    zero = gamma - gamma  # zero of the input dtype: a float64 literal would promote float32 math
    gamma_lam = gamma * lam
    advantage_after = zero  # A_T = 0
    value_after = bootstrap_value[b]
    for t in range(rewards.shape[0] - 1, -1, -1):
        value = values[t, b]
        next_value, carried = _next_value_carried(
            terminated, truncated, truncation_values, t, b, value_after, advantage_after, zero
        )
        advantage = _gae_step(rewards[t, b], value, next_value, carried, gamma, gamma_lam)
        adv[t, b] = advantage
        targets[t, b] = advantage + value
        advantage_after = advantage
        value_after = value


@cuda.jit(cache=True)
def _vtrace_kernel(arrays, scalars, outputs):
    behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values = arrays
    gamma, lam, rho_clip, c_clip = scalars
    pg_adv, vs = outputs
    b = cuda.grid(1)
    if b >= rewards.shape[1]:
        return
    zero = gamma - gamma
    vs_minus_v_after = zero  # vs_T - V_T = 0
    value_after = bootstrap_value[b]
    for t in range(rewards.shape[0] - 1, -1, -1):
        value = values[t, b]
        next_value, carried = _next_value_carried(
            terminated, truncated, truncation_values, t, b, value_after, vs_minus_v_after, zero
        )
        ratio = math.exp(target_logp[t, b] - behavior_logp[t, b])
        pg, vs_minus_v = _vtrace_step(ratio, rewards[t, b], value, next_value, carried, gamma, lam, rho_clip, c_clip)
        pg_adv[t, b] = pg
        vs[t, b] = value + vs_minus_v
        vs_minus_v_after = vs_minus_v
        value_after = value


def _launch_shape(num_columns: int) -> tuple[int, int]:
    """(blocks, threads per block) covering num_columns with one thread each."""
    threads = THREADS_PER_BLOCK if num_columns >= 128 * THREADS_PER_BLOCK else SMALL_THREADS_PER_BLOCK
    return max(1, (num_columns + threads - 1) // threads), threads


def _launch(kernel, arrays: tuple, scalars: tuple, outputs: tuple, stream) -> None:
    """Launch a kernel over the columns of ``outputs`` with the scalars cast to the arrays' dtype."""
    scalar = np.dtype(outputs[0].dtype).type
    blocks, threads = _launch_shape(outputs[0].shape[1])
    kernel[blocks, threads, stream](arrays, tuple(scalar(x) for x in scalars), outputs)


def launch_gae(
    rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets, stream=0
) -> None:
    """Launch the GAE kernel on numba-accepted arrays (all ``[T, B]`` except ``bootstrap_value`` ``[B]``)."""
    arrays = (rewards, values, bootstrap_value, terminated, truncated, truncation_values)
    _launch(_gae_kernel, arrays, (gamma, lam), (adv, targets), stream)


def launch_vtrace(
    behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values,
    gamma, lam, rho_clip, c_clip, pg_adv, vs, stream=0,
) -> None:  # fmt: skip
    """Launch the V-trace kernel on numba-accepted arrays; see ``launch_gae``."""
    arrays = (behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values)
    _launch(_vtrace_kernel, arrays, (gamma, lam, rho_clip, c_clip), (pg_adv, vs), stream)


def launch_on_torch(launch: Callable[..., None], *args) -> None:
    """Run ``launch_gae`` or ``launch_vtrace`` on torch CUDA tensors (and float scalars), in their argument order.

    The tensors are viewed without a copy and the kernel is queued on torch's current stream of their device, so
    it is ordered after whatever produced the inputs and never syncs the host.
    """
    import torch

    device = next(x.device for x in args if isinstance(x, torch.Tensor))
    with cuda.gpus[device.index]:  # numba's context must be the tensors' device
        # sync=False: the kernel runs on the tensors' own (current) stream, so waiting on it first is redundant.
        views = [cuda.as_cuda_array(x.detach(), sync=False) if isinstance(x, torch.Tensor) else x for x in args]
        launch(*views, stream=cuda.external_stream(torch.cuda.current_stream(device).cuda_stream))
