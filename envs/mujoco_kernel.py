"""The mujoco backend's compiled stepping loop: a run of envs stepped through one ``MjData`` in one call that holds
no GIL.

``MujocoEnv``'s Python loop calls four MuJoCo functions per env step (``mj_setState``, ``mj_step``,
``mj_rnePostConstraint``, ``mj_getState``); the bindings release the GIL inside each and take it back after, and the
row copies between them run in Python. On 2 cores with the sampler's main thread busy in Python (inference, slot
writes), the worker threads then wait for the GIL four times per env (docs/benchmark.md, "where the time goes").
This module makes the same C calls from a numba function compiled with ``nogil=True``: a worker takes the GIL
once per run of envs instead of four times per env.

The calls go to the very ``libmujoco`` the bindings use (the same file, so ``dlopen`` hands back the loaded
library: one copy of MuJoCo's global state), called through their addresses (looked up with ctypes, passed to
the kernel as integers, so numba caches its machine code in ``__pycache__``). The
C functions are called with the same arguments in the same order as the Python loop, so the results are the same
bits (tested for every task). ``mj_step`` is called ``frame_skip`` times, which is what the bindings'
``mj_step(m, d, nstep)`` does.

One difference: the bindings catch a MuJoCo *error* (``mju_error``, e.g. a model whose ``<size memory>`` is too
small for its stack) around each call and raise it as a Python exception, which the env
reports as an ``EnvError``. Called from here, the error reaches MuJoCo's default handler, which prints the message
("ERROR: ...") and exits the process with status 1 (tested). In the async trainer that is a sampler crash, which
the runner replaces (docs/fault_tolerance.md); checkpoints already written are kept. MuJoCo *warnings* (an unstable
simulation, too many contacts) are counted in ``mjData.warning`` and handled as before. ``kernel="python"`` keeps
the Python loop, for a model that may hit a MuJoCo error.
"""

from __future__ import annotations

import ctypes
import functools
import os

import mujoco
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    """The ``libmujoco`` shared library that the ``mujoco`` package's bindings are linked against."""
    pkg = os.path.dirname(mujoco.__file__)
    names = sorted(f for f in os.listdir(pkg) if f.startswith("libmujoco.so") or f.startswith("libmujoco."))
    if not names:
        raise ImportError(f"no libmujoco shared library in {pkg}")
    return ctypes.CDLL(os.path.join(pkg, names[0]))  # only the functions' addresses are used (step_kernel)


def _cast_to(pointer_type):
    """A numba intrinsic that reads an integer address as ``pointer_type`` (numba has no cast for it)."""

    @intrinsic
    def cast(typingctx, addr):  # noqa: ARG001 (numba's intrinsic signature)
        def codegen(context, builder, signature, args):  # noqa: ARG001
            return builder.inttoptr(args[0], context.get_value_type(pointer_type))

        return pointer_type(addr), codegen

    return cast


_voidptr = _cast_to(types.voidptr)
_f64ptr = _cast_to(types.CPointer(types.float64))
_i32ptr = _cast_to(types.CPointer(types.int32))


def _emit_call(builder, fn_addr, pointers, integer=None) -> None:
    """Call the C function at integer address ``fn_addr`` as ``void fn(void*, ..., [int])``."""
    i8p = ir.IntType(8).as_pointer()
    params = [i8p] * len(pointers) + ([ir.IntType(32)] if integer is not None else [])
    fnptr = builder.inttoptr(fn_addr, ir.FunctionType(ir.VoidType(), params).as_pointer())
    values = list(pointers) + ([builder.trunc(integer, ir.IntType(32))] if integer is not None else [])
    builder.call(fnptr, values)


# The MuJoCo functions are called through their addresses, passed in as arguments rather than held as ctypes
# globals, so that numba can cache the compiled kernel (ctypes objects cannot be pickled into its cache).
@intrinsic
def _call_pp(typingctx, fn, a, b):  # noqa: ARG001 (numba's intrinsic signature): mj_step, mj_rnePostConstraint
    def codegen(context, builder, signature, args):  # noqa: ARG001
        _emit_call(builder, args[0], args[1:3])
        return context.get_dummy_value()

    return types.void(fn, a, b), codegen


@intrinsic
def _call_pppi(typingctx, fn, a, b, c, k):  # noqa: ARG001 (mj_setState, mj_getState)
    def codegen(context, builder, signature, args):  # noqa: ARG001
        _emit_call(builder, args[0], args[1:4], args[4])
        return context.get_dummy_value()

    return types.void(fn, a, b, c, k), codegen


@numba.njit(nogil=True, cache=True)
def _step_envs(fns, idx, models, data, state, nstep, rne, spec, src, dst, width, warn_src, warn_buf):
    mj_step, mj_rne, mj_set, mj_get = fns[0], fns[1], fns[2], fns[3]
    d = _voidptr(data)
    nwarn = warn_buf.shape[1]
    warn = numba.carray(_i32ptr(warn_src), (2 * nwarn - 1,))  # number[w] is warn[2 * w] (8-byte structs)
    for k in range(idx.shape[0]):
        i = idx[k]
        m = _voidptr(models[i])
        row = _voidptr(state[i].ctypes.data)
        _call_pppi(mj_set, m, d, row, spec)
        for _ in range(nstep):
            _call_pp(mj_step, m, d)
        if rne:
            _call_pp(mj_rne, m, d)
        _call_pppi(mj_get, m, d, row, spec)
        for f in range(src.shape[0]):
            n = width[f]
            s = numba.carray(_f64ptr(src[f]), (n,))
            t = numba.carray(_f64ptr(dst[f] + 8 * n * i), (n,))
            for j in range(n):
                t[j] = s[j]
        for w in range(nwarn):
            warn_buf[i, w] = warn[2 * w]
            warn[2 * w] = 0


@functools.lru_cache(maxsize=1)
def step_kernel():
    """The compiled loop, with the MuJoCo functions' addresses bound (numba caches the machine code in
    ``__pycache__``; the first use in a fresh checkout compiles it, about a second).

    ``step_envs(idx, models, data, state, nstep, rne, spec, src, dst, width, warn_src, warn_buf)`` steps the envs
    ``idx`` in order: for env ``i``, ``mj_setState(models[i], data, state[i])``, ``nstep`` x ``mj_step``,
    ``mj_rnePostConstraint`` if ``rne``, ``mj_getState`` back into ``state[i]``; then copies ``width[f]`` float64
    from address ``src[f]`` (an MjData field) to row ``i`` of the C-contiguous batch array at ``dst[f]``, and the
    MjData's warning counters (``mjWarningStat.number`` at ``warn_src``, 8 bytes apart) into ``warn_buf[i]``,
    zeroing them for the next env. Addresses are integers (``ndarray.ctypes.data``, ``MjData._address``).
    """
    lib = _lib()
    names = ("mj_step", "mj_rnePostConstraint", "mj_setState", "mj_getState")
    fns = np.array([ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names], dtype=np.int64)

    def step_envs(idx, models, data, state, nstep, rne, spec, src, dst, width, warn_src, warn_buf):
        _step_envs(fns, idx, models, data, state, nstep, rne, spec, src, dst, width, warn_src, warn_buf)

    return step_envs


def field_table(bufs: list[np.ndarray], views: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, width)`` for ``step_envs``: each MjData field view's address, its batch array's address and the
    float64 per row. Checks what the kernel assumes (float64, C-contiguous, rows of the view's size)."""
    for buf, view in zip(bufs, views, strict=True):
        if buf.dtype != np.float64 or view.dtype != np.float64:
            raise TypeError("the compiled mujoco kernel copies float64 fields only")
        if not (buf.flags.c_contiguous and view.flags.c_contiguous) or buf[0].size != view.size:
            raise ValueError("the compiled mujoco kernel needs C-contiguous batch arrays with rows of the field's size")
    src = np.array([v.ctypes.data for v in views], dtype=np.int64)
    dst = np.array([b.ctypes.data for b in bufs], dtype=np.int64)
    width = np.array([v.size for v in views], dtype=np.int64)
    return src, dst, width
