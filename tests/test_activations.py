"""sample_fast.activations: numpy's tanh in place of torch's on the CPU, checked against float64 references."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from sample_fast.envs import Spec

from sample_fast import activations
from sample_fast.policy import ActorCritic, PolicyConfig


def _x(shape=(257, 64), dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).mul(4).to(dtype)


def test_tanh_float32_is_within_2_ulp_of_float64():
    x = _x()
    ref = torch.tanh(x.double())
    y = activations.tanh(x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    # 2 float32 ulps of the reference (x in [-16, 16] spans the saturated and the linear ranges)
    ulp = torch.finfo(torch.float32).eps * ref.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert ((y.double() - ref).abs() <= 2 * ulp).all()


def test_tanh_float64_gradient_is_the_analytic_one():
    x = _x((13, 5), torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(activations.tanh, (x,))
    y = activations.tanh(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 1 - torch.tanh(x.detach()) ** 2, rtol=1e-12, atol=1e-15)


def test_tanh_of_a_strided_view_and_in_place_on_inference_tensors():
    x = _x((64, 32))
    torch.testing.assert_close(activations.tanh(x.t()), torch.tanh(x.t()), rtol=2.5e-7, atol=0)
    with torch.inference_mode():
        y = x.clone()
        out = activations.tanh_(y)
    assert out is y
    torch.testing.assert_close(y, torch.tanh(x), rtol=2.5e-7, atol=0)


def test_what_numpy_cannot_take_goes_to_torch():
    xb = _x((8, 8), torch.bfloat16)
    assert torch.equal(activations.tanh(xb), torch.tanh(xb))  # bf16 (CPU autocast): torch's own kernel
    neg = torch._neg_view(_x((8, 8)))  # a lazy negation, which Tensor.numpy() refuses
    assert neg.is_neg() and torch.equal(activations.tanh(neg), torch.tanh(neg))
    leaf = _x((8, 8)).requires_grad_()
    with pytest.raises(RuntimeError):  # in place on a tensor autograd tracks: torch's own error, not numpy's
        activations.tanh_(leaf)


def test_policy_act_and_evaluate_agree_on_the_logp_of_the_sampled_action():
    obs_spec = Spec(shape=(27,), dtype=torch.float32)
    act_spec = Spec(shape=(8,), dtype=torch.float32, low=-torch.ones(8), high=torch.ones(8))  # squashed mean: tanh
    policy = ActorCritic(obs_spec, act_spec, PolicyConfig(hidden_sizes=[64, 64], activation="tanh"))
    obs = _x((64, 27), seed=3)
    with torch.inference_mode():
        actions, logp, _ = policy.act(obs, with_value=False)
    target_logp, _, _ = policy.evaluate(obs, actions)  # the grad path: activations.Tanh
    torch.testing.assert_close(target_logp, logp, rtol=0, atol=1e-5)


def _kernel_in_fresh_interpreter(value: str) -> subprocess.CompletedProcess:
    code = "import sample_fast.activations as a; print(a.KERNEL)"
    env = {**os.environ, "SAMPLE_FAST_TANH": value}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_env_variable_selects_torch_and_a_bad_value_names_the_choices():
    out = _kernel_in_fresh_interpreter("torch")
    assert out.returncode == 0 and out.stdout.strip() == "torch", out.stderr
    bad = _kernel_in_fresh_interpreter("fast")
    assert bad.returncode != 0 and "SAMPLE_FAST_TANH='fast': choose one of numpy, torch" in bad.stderr


def test_torch_kernel_switch_gives_torch_tanh_bit_for_bit(monkeypatch):
    monkeypatch.setattr(activations, "KERNEL", "torch")
    x = _x()
    assert torch.equal(activations.tanh(x), torch.tanh(x))


def test_learner_updates_with_either_kernel_leave_the_same_weights(monkeypatch, load_bench):
    """The default Ant policy (64x64 tanh) and the trainer's learner settings, 3 updates of T=64 x B=64 batches
    (4 epochs x 4 minibatches each, lr 3e-4) per kernel from the same initial weights. The two kernels differ by
    about an ulp per activation. Through 48 Adam steps that stays at round-off for almost every weight (median),
    while Adam's sign-like steps let a few weights drift further apart: 2.5e-5 at most on an Intel Xeon host, < 1e-6
    on an AMD EPYC one, against 1.4e-2 that the weights move. A wrong gradient or a stale in-place buffer moves the
    median weight by a share of its own movement (median 4.5e-3), far above both bounds."""
    bench = load_bench("bench_distributed")
    weights, actions, moved = {}, {}, {}
    for kernel in ("numpy", "torch"):
        monkeypatch.setattr(activations, "KERNEL", kernel)
        learner = bench.make_learner([64, 64], "tanh", seed=0)
        start = torch.cat([p.detach().flatten().clone() for p in learner.policy.parameters()])
        batches = [bench.make_batch(learner.policy, seed=i) for i in range(3)]
        for batch in batches:
            learner.train(batch)
        weights[kernel] = torch.cat([p.detach().flatten() for p in learner.policy.parameters()])
        moved[kernel] = (weights[kernel] - start).abs()
        actions[kernel] = batches[0]["actions"]
    diff = (weights["numpy"] - weights["torch"]).abs()
    assert moved["torch"].median() > 1e-3  # the updates did move the weights (the bounds below mean something)
    assert diff.median() < 1e-6, diff.median()  # round-off for the typical weight
    assert diff.max() < 0.05 * moved["torch"].max(), (diff.max(), moved["torch"].max())  # a few drift, not far
    assert (actions["numpy"] - actions["torch"]).abs().max() < 1e-6  # the acting path, before any update
