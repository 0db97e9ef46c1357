"""The options of the ``mjx``, ``warp`` and ``envpool`` backends (besides the task options) with their defaults, as
plain data.

They live here, not in envs/mjx_env.py, envs/warp_env.py and envs/envpool_env.py, so that the config check can name
the backend that owns an option given to another one (``envs._with_owners``: "xla_opt_level is an option of the mjx
backend") without importing JAX, Warp or EnvPool (which imports JAX), which takes seconds. The env modules use these
dicts.
"""

from __future__ import annotations

from typing import Any

#: Backend options (accepted by ``make(..., backend="mjx", **options)``) with their defaults.
MJX_OPTIONS: dict[str, Any] = {
    "precision": "float32",  # "float64" needs jax_enable_x64 set before the env is made
    "solver": None,  # None: the model's own, except PGS -> "newton" (MJX has no PGS); or "cg" / "newton"
    "compilation_cache_dir": None,  # a directory: turn on JAX's persistent compilation cache (process-wide)
    "xla_opt_level": None,  # None: XLA's default; 0 compiles ~30% faster on CPU (tests use it)
    "model_params": None,  # {MjModel field: [num_envs, ...]}: per-env model fields, vmapped (domain randomization)
}

#: Backend options (accepted by ``make(..., backend="warp", **options)``) with their defaults.
WARP_OPTIONS: dict[str, Any] = {
    "nconmax": None,  # contacts per world (MJWarp allocates nconmax * num_envs for all worlds); None: sized per task
    "njmax": None,  # constraint rows per world (a hard per-world limit); None: sized per task
    "solver": None,  # None: the model's own, except PGS -> "newton" (MJWarp has no PGS); or "cg" / "newton"
    "kernel_cache_dir": None,  # Warp's kernel cache (process-wide); None: $WARP_CACHE_PATH or ~/.cache/warp
    "cuda_graph": True,  # on CUDA: capture the env step as one CUDA graph (False: launch eagerly, for debugging)
    "model_params": None,  # {MjModel field: [num_envs, ...]}: per-world model fields (domain randomization)
}

#: Backend settings of the ``envpool`` backend (MuJoCo tasks), accepted besides the task options.
ENVPOOL_OPTIONS: dict[str, Any] = {
    "num_threads": None,  # None: min(num_envs, os.cpu_count())
    "thread_affinity_offset": -1,  # >= 0 pins EnvPool's threads to cores offset, offset + 1, ...
}
