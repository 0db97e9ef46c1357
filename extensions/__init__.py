"""sample_fast.extensions: fast kernels (numba CPU and CUDA) for advantage estimation."""
