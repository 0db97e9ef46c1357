"""tanh for the policy's MLPs on the CPU, through numpy's ufunc.

PERF (issue #14, ``benchmarks/results/tanh_cpu.md``): torch 2.13's CPU ``tanh`` kernel takes ~2.2 ns per float32
element on the development VM (147 us for the learner's [1024, 64] minibatch activation), while numpy's vectorised
``np.tanh`` takes ~0.2 ns (13.7 us) at about 1 ulp (max relative error 1.1e-7 against float64, torch's 0.6e-7).
The default MuJoCo policy (64x64 tanh, a tanh-squashed Gaussian mean) calls it 5 times per minibatch forward and 3
times per acting call, so it was a fifth of the learner's time.

``tanh`` / ``Tanh``: differentiable; forward through numpy, backward torch's own ``tanh_backward`` (the same
gradient formula, ``grad * (1 - y^2)``, as ``torch.tanh``). ``tanh_``: in place, for the no-grad acting path.
Anything numpy cannot take (another device, bf16/fp16 under autocast, a tensor being traced by ``torch.compile``)
goes to ``torch.tanh`` unchanged, so the result is the same function everywhere, to float rounding.

``SAMPLE_FAST_TANH=torch`` in the environment (read at import; spawned samplers inherit it) turns the numpy path off:
the A/B of ``benchmarks/bench_levers.py``'s ``tanh=torch`` variant, and a way out should numpy's ufunc misbehave.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

_NUMPY_DTYPES = (torch.float32, torch.float64)
_KERNELS = ("numpy", "torch")
KERNEL = os.environ.get("SAMPLE_FAST_TANH", "numpy")
if KERNEL not in _KERNELS:
    raise ValueError(f"SAMPLE_FAST_TANH={KERNEL!r}: choose one of {', '.join(_KERNELS)} (unset: numpy)")


def _numpy_ok(x: Tensor) -> bool:
    return (
        KERNEL == "numpy"
        and x.device.type == "cpu"
        and x.dtype in _NUMPY_DTYPES
        and x.layout == torch.strided
        and not x.is_neg()  # a lazy negation view: Tensor.numpy() refuses it
        and not torch.compiler.is_compiling()
    )


class _NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: Tensor) -> Tensor:
    """``torch.tanh(x)``, through numpy on the CPU (see the module docstring)."""
    if not _numpy_ok(x):
        return torch.tanh(x)
    if x.requires_grad and torch.is_grad_enabled():
        return _NumpyTanh.apply(x)
    return torch.from_numpy(np.tanh(x.detach().numpy()))


def tanh_(x: Tensor) -> Tensor:
    """``x.tanh_()`` for a tensor outside autograd (the acting path), through numpy on the CPU."""
    if not _numpy_ok(x) or (x.requires_grad and torch.is_grad_enabled()):
        return x.tanh_()
    a = x.numpy()
    np.tanh(a, out=a)
    return x


class Tanh(nn.Module):
    """``nn.Tanh`` through :func:`tanh` (no parameters, so checkpoints are unchanged)."""

    def forward(self, x: Tensor) -> Tensor:
        return tanh(x)
