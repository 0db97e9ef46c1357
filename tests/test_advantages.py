"""Tests for sample_fast.extensions: GAE and V-trace kernels against hand-computed values, the float64 torch
reference, torchrl, and identities (on-policy V-trace == GAE, no information across episode boundaries).

The numba CUDA kernels run in numba's CUDA simulator in a subprocess (NUMBA_ENABLE_CUDASIM must be set before
numba.cuda is imported); the real CUDA kernel is covered by the ``gpu``-marked test.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import sample_fast.extensions.advantages as advantages_module
import torch
from sample_fast.extensions import compute_gae, compute_vtrace
from sample_fast.extensions._numba_cpu import gae_numba, vtrace_numba
from sample_fast.extensions._reference import gae_reference, vtrace_reference

CPU_BACKENDS = ["torch", "numba"]


def make_inputs(num_steps, num_envs, *, dtype=torch.float64, p_done=0.1, seed=0, device="cpu", poison=True):
    """Random rollout with terminated/truncated patterns (some steps both: terminated wins)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    terminated = torch.rand(num_steps, num_envs, generator=gen) < p_done
    truncated = torch.rand(num_steps, num_envs, generator=gen) < p_done
    truncation_values = randn(num_steps, num_envs)
    if poison:
        # Poison where not truncated (as TrajectoryStore does): a kernel that reads it there produces NaN.
        truncation_values = torch.where(truncated, truncation_values, torch.full_like(truncation_values, math.nan))
    inputs = dict(
        behavior_logp=randn(num_steps, num_envs) * 0.7,
        target_logp=randn(num_steps, num_envs) * 0.7,
        rewards=randn(num_steps, num_envs),
        values=randn(num_steps, num_envs),
        bootstrap_value=randn(num_envs),
        terminated=terminated,
        truncated=truncated,
        truncation_values=truncation_values,
    )
    return {k: v.to(device) for k, v in inputs.items()}


def gae_args(inputs):
    keys = ("rewards", "values", "bootstrap_value", "terminated", "truncated")
    return [inputs[k] for k in keys]


def vtrace_args(inputs):
    keys = ("behavior_logp", "target_logp", "rewards", "values", "bootstrap_value", "terminated", "truncated")
    return [inputs[k] for k in keys]


def as_float64(inputs):
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


# ---------------------------------------------------------------------------------------------------------------
# Hand-computed cases


def hand_case():
    """T=5, two envs. Env 0 has a terminated step (t=1), a truncated step (t=3) and bootstraps at t=4;
    env 1 has no episode boundary. gamma = 0.5 keeps every number exact in binary."""
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [2.0, 1.0], [1.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[2.0, 0.0], [4.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    bootstrap_value = torch.tensor([4.0, 0.0], dtype=torch.float64)
    terminated = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]], dtype=torch.bool)
    truncated = torch.tensor([[0, 0], [0, 0], [0, 0], [1, 0], [0, 0]], dtype=torch.bool)
    # Only t=3 of env 0 is truncated; NaN elsewhere proves nothing else is read.
    truncation_values = torch.full((5, 2), math.nan, dtype=torch.float64)
    truncation_values[3, 0] = 6.0
    return rewards, values, bootstrap_value, terminated, truncated, truncation_values


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gae_hand_computed(backend):
    rewards, values, bootstrap_value, terminated, truncated, truncation_values = hand_case()
    adv, targets = compute_gae(
        rewards, values, bootstrap_value, terminated, truncated,
        gamma=0.5, lam=0.5, truncation_values=truncation_values, backend=backend,
    )  # fmt: skip
    # Env 0, gamma * lam = 0.25. next values: t0 V1=4, t1 0 (terminated), t2 V3=2, t3 tv=6 (truncated), t4 boot=4.
    # deltas: t4 3+0.5*4-1=4, t3 1+0.5*6-2=2, t2 2+0.5*2-1=2, t1 0+0-4=-4, t0 1+0.5*4-2=1.
    # A4=4; A3=2 (truncated: recursion cut); A2=2+0.25*2=2.5; A1=-4 (terminated: cut); A0=1+0.25*(-4)=0.
    # Env 1: every delta is 1 (r=1, V=0, boot=0): A4=1, A3=1.25, A2=1.3125, A1=1.328125, A0=1.33203125.
    expected_adv = torch.tensor(
        [[0.0, 1.33203125], [-4.0, 1.328125], [2.5, 1.3125], [2.0, 1.25], [4.0, 1.0]], dtype=torch.float64
    )
    torch.testing.assert_close(adv, expected_adv, rtol=0, atol=1e-12)
    # value targets = A + V: env 0 [2, 0, 3.5, 4, 5].
    torch.testing.assert_close(targets, expected_adv + values, rtol=0, atol=1e-12)
    torch.testing.assert_close(targets[:, 0], torch.tensor([2.0, 0.0, 3.5, 4.0, 5.0], dtype=torch.float64))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_vtrace_hand_computed(backend):
    rewards, values, bootstrap_value, terminated, truncated, truncation_values = hand_case()
    # Importance ratios pi/mu for env 0: [0.5, 2, 1, 0.5, 4]; env 1 on-policy (ratio 1).
    ratios = torch.tensor([[0.5, 1.0], [2.0, 1.0], [1.0, 1.0], [0.5, 1.0], [4.0, 1.0]], dtype=torch.float64)
    behavior_logp = torch.full((5, 2), -1.0, dtype=torch.float64)
    target_logp = behavior_logp + ratios.log()
    pg_adv, vs = compute_vtrace(
        behavior_logp, target_logp, rewards, values, bootstrap_value, terminated, truncated,
        gamma=0.5, lam=1.0, rho_clip=2.0, c_clip=1.0, truncation_values=truncation_values, backend=backend,
    )  # fmt: skip
    # Env 0: rho = min(2, ratio) = [0.5, 2, 1, 0.5, 2]; c = min(1, ratio) = [0.5, 1, 1, 0.5, 1].
    # deltas as in the GAE case: [1, -4, 2, 2, 4]; x_t = vs_t - V_t.
    # x4 = 2*4 = 8 -> vs4 = 1+8 = 9
    # x3 = 0.5*2 (+ nothing: truncated) = 1 -> vs3 = 2+1 = 3
    # x2 = 1*2 + 0.5*1*x3 = 2.5 -> vs2 = 1+2.5 = 3.5
    # x1 = 2*(-4) (+ nothing: terminated) = -8 -> vs1 = 4-8 = -4
    # x0 = 0.5*1 + 0.5*0.5*x1 = 0.5-2 = -1.5 -> vs0 = 2-1.5 = 0.5
    # pg_t = rho_t * (r_t + gamma * next_vs_t - V_t):
    # pg4 = 2*(3+0.5*4-1) = 8 (bootstrap); pg3 = 0.5*(1+0.5*6-2) = 1 (truncation value, not vs4);
    # pg2 = 1*(2+0.5*vs3-1) = 2.5; pg1 = 2*(0+0-4) = -8 (terminal: 0); pg0 = 0.5*(1+0.5*vs1-2) = -1.5.
    # Env 1 is on-policy with lam=1, so vs = GAE(1) targets and pg = GAE(1) advantages:
    # A4=1, A3=1.5, A2=1.75, A1=1.875, A0=1.9375 (each 1 + 0.5 * next).
    expected_vs = torch.tensor([[0.5, 1.9375], [-4.0, 1.875], [3.5, 1.75], [3.0, 1.5], [9.0, 1.0]], dtype=torch.float64)
    expected_pg = torch.tensor(
        [[-1.5, 1.9375], [-8.0, 1.875], [2.5, 1.75], [1.0, 1.5], [8.0, 1.0]], dtype=torch.float64
    )
    torch.testing.assert_close(vs, expected_vs, rtol=0, atol=1e-12)
    torch.testing.assert_close(pg_adv, expected_pg, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# numba CPU == float64 reference


@pytest.mark.parametrize("num_steps", [1, 7, 256])
@pytest.mark.parametrize("num_envs", [1, 33, 4096])
def test_numba_matches_reference_float64(num_steps, num_envs):
    inputs = make_inputs(num_steps, num_envs, seed=num_steps * 7919 + num_envs)
    tv = inputs["truncation_values"]
    ref = gae_reference(*gae_args(inputs), tv, 0.97, 0.9)
    out = compute_gae(*gae_args(inputs), gamma=0.97, lam=0.9, truncation_values=tv, backend="numba")
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for rho_clip, c_clip in [(1.0, 1.0), (2.0, 1.0), (math.inf, math.inf), (1.0, math.inf)]:
        ref = vtrace_reference(*vtrace_args(inputs), tv, 0.97, 0.95, rho_clip, c_clip)
        out = compute_vtrace(
            *vtrace_args(inputs), gamma=0.97, lam=0.95, rho_clip=rho_clip, c_clip=c_clip,
            truncation_values=tv, backend="numba",
        )  # fmt: skip
        assert torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()
        for got, want in zip(out, ref, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_steps, num_envs", [(1, 33), (7, 4096), (256, 33), (256, 4096)])
def test_numba_float32_matches_float64_reference(num_steps, num_envs):
    inputs = make_inputs(num_steps, num_envs, dtype=torch.float32, seed=3)
    ref_inputs = as_float64(inputs)  # the same float32 numbers, computed exactly
    tv, ref_tv = inputs["truncation_values"], ref_inputs["truncation_values"]
    out = compute_gae(*gae_args(inputs), gamma=0.99, lam=0.9, truncation_values=tv, backend="numba")
    ref = gae_reference(*gae_args(ref_inputs), ref_tv, 0.99, 0.9)
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float32
        assert_close_float32(got, want)
    for rho_clip, c_clip in [(1.0, 1.0), (2.0, 2.0), (math.inf, math.inf)]:
        out = compute_vtrace(
            *vtrace_args(inputs), gamma=0.99, lam=0.9, rho_clip=rho_clip, c_clip=c_clip,
            truncation_values=tv, backend="numba",
        )  # fmt: skip
        ref = vtrace_reference(*vtrace_args(ref_inputs), ref_tv, 0.99, 0.9, rho_clip, c_clip)
        for got, want in zip(out, ref, strict=True):
            assert got.dtype == torch.float32
            assert_close_float32(got, want)


def assert_close_float32(got, want, msg=None):
    """float32 result vs float64 reference on the same inputs. Each step rounds at ~6e-8 relative to the terms it
    sums, and with unclipped ratios (up to ~e^4 here) the traces grow to ~1e6 while single entries cancel to ~1:
    so the bound scales with the largest magnitude in the tensor (observed <= 6e-7 of it), not with each entry."""
    scale = 1.0 + want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=4e-6 * scale, msg=msg)


def test_numba_parallel_equals_serial():
    """The threaded build (chunks of columns) gives bit-identical results to one thread."""
    inputs = make_inputs(64, 5000, seed=11)
    arrays = [x.numpy() for x in gae_args(inputs)] + [inputs["truncation_values"].numpy()]
    outs = []
    for num_threads in (1, 2):
        adv, targets = np.empty((64, 5000)), np.empty((64, 5000))
        gae_numba(*arrays, 0.99, 0.95, adv, targets, num_threads=num_threads)
        pg, vs = np.empty((64, 5000)), np.empty((64, 5000))
        vtrace_numba(
            inputs["behavior_logp"].numpy(), inputs["target_logp"].numpy(), *arrays,
            0.99, 0.95, 1.0, 1.0, pg, vs, num_threads=num_threads,
        )  # fmt: skip
        outs.append((adv, targets, pg, vs))
    for serial, parallel in zip(*outs, strict=True):
        np.testing.assert_array_equal(serial, parallel)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_exp_matches_numpy(dtype):
    """The numba kernels' own exp: <= 2 ulp against np.exp over the whole range, and np.exp's special values."""
    from sample_fast.extensions._numba_cpu import fast_exp_array

    gen = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-760.0, 720.0, 300_001), gen.standard_normal(100_000) * 3.0]).astype(dtype)
    got = np.empty_like(x)
    fast_exp_array(x, got)
    with np.errstate(over="ignore", under="ignore"):
        want = np.exp(x.astype(np.float64))
    info = np.finfo(dtype)
    normal = (want >= info.tiny) & (want <= info.max)
    ulps = np.abs(got[normal] - want[normal]) / np.spacing(want[normal].astype(dtype)).astype(np.float64)
    assert ulps.max() <= 2.0
    assert np.all(got[want > info.max] == np.inf)
    assert np.all(np.abs(got[want < info.tiny] - want[want < info.tiny]) <= info.tiny)  # underflow: ~0
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=dtype)
    out = np.empty_like(special)
    fast_exp_array(special, out)
    np.testing.assert_array_equal(out, [np.nan, np.inf, 0.0, 1.0, 1.0])


# ---------------------------------------------------------------------------------------------------------------
# Identities and properties


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_on_policy_vtrace_equals_gae(backend, lam):
    """behavior == target and clips >= 1: rho = 1 and c = lam, so vs == GAE(lam) targets (Espeholt et al.,
    remark 1) and, with lam = 1, pg advantages == GAE(1) advantages."""
    inputs = make_inputs(33, 64, seed=5)
    tv = inputs["truncation_values"]
    logp = inputs["behavior_logp"]
    _, gae_targets = compute_gae(*gae_args(inputs), gamma=0.98, lam=lam, truncation_values=tv, backend=backend)
    for clip in (1.0, 2.0, math.inf):
        args = vtrace_args(inputs)
        args[1] = logp.clone()
        pg_adv, vs = compute_vtrace(
            *args, gamma=0.98, lam=lam, rho_clip=clip, c_clip=clip, truncation_values=tv, backend=backend
        )
        torch.testing.assert_close(vs, gae_targets, rtol=1e-12, atol=1e-12)
        if lam == 1.0:
            gae1_adv, _ = compute_gae(*gae_args(inputs), gamma=0.98, lam=1.0, truncation_values=tv, backend=backend)
            torch.testing.assert_close(pg_adv, gae1_adv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("boundary", ["terminated", "truncated"])
def test_no_information_crosses_episode_boundary(backend, boundary):
    """Changing everything after a done step (rewards, values, logps, bootstrap) leaves every output at and
    before it unchanged; the truncation value of the done step itself is the only thing read across it."""
    num_steps, num_envs, done_idx = 12, 40, 5
    inputs = make_inputs(num_steps, num_envs, seed=7, p_done=0.0)
    inputs[boundary][done_idx] = True
    inputs["truncation_values"][done_idx] = 0.25  # read only if the boundary is a truncation
    changed = {k: v.clone() for k, v in inputs.items()}
    gen = torch.Generator().manual_seed(99)
    for key in ("rewards", "values", "behavior_logp", "target_logp", "truncation_values"):
        changed[key][done_idx + 1 :] = torch.randn(
            num_steps - done_idx - 1, num_envs, generator=gen, dtype=torch.float64
        )
    changed["bootstrap_value"] = changed["bootstrap_value"] + 100.0
    kwargs = dict(truncation_values=inputs["truncation_values"], backend=backend)
    changed_kwargs = dict(truncation_values=changed["truncation_values"], backend=backend)
    before = compute_gae(*gae_args(inputs), gamma=0.99, lam=0.95, **kwargs)
    after = compute_gae(*gae_args(changed), gamma=0.99, lam=0.95, **changed_kwargs)
    for x, y in zip(before, after, strict=True):
        torch.testing.assert_close(x[: done_idx + 1], y[: done_idx + 1], rtol=0, atol=0)
        assert not torch.equal(x[done_idx + 1 :], y[done_idx + 1 :])  # the change itself was visible
    before = compute_vtrace(*vtrace_args(inputs), gamma=0.99, lam=0.95, rho_clip=math.inf, c_clip=math.inf, **kwargs)
    after = compute_vtrace(
        *vtrace_args(changed), gamma=0.99, lam=0.95, rho_clip=math.inf, c_clip=math.inf, **changed_kwargs
    )
    for x, y in zip(before, after, strict=True):
        torch.testing.assert_close(x[: done_idx + 1], y[: done_idx + 1], rtol=0, atol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_truncated_bootstraps_terminated_does_not(backend):
    """One step, one env: terminated -> A = r - V; truncated -> A = r + gamma * tv - V; neither -> bootstrap."""
    r, v, tv, boot = torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.tensor([3.0])
    yes, no = torch.tensor([[True]]), torch.tensor([[False]])
    cases = [(yes, no, 1.0 - 0.5), (no, yes, 1.0 + 0.5 * 2.0 - 0.5), (no, no, 1.0 + 0.5 * 3.0 - 0.5)]
    for terminated, truncated, expected in cases:
        adv, _ = compute_gae(
            r, v, boot, terminated, truncated, gamma=0.5, lam=1.0, truncation_values=tv, backend=backend
        )
        assert adv.item() == pytest.approx(expected)


def test_outputs_follow_input_and_are_detached():
    inputs = make_inputs(4, 8, dtype=torch.float32, seed=1)
    values = inputs["values"].clone().requires_grad_(True)
    adv, targets = compute_gae(
        inputs["rewards"], values, inputs["bootstrap_value"], inputs["terminated"], inputs["truncated"],
        gamma=0.9, lam=0.9, truncation_values=inputs["truncation_values"],
    )  # fmt: skip
    assert adv.dtype == targets.dtype == torch.float32 and adv.shape == (4, 8)
    assert not adv.requires_grad and not targets.requires_grad


def test_non_contiguous_inputs_give_the_same_result():
    inputs = make_inputs(9, 6, seed=2)
    # Same values laid out [B, T] in memory and viewed as [T, B] (strided).
    strided = {k: (v.t().contiguous().t() if v.ndim == 2 else v) for k, v in inputs.items()}
    assert not strided["rewards"].is_contiguous()
    tv = dict(truncation_values=inputs["truncation_values"])
    tv_strided = dict(truncation_values=strided["truncation_values"])
    for fn, args in ((compute_gae, gae_args), (compute_vtrace, vtrace_args)):
        kw = dict(gamma=0.9, lam=0.8)
        want = fn(*args(inputs), **kw, **tv, backend="torch")
        got = fn(*args(strided), **kw, **tv_strided, backend="numba")
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# torchrl as an independent implementation


def to_torchrl(x):
    """[T, B] time-major -> torchrl's [B, T, 1] (time at dim -2, a trailing feature dim)."""
    return x.t().unsqueeze(-1).contiguous()


def from_torchrl(x):
    return x.squeeze(-1).t()


def torchrl_next_values(inputs):
    """torchrl takes next_state_value per step: V[t+1], bootstrap at T-1, the truncation value where truncated."""
    next_values = torch.cat([inputs["values"][1:], inputs["bootstrap_value"][None]])
    return torch.where(inputs["truncated"], inputs["truncation_values"], next_values)


@contextlib.contextmanager
def float64_default_dtype():
    """torchrl multiplies gamma by int masks, which yields the default dtype: float32 would round gamma."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def test_matches_torchrl():
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
        vtrace_advantage_estimate,
    )

    inputs = make_inputs(20, 16, seed=4, poison=False)
    done = inputs["terminated"] | inputs["truncated"]
    rl = dict(
        state_value=to_torchrl(inputs["values"]),
        next_state_value=to_torchrl(torchrl_next_values(inputs)),
        reward=to_torchrl(inputs["rewards"]),
        done=to_torchrl(done),
        terminated=to_torchrl(inputs["terminated"]),
    )
    tv = inputs["truncation_values"]
    ours = compute_gae(*gae_args(inputs), gamma=0.97, lam=0.9, truncation_values=tv)
    # The vectorised version drops the (gamma * lam)^k series below 1e-7, hence its looser tolerance.
    for fn, tol in ((generalized_advantage_estimate, 1e-12), (vec_generalized_advantage_estimate, 1e-6)):
        with float64_default_dtype():  # torchrl builds its discount tensors in the default dtype
            theirs = fn(0.97, 0.9, **rl)
        for x, y in zip(ours, theirs, strict=True):
            torch.testing.assert_close(x, from_torchrl(y), rtol=tol, atol=tol)
    # torchrl's V-trace has no lambda (lam = 1); its log_pi is the target policy and log_mu the behavior policy.
    for rho_clip, c_clip in [(1.0, 1.0), (2.0, 1.5)]:
        ours = compute_vtrace(
            *vtrace_args(inputs), gamma=0.97, lam=1.0, rho_clip=rho_clip, c_clip=c_clip, truncation_values=tv
        )
        with float64_default_dtype():
            theirs = vtrace_advantage_estimate(
                0.97, to_torchrl(inputs["target_logp"]), to_torchrl(inputs["behavior_logp"]),
                rl["state_value"], rl["next_state_value"], rl["reward"], rl["done"], rl["terminated"],
                rho_thresh=rho_clip, c_thresh=c_clip,
            )  # fmt: skip
        for x, y in zip(ours, theirs, strict=True):
            torch.testing.assert_close(x, from_torchrl(y), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Bad inputs


def good_gae_inputs():
    inputs = make_inputs(4, 3, dtype=torch.float32, seed=0, p_done=0.0)
    return dict(
        rewards=inputs["rewards"],
        values=inputs["values"],
        bootstrap_value=inputs["bootstrap_value"],
        terminated=inputs["terminated"],
        truncated=inputs["truncated"],
    )


@pytest.mark.parametrize(
    "name, bad, match",
    [
        ("rewards", torch.ones(4, 3, dtype=torch.int64), "rewards must be float32 or float64"),
        ("rewards", torch.ones(4, 3, 1), r"rewards must be time-major \[T, B\]"),
        ("rewards", torch.ones(0, 3), "T = 0"),
        ("values", torch.ones(4, 3, dtype=torch.float64), "values must be torch.float32"),
        ("values", torch.ones(4, 4), r"values must have shape \[T, B\] = \(4, 3\)"),
        ("bootstrap_value", torch.ones(1, 3), r"bootstrap_value must have shape \[B\] = \(3,\)"),
        ("terminated", torch.zeros(4, 3), "terminated must be torch.bool"),
        ("truncated", torch.zeros(4, 3, dtype=torch.int8), "truncated must be torch.bool"),
        ("values", torch.ones(4, 3, device="meta"), "values is on meta but rewards is on cpu"),
        ("values", np.ones((4, 3), dtype=np.float32), "values must be a torch.Tensor"),
    ],
)
def test_bad_inputs_raise_clear_errors(name, bad, match):
    kwargs = good_gae_inputs()
    kwargs[name] = bad
    with pytest.raises(ValueError, match=match):
        compute_gae(**kwargs, gamma=0.99, lam=0.95)


def test_truncated_without_truncation_values_raises():
    kwargs = good_gae_inputs()
    kwargs["truncated"] = kwargs["truncated"].clone()
    kwargs["truncated"][2, 1] = True
    with pytest.raises(ValueError, match=r"pass truncation_values = V\(info\[\"final_obs\"\]\)"):
        compute_gae(**kwargs, gamma=0.99, lam=0.95)
    logp = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="truncation_values"):
        compute_vtrace(logp, logp, *kwargs.values(), gamma=0.99)


def test_bad_scalars_and_backend_raise():
    kwargs = good_gae_inputs()
    logp = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"gamma must be a number in \[0, 1\]"):
        compute_gae(**kwargs, gamma=1.5, lam=0.95)
    with pytest.raises(ValueError, match=r"lam must be a number in \[0, 1\]"):
        compute_gae(**kwargs, gamma=0.9, lam=float("nan"))
    with pytest.raises(ValueError, match="rho_clip must be a number > 0"):
        compute_vtrace(logp, logp, *kwargs.values(), gamma=0.9, rho_clip=0.0)
    with pytest.raises(ValueError, match="c_clip must be a number > 0"):
        compute_vtrace(logp, logp, *kwargs.values(), gamma=0.9, c_clip=float("nan"))
    with pytest.raises(ValueError, match="backend must be one of"):
        compute_gae(**kwargs, gamma=0.9, lam=0.9, backend="triton")
    with pytest.raises(ValueError, match="backend='cuda' needs CUDA tensors"):
        compute_gae(**kwargs, gamma=0.9, lam=0.9, backend="cuda")
    with pytest.raises(ValueError, match="behavior_logp must be torch.float32"):
        compute_vtrace(logp.double(), logp, *kwargs.values(), gamma=0.9)


# ---------------------------------------------------------------------------------------------------------------
# Dispatch: logging and fallback


def test_backend_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(advantages_module, "_logged_choices", set())
    kwargs = good_gae_inputs()
    with caplog.at_level(logging.INFO, logger="sample_fast.extensions"):
        for _ in range(3):
            compute_gae(**kwargs, gamma=0.9, lam=0.9)
    messages = [r.getMessage() for r in caplog.records if r.name == "sample_fast.extensions"]
    assert messages == ["compute_gae: backend 'numba' (requested 'auto', cpu tensors)"]


def test_auto_falls_back_to_torch_when_numba_fails(monkeypatch):
    monkeypatch.setattr(advantages_module, "_broken_backends", {})

    def broken(name):
        raise ImportError("numba is not installed")

    monkeypatch.setattr(advantages_module, "_load_backend", broken)
    kwargs = good_gae_inputs()
    want = compute_gae(**kwargs, gamma=0.9, lam=0.9, backend="torch")
    with pytest.warns(RuntimeWarning, match="'numba' backend failed .*numba is not installed"):
        got = compute_gae(**kwargs, gamma=0.9, lam=0.9)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one-time: no second warning
        compute_gae(**kwargs, gamma=0.9, lam=0.9)
    with pytest.raises(RuntimeError, match="backend 'numba' failed earlier"):
        compute_gae(**kwargs, gamma=0.9, lam=0.9, backend="numba")


# ---------------------------------------------------------------------------------------------------------------
# CUDA kernels: simulator (CPU) and real GPU

SIMULATOR_SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba.cuda is imported
    import numpy as np
    from sample_fast.extensions import _numba_cuda as kernels
    from sample_fast.extensions._numba_cuda import launch_gae, launch_vtrace

    launch_shape = kernels._launch_shape
    shapes = []  # every (blocks, threads) launched, recorded per case

    def recording_launch_shape(num_columns):
        shapes.append(launch_shape(num_columns))
        return shapes[-1]

    kernels._launch_shape = recording_launch_shape
    small_threads = kernels.SMALL_THREADS_PER_BLOCK
    data = np.load(sys.argv[1])
    out = {"thresholds": np.array([launch_shape(32767), launch_shape(32768)])}  # the real rule, around its switch
    for key in sorted({k.split("/")[0] for k in data.files}):
        # "t256" cases launch the production 256-thread blocks at a small B (the real rule uses them only from
        # B = 32768 on, far too many columns for the simulator's one Python thread per CUDA thread)
        kernels.SMALL_THREADS_PER_BLOCK = kernels.THREADS_PER_BLOCK if key.startswith("t256") else small_threads
        shapes.clear()
        d = {name: data[f"{key}/{name}"] for name in ("bl", "tl", "r", "v", "boot", "te", "tr", "tv")}
        gamma, lam, rho_clip, c_clip = data[f"{key}/scalars"]
        base = (d["r"], d["v"], d["boot"], d["te"], d["tr"], d["tv"])
        adv, targets = np.empty_like(d["r"]), np.empty_like(d["r"])
        launch_gae(*base, gamma, lam, adv, targets)
        pg, vs = np.empty_like(d["r"]), np.empty_like(d["r"])
        launch_vtrace(d["bl"], d["tl"], *base, gamma, lam, rho_clip, c_clip, pg, vs)
        out.update({f"{key}/adv": adv, f"{key}/targets": targets, f"{key}/pg": pg, f"{key}/vs": vs})
        out[f"{key}/launch"] = np.array(shapes)
    np.savez(sys.argv[2], **out)
    """
)


@pytest.mark.timeout(180)
def test_cuda_kernel_in_simulator_matches_reference(tmp_path: Path):
    cases = {}
    data = {}
    shapes = [(1, 1), (1, 64), (7, 33), (33, 1), (33, 64), (7, 64), (7, 130)]  # 130: three 64-thread blocks
    # B = 300 with 256-thread blocks: one full block and a partial one (44 columns, 212 idle threads); float64
    # only (its reference comparison is exact to 1e-12); T = 9 crosses several episode ends per column.
    threads_256 = [(9, 300, torch.float64)]
    clips = [(1.0, 1.0), (2.0, 1.0), (math.inf, math.inf)]
    specs = [(f"case{i}", i, n, b, dt) for i, (n, b) in enumerate(shapes) for dt in (torch.float64, torch.float32)]
    specs += [(f"t256case{i}", i, n, b, dt) for i, (n, b, dt) in enumerate(threads_256, start=len(shapes))]
    for name, i, num_steps, num_envs, dtype in specs:
        key = f"{name}_{str(dtype)[6:]}"
        inputs = make_inputs(num_steps, num_envs, dtype=dtype, seed=i, p_done=0.15)
        scalars = (0.97, 0.9, *clips[i % len(clips)])
        cases[key] = (inputs, scalars)
        arrays = dict(
            bl=inputs["behavior_logp"], tl=inputs["target_logp"], r=inputs["rewards"], v=inputs["values"],
            boot=inputs["bootstrap_value"], te=inputs["terminated"], tr=inputs["truncated"],
            tv=inputs["truncation_values"],
        )  # fmt: skip
        data.update({f"{key}/{k}": v.numpy() for k, v in arrays.items()})
        data[f"{key}/scalars"] = np.array(scalars)
    np.savez(tmp_path / "in.npz", **data)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SIMULATOR_SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        env=env, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    # the production rule: 64-thread blocks below 128 x 256 columns, 256-thread blocks from there on
    np.testing.assert_array_equal(out["thresholds"], [[512, 64], [128, 256]])
    for key, (inputs, (gamma, lam, rho_clip, c_clip)) in cases.items():
        num_envs = inputs["rewards"].shape[1]
        threads = 256 if key.startswith("t256") else 64
        blocks = -(-num_envs // threads)  # ceil: every column gets a thread, the last block partly idle
        np.testing.assert_array_equal(out[f"{key}/launch"], [[blocks, threads]] * 2, err_msg=key)  # GAE, V-trace
        ref_inputs = as_float64(inputs)
        tv = ref_inputs["truncation_values"]
        is_float64 = inputs["rewards"].dtype == torch.float64
        ref_adv, ref_targets = gae_reference(*gae_args(ref_inputs), tv, gamma, lam)
        ref_pg, ref_vs = vtrace_reference(*vtrace_args(ref_inputs), tv, gamma, lam, rho_clip, c_clip)
        for name, want in (("adv", ref_adv), ("targets", ref_targets), ("pg", ref_pg), ("vs", ref_vs)):
            got = torch.from_numpy(out[f"{key}/{name}"])
            assert got.dtype == inputs["rewards"].dtype, key
            if is_float64:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"{key}/{name}")
            else:
                assert_close_float32(got, want, msg=f"{key}/{name}")


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_cuda_kernel_matches_reference_on_gpu():
    for dtype in (torch.float64, torch.float32):
        for num_steps, num_envs in [(1, 1), (7, 33), (64, 65536), (256, 4096)]:
            inputs = make_inputs(num_steps, num_envs, dtype=dtype, seed=num_steps, device="cuda")
            ref_inputs = {k: v.cpu() for k, v in as_float64(inputs).items()}
            tv, ref_tv = inputs["truncation_values"], ref_inputs["truncation_values"]
            # Queue the kernel on a side stream: the results must be ordered on that stream, not the default one.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                gae_out = compute_gae(*gae_args(inputs), gamma=0.99, lam=0.95, truncation_values=tv)
                vt_out = compute_vtrace(
                    *vtrace_args(inputs), gamma=0.99, lam=0.95, rho_clip=1.0, c_clip=math.inf, truncation_values=tv
                )
                gae_out = [x.cpu() for x in gae_out]
                vt_out = [x.cpu() for x in vt_out]
            ref_gae = gae_reference(*gae_args(ref_inputs), ref_tv, 0.99, 0.95)
            ref_vt = vtrace_reference(*vtrace_args(ref_inputs), ref_tv, 0.99, 0.95, 1.0, math.inf)
            for got, want in zip([*gae_out, *vt_out], [*ref_gae, *ref_vt], strict=True):
                assert got.dtype == dtype
                if dtype == torch.float64:
                    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
                else:
                    assert_close_float32(got, want)


# ---------------------------------------------------------------------------------------------------------------
# Benchmark script


@pytest.mark.timeout(120)
def test_benchmark_runs_and_writes_results(tmp_path, load_bench):
    bench = load_bench("bench_advantages")
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--quick", "--num-steps", "8", "--num-envs", "64", "--out", str(tmp_path / "r")]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark sets torch's thread count for its run
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["timings"]["numba_gae"]["rounds"] == 5
    assert set(result["targets"]) == {
        "numba_gae >= 10x torchrl_gae",
        "numba_gae >= 2x torchrl_vec_gae",
        "numba_vtrace >= 10x torchrl_vtrace",
    }
    assert "| numba_vtrace |" in (tmp_path / "r.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure path without CUDA")
def test_benchmark_cuda_mode_fails_cleanly_without_cuda(load_bench):
    bench = load_bench("bench_advantages")
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--device", "cuda"])


def test_stale_numba_cache_entries_are_dropped(tmp_path):
    # numba's cache only watches the kernel's own file; entries older than _elementwise.py must go, newer stay.
    from sample_fast.extensions._elementwise import drop_stale_cache

    module, dependency = tmp_path / "_numba_cpu.py", tmp_path / "_elementwise.py"
    module.write_text("")
    dependency.write_text("")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    old = [cache / "_numba_cpu._gae_chunks-1.py311.nbi", cache / "_numba_cpu._gae_chunks-1.py311.1.nbc"]
    new = cache / "_numba_cpu._vtrace_chunks-2.py311.nbi"
    other = cache / "_numba_cuda._kernel-3.py311.nbi"  # another module's cache is not ours to drop
    for path in (*old, new, other):
        path.write_text("")
    t = dependency.stat().st_mtime
    for path in (*old, other):
        os.utime(path, (t - 100, t - 100))
    os.utime(new, (t + 100, t + 100))
    assert drop_stale_cache(str(module), str(dependency)) == 2
    assert not any(p.exists() for p in old) and new.exists() and other.exists()
    assert drop_stale_cache(str(module), str(tmp_path / "missing.py")) == 0
