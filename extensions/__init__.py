"""sample_fast.extensions: fast kernels (numba CPU and CUDA) for advantage estimation.

``compute_gae`` and ``compute_vtrace`` take time-major ``[T, B]`` torch tensors and dispatch to a numba CPU kernel,
a numba CUDA kernel, or the torch reference; see ``docs/kernels.md``.
"""

from .advantages import compute_gae, compute_vtrace

__all__ = ["compute_gae", "compute_vtrace"]
