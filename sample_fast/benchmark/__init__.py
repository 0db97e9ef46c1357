"""sample_fast.benchmark: the FPS suite, ``python -m sample_fast.benchmark`` (Hydra; see docs/benchmark.md).

Measures env steps/s (agent actions; physics steps and frame_skip stated beside) of three stages -- env only, the
Sampler with a 2x256 policy, end-to-end training -- over backends, envs and a num_envs sweep, next to peers run
in the same process tree (raw ``mujoco.rollout``, EnvPool, gymnasium vector envs, torchrl, Sample Factory), and
writes JSON, Markdown and a PNG plot. Modules: ``config`` (schema), ``measure`` (timing), ``stages`` (ours),
``peers`` and ``sample_factory_peer`` (theirs), ``report`` (files), ``suite`` (planning and the run loop).
"""

from typing import Any

from .config import BenchmarkConfig, BenchmarkConfigError, resolve

__all__ = ["BenchmarkConfig", "BenchmarkConfigError", "resolve", "plan", "run_suite"]


def __getattr__(name: str) -> Any:
    # Lazy: the suite imports torch and every backend; the config, the CLI's error path and spawned helper
    # processes (measure.run_isolated) should not pay for that.
    if name in ("plan", "run_suite"):
        from . import suite

        return getattr(suite, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
