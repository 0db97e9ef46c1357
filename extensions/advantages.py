"""Public advantage estimators: ``compute_gae`` and ``compute_vtrace`` on time-major ``[T, B]`` torch tensors.

Owns input validation, backend dispatch ("torch" reference, "numba" CPU, "cuda" numba CUDA) and output allocation.
The math lives in ``_reference.py`` (source of truth) and the kernels in ``_numba_cpu.py`` / ``_numba_cuda.py``,
which must give the reference's numbers. Nothing here keeps state beyond the once-per-process log/warning flags.
"""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from collections.abc import Callable

import torch

from ._reference import gae_reference, vtrace_reference

logger = logging.getLogger("sample_fast.extensions")

BACKENDS = ("auto", "torch", "numba", "cuda")
_FLOAT_DTYPES = (torch.float32, torch.float64)

# Once-per-process bookkeeping: which (function, backend) pairs were logged, which kernels failed and why.
_logged_choices: set[tuple[str, str]] = set()
_broken_backends: dict[str, str] = {}


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    truncation_values: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over ``[T, B]`` rollouts with separate termination and truncation.

    Args:
        rewards: ``[T, B]`` float32 or float64, reward of step t.
        values: ``[T, B]`` same dtype, V(observation at step t).
        bootstrap_value: ``[B]`` same dtype, V(observation after the last step T-1).
        terminated: ``[T, B]`` bool, step t ended the episode (next value 0).
        truncated: ``[T, B]`` bool, step t hit a time limit (next value ``truncation_values[t]``).
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].
        truncation_values: ``[T, B]`` same dtype, V(info["final_obs"]) of step t; read only where truncated
            (anything, NaN included, elsewhere). Required when any step is truncated.
        backend: "auto" (CUDA tensors -> "cuda", CPU tensors -> "numba"), "torch", "numba" or "cuda".

    Returns:
        ``(advantages, value_targets)``, each ``[T, B]`` in the input dtype on the input device;
        ``value_targets = advantages + values``.
    """
    floats = {"rewards": rewards, "values": values}
    inputs = _validate("compute_gae", floats, bootstrap_value, terminated, truncated, truncation_values)
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    return _dispatch("compute_gae", backend, inputs, (gamma, lam))


def compute_vtrace(
    behavior_logp: torch.Tensor,
    target_logp: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    *,
    gamma: float,
    lam: float = 1.0,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
    truncation_values: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets (Espeholt et al. 2018) with optional lambda, over ``[T, B]`` rollouts.

    Args:
        behavior_logp: ``[T, B]`` float, log mu(a_t | s_t) of the policy that acted.
        target_logp: ``[T, B]`` float, log pi(a_t | s_t) of the policy being trained.
        rewards, values, bootstrap_value, terminated, truncated, truncation_values: as in ``compute_gae``.
        gamma: discount in [0, 1].
        lam: trace lambda in [0, 1]; multiplies every c_t (the paper's remark 1; torchrl has no lambda: use 1).
        rho_clip: rho-bar, clip of the importance ratio in the TD error (``float("inf")`` for none); > 0.
        c_clip: c-bar, clip of the importance ratio in the trace (``float("inf")`` for none); > 0.
        backend: as in ``compute_gae``.

    Returns:
        ``(pg_advantages, vs)``, each ``[T, B]`` in the input dtype on the input device:
        ``pg_adv_t = rho_t * (r_t + gamma * next_vs_t - V_t)`` and the value targets ``vs``.
    """
    floats = {"behavior_logp": behavior_logp, "target_logp": target_logp, "rewards": rewards, "values": values}
    inputs = _validate("compute_vtrace", floats, bootstrap_value, terminated, truncated, truncation_values)
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    _check_clip("rho_clip", rho_clip)
    _check_clip("c_clip", c_clip)
    return _dispatch("compute_vtrace", backend, inputs, (gamma, lam, rho_clip, c_clip))


# ---------------------------------------------------------------------------------------------------------------
# Dispatch


# Each estimator's implementations take the same positional arguments: the validated inputs in _validate's order,
# the scalars, and for the kernels the two outputs. Kernels are named, not imported: their backend module is
# imported on first use.
_IMPLEMENTATIONS: dict[str, tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]], dict[str, str]]] = {
    "compute_gae": (gae_reference, {"numba": "gae_numba", "cuda": "launch_gae"}),
    "compute_vtrace": (vtrace_reference, {"numba": "vtrace_numba", "cuda": "launch_vtrace"}),
}


def _dispatch(
    func_name: str, backend: str, inputs: dict[str, torch.Tensor | None], scalars: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the backend, run the estimator there, and fall back to the torch reference if a kernel fails."""
    if backend not in BACKENDS:
        raise ValueError(f"{func_name}: backend must be one of {BACKENDS}, got {backend!r}")
    device = inputs["rewards"].device
    is_cuda = device.type == "cuda"
    if backend == "numba" and is_cuda:
        raise ValueError(f"{func_name}: backend='numba' runs on CPU tensors; for {device} tensors use 'cuda' or 'auto'")
    if backend == "cuda" and not is_cuda:
        raise ValueError(f"{func_name}: backend='cuda' needs CUDA tensors, got {device}; use 'numba' or 'auto'")
    name = backend if backend != "auto" else ("cuda" if is_cuda else "numba")
    if name == "numba" and device.type != "cpu":
        name = "torch"  # e.g. mps or xpu tensors under "auto": only the reference runs there
    explicit = backend != "auto"
    reference, kernel_names = _IMPLEMENTATIONS[func_name]

    if name != "torch" and name not in _broken_backends:
        try:
            module = _load_backend(name)
            out = _run_kernel(module, name, kernel_names[name], inputs, scalars)
        except Exception as error:  # import or compile failure of numba: fall back under "auto" only
            if explicit or isinstance(error, (ValueError, torch.OutOfMemoryError)):
                raise  # the caller asked for this backend, or the error is not the backend's (bad input, OOM)
            _broken_backends[name] = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"sample_fast.extensions: the {name!r} backend failed ({_broken_backends[name]}); "
                "falling back to the slow torch reference for this process",
                RuntimeWarning,
                stacklevel=3,
            )
            logger.warning("backend %r failed, using 'torch': %s", name, _broken_backends[name])
        else:
            _log_choice(func_name, name, backend, device)
            return out
    elif name in _broken_backends and explicit:
        raise RuntimeError(f"{func_name}: backend {name!r} failed earlier: {_broken_backends[name]}")
    _log_choice(func_name, "torch", backend, device)
    return reference(*inputs.values(), *scalars)


def _run_kernel(
    module, name: str, kernel_name: str, inputs: dict[str, torch.Tensor | None], scalars: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate the two outputs and run ``module.<kernel_name>`` on them: numba on numpy views, CUDA on tensors."""
    outputs = (torch.empty_like(inputs["rewards"]), torch.empty_like(inputs["rewards"]))
    if inputs["truncation_values"] is None:
        # Never selected (no step is truncated), but the kernels take an array: values stands in.
        inputs = {**inputs, "truncation_values": inputs["values"]}
    kernel = getattr(module, kernel_name)
    if name == "numba":
        arrays = _as_numpy([*inputs.values(), *outputs])
        kernel(*arrays[:-2], *scalars, *arrays[-2:], torch.get_num_threads())
    else:
        module.launch_on_torch(kernel, *inputs.values(), *scalars, *outputs)
    return outputs


def _load_backend(name: str):
    if name == "numba":
        from . import _numba_cpu

        return _numba_cpu
    from . import _numba_cuda

    return _numba_cuda


def _log_choice(func_name: str, name: str, requested: str, device: torch.device) -> None:
    if (func_name, name) not in _logged_choices:
        _logged_choices.add((func_name, name))
        logger.info("%s: backend %r (requested %r, %s tensors)", func_name, name, requested, device.type)


def _as_numpy(tensors):
    # Zero-copy views: the tensors are CPU, contiguous and detached (checked by _validate).
    return [t.numpy() for t in tensors]


# ---------------------------------------------------------------------------------------------------------------
# Validation


def _validate(
    func_name: str,
    floats: dict[str, torch.Tensor],
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    truncation_values: torch.Tensor | None,
) -> dict[str, torch.Tensor | None]:
    """Check shapes, dtypes and devices; return detached, contiguous tensors by argument name, in the order
    ``*floats, bootstrap_value, terminated, truncated, truncation_values`` that every implementation takes."""
    rewards = floats["rewards"]
    _check_tensor(func_name, "rewards", rewards)
    if rewards.ndim != 2:
        raise ValueError(f"{func_name}: rewards must be time-major [T, B], got shape {tuple(rewards.shape)}")
    num_steps, num_envs = rewards.shape
    if num_steps == 0:
        raise ValueError(f"{func_name}: rewards has T = 0 steps; pass at least one step")
    if rewards.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{func_name}: rewards must be float32 or float64, got {rewards.dtype}")
    dtype, device = rewards.dtype, rewards.device
    expected = [(name, t, (num_steps, num_envs), dtype) for name, t in floats.items()]
    expected += [
        ("bootstrap_value", bootstrap_value, (num_envs,), dtype),
        ("terminated", terminated, (num_steps, num_envs), torch.bool),
        ("truncated", truncated, (num_steps, num_envs), torch.bool),
        ("truncation_values", truncation_values, (num_steps, num_envs), dtype),
    ]
    out: dict[str, torch.Tensor | None] = {}
    for name, tensor, shape, want_dtype in expected:
        if tensor is None and name == "truncation_values":
            out[name] = None
            continue
        _check_tensor(func_name, name, tensor)
        if tuple(tensor.shape) != shape:
            layout = "[B]" if len(shape) == 1 else "[T, B]"
            raise ValueError(
                f"{func_name}: {name} must have shape {layout} = {shape} (T, B from rewards), got {tuple(tensor.shape)}"
            )
        if tensor.dtype != want_dtype:
            hint = "" if want_dtype == torch.bool else f" (all float inputs share rewards' dtype {dtype})"
            raise ValueError(f"{func_name}: {name} must be {want_dtype}{hint}, got {tensor.dtype}")
        if tensor.device != device:
            raise ValueError(f"{func_name}: {name} is on {tensor.device} but rewards is on {device}; move it")
        # Advantages are targets: never backpropagate through them. Strided views are copied once here.
        out[name] = tensor.detach().contiguous()
    if out["truncation_values"] is None and bool(out["truncated"].any()):  # SYNC: one host read on CUDA
        raise ValueError(
            f"{func_name}: some steps are truncated but truncation_values is None; pass truncation_values = "
            'V(info["final_obs"]) [T, B] so truncated steps bootstrap from the true final observation'
        )
    return out


def _check_tensor(func_name: str, name: str, tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(
            f"{func_name}: {name} must be a torch.Tensor, got {type(tensor).__name__}; wrap it with torch.as_tensor"
        )


def _check_unit_interval(name: str, x: float) -> None:
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")


def _check_clip(name: str, x: float) -> None:
    if not isinstance(x, numbers.Real) or isinstance(x, bool) or math.isnan(x) or x <= 0:
        raise ValueError(f"{name} must be a number > 0 (float('inf') for no clipping), got {x!r}")
