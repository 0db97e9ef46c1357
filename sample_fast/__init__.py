"""sample_fast: a high-throughput RL sampler and asynchronous APPO trainer.

Data flow (one directory per stage): ``sample_fast.envs`` (BatchedEnv backends) -> ``sample_fast.sampler``
(double-buffered acting) -> ``sample_fast.trajectory_store`` (shared-memory slots) -> ``sample_fast.learner``
(APPO on V-trace targets, advantage kernels in ``sample_fast.extensions``) -> ``sample_fast.param_store``.
"""

__version__ = "0.1.0"

from ._lazy_dynamo import install as _install_lazy_dynamo

_install_lazy_dynamo()  # tensordict's import without torch._dynamo's 1.5 s (sample_fast/_lazy_dynamo.py)
