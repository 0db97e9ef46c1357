"""Numba CUDA kernels for GAE and V-trace (the ``"cuda"`` backend): one thread per env column, time walked backwards.

Owns the kernels and their launch. ``gae_cuda``/``vtrace_cuda`` take torch CUDA tensors (validated, contiguous, by
``advantages.py``), view them through ``__cuda_array_interface__`` without a copy, and launch on torch's current
stream, so the call is ordered with the surrounding torch work and never syncs the host. The ``launch_*`` functions
take anything numba accepts as a kernel argument (device arrays, or numpy arrays under ``NUMBA_ENABLE_CUDASIM=1``),
which is how the CPU-only test suite runs these kernels in numba's CUDA simulator.
Equations and episode rules are exactly those of ``_reference.py``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numba import cuda

# PERF: one thread per column gives only B threads in all, so at small B the block size decides how many SMs
# take part: 256-thread blocks for B >= 32768 (>= 128 blocks), else 64-thread blocks to spread the columns over
# 4x more SMs. Reasoned from the occupancy model, not yet measured: `bench_advantages.py --device cuda
# --num-envs N` is the check.
THREADS_PER_BLOCK = 256
SMALL_THREADS_PER_BLOCK = 64

# numba warns on every new grid below 128 blocks; here the grid is set by the number of envs, so the warning is
# not actionable (the block size above already spreads small grids out).
warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU under-utilization")


@cuda.jit(cache=True)
def _gae_kernel(rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets):
    b = cuda.grid(1)
    num_steps, num_columns = rewards.shape
    if b >= num_columns:
        return
    zero = gamma - gamma  # zero of the input dtype: a float64 literal would promote float32 math
    gamma_lam = gamma * lam
    advantage_after = zero  # A_T = 0
    value_after = bootstrap_value[b]
    # PERF: thread b reads column b: neighbouring threads read neighbouring addresses of one row (coalesced).
    for t in range(num_steps - 1, -1, -1):
        is_terminated = terminated[t, b]
        is_truncated = truncated[t, b]
        next_value = value_after
        if is_truncated:
            next_value = truncation_values[t, b]  # only read where truncated: elsewhere it may hold poison
        if is_terminated:
            next_value = zero
        carried = zero if (is_terminated or is_truncated) else advantage_after
        value = values[t, b]
        advantage = rewards[t, b] + gamma * next_value - value + gamma_lam * carried
        adv[t, b] = advantage
        targets[t, b] = advantage + value
        advantage_after = advantage
        value_after = value


@cuda.jit(cache=True)
def _vtrace_kernel(
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
):
    b = cuda.grid(1)
    num_steps, num_columns = rewards.shape
    if b >= num_columns:
        return
    zero = gamma - gamma
    vs_minus_v_after = zero  # vs_T - V_T = 0
    value_after = bootstrap_value[b]
    vs_after = value_after
    for t in range(num_steps - 1, -1, -1):
        is_terminated = terminated[t, b]
        is_truncated = truncated[t, b]
        is_done = is_terminated or is_truncated
        next_value = value_after
        if is_truncated:
            next_value = truncation_values[t, b]
        if is_terminated:
            next_value = zero
        carried = zero if is_done else vs_minus_v_after
        # At T-1, vs_after is the bootstrap value itself, so next_vs == next_value there without a special case.
        next_vs = next_value if is_done else vs_after
        ratio = math.exp(target_logp[t, b] - behavior_logp[t, b])
        rho = rho_clip if ratio > rho_clip else ratio
        c = lam * (c_clip if ratio > c_clip else ratio)
        value = values[t, b]
        reward = rewards[t, b]
        delta = reward + gamma * next_value - value
        pg_adv[t, b] = rho * (reward + gamma * next_vs - value)
        vs_minus_v = rho * delta + gamma * c * carried
        vs_t = value + vs_minus_v
        vs[t, b] = vs_t
        vs_minus_v_after = vs_minus_v
        value_after = value
        vs_after = vs_t


def _launch_shape(num_columns: int) -> tuple[int, int]:
    """(blocks, threads per block) covering num_columns with one thread each."""
    threads = THREADS_PER_BLOCK if num_columns >= 128 * THREADS_PER_BLOCK else SMALL_THREADS_PER_BLOCK
    return max(1, (num_columns + threads - 1) // threads), threads


def launch_gae(
    rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets, stream=0
):
    """Launch the GAE kernel on numba-accepted arrays (all ``[T, B]`` except ``bootstrap_value`` ``[B]``)."""
    scalar = np.dtype(rewards.dtype).type
    blocks, threads = _launch_shape(rewards.shape[1])
    _gae_kernel[blocks, threads, stream](
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
    )


def launch_vtrace(
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
    stream=0,
):
    """Launch the V-trace kernel on numba-accepted arrays; see ``launch_gae``."""
    scalar = np.dtype(rewards.dtype).type
    blocks, threads = _launch_shape(rewards.shape[1])
    _vtrace_kernel[blocks, threads, stream](
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
    )


def _device_view(tensor):
    # sync=False: the kernel runs on the tensor's own (current) stream, so waiting on that stream first is redundant.
    return cuda.as_cuda_array(tensor.detach(), sync=False)


def _torch_stream(device):
    import torch

    # torch's current stream on the tensors' device: the kernel is ordered after whatever produced the inputs.
    return cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)


def gae_cuda(
    rewards, values, bootstrap_value, terminated, truncated, truncation_values, gamma, lam, adv, targets
) -> None:
    """GAE on torch CUDA tensors, written into ``adv``/``targets``, queued on torch's current stream."""
    with cuda.gpus[rewards.device.index]:  # numba's context must be the tensors' device
        views = [_device_view(x) for x in (rewards, values, bootstrap_value, terminated, truncated, truncation_values)]
        launch_gae(*views, gamma, lam, _device_view(adv), _device_view(targets), stream=_torch_stream(rewards.device))


def vtrace_cuda(
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
) -> None:
    """V-trace on torch CUDA tensors, written into ``pg_adv``/``vs``, queued on torch's current stream."""
    inputs = (behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated, truncation_values)
    with cuda.gpus[rewards.device.index]:
        views = [_device_view(x) for x in inputs]
        launch_vtrace(
            *views,
            gamma,
            lam,
            rho_clip,
            c_clip,
            _device_view(pg_adv),
            _device_view(vs),
            stream=_torch_stream(rewards.device),
        )
