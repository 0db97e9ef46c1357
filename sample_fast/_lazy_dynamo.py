"""Import tensordict without importing torch._dynamo: 1.5 s off the start of every process that uses the slots.

tensordict marks a few of its functions for ``torch.compile`` while it is imported
(``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``), and each of those calls imports
``torch._dynamo`` (with sympy and torch.fx: ~1.5 s of a ~4.5 s start on 2 CPU cores). sample_fast does not compile
anything in its processes, and every trainer starts a learner, samplers and, under torchrun, one of each per rank.

``install()`` (sample_fast/__init__.py) puts a finder on ``sys.meta_path`` that, when tensordict is first imported,
swaps those two functions for ones that record their argument and return it unchanged -- what both do -- and swaps
them back when the import ends. When ``torch._dynamo`` is imported later (a ``torch.compile`` anywhere), the
recorded functions are given to its own ``allow_in_graph`` / ``assume_constant_result`` right after it loads, so
dynamo ends in the state it would have had. ``SAMPLE_FAST_EAGER_DYNAMO=1`` turns this off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

_MARKERS = ("allow_in_graph", "assume_constant_result")
_pending: list[tuple[str, Any]] = []


def _replay(dynamo: Any) -> None:
    if dynamo is None:  # its import failed: that error propagates (torch.compile cannot run without it)
        return
    while _pending:
        name, fn = _pending.pop(0)
        getattr(dynamo, name)(fn)


def _wrap_exec(spec: importlib.machinery.ModuleSpec, before: Any, after: Any) -> None:
    exec_module = spec.loader.exec_module

    def run(module: Any) -> None:
        state = before()
        try:
            exec_module(module)
        finally:
            after(state)

    spec.loader.exec_module = run


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loading of ``tensordict`` (markers deferred) and then of ``torch._dynamo`` (markers replayed)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in ("tensordict", "torch._dynamo"):
            return None
        spec = next((s for f in sys.meta_path if f is not self and (s := _find(f, name, path, target))), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if name == "tensordict":
            _wrap_exec(spec, _defer_markers, _restore_markers)
        else:
            _uninstall()
            _wrap_exec(spec, lambda: None, lambda _: _replay(sys.modules.get("torch._dynamo")))
        return spec


def _find(finder: Any, name: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
    find = getattr(finder, "find_spec", None)
    return find(name, path, target) if find is not None else None


def _defer_markers() -> dict[str, Any]:
    import torch.compiler

    originals = {n: getattr(torch.compiler, n) for n in _MARKERS}

    def deferred(name: str) -> Any:
        def mark(fn: Any) -> Any:
            if "torch._dynamo" in sys.modules:
                return originals[name](fn)
            _pending.append((name, fn))
            return fn

        return mark

    for n in _MARKERS:
        setattr(torch.compiler, n, deferred(n))
    return originals


def _restore_markers(originals: dict[str, Any]) -> None:
    import torch.compiler

    for n, fn in originals.items():
        setattr(torch.compiler, n, fn)
    if "torch._dynamo" in sys.modules:  # something else imported it meanwhile: mark now
        _replay(sys.modules["torch._dynamo"])
        _uninstall()


def _uninstall() -> None:
    for f in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(f)


def install() -> None:
    """Defer tensordict's compile markers unless tensordict or torch._dynamo is loaded already (or turned off)."""
    if os.environ.get("SAMPLE_FAST_EAGER_DYNAMO", "") not in ("", "0"):
        return
    if "tensordict" in sys.modules or "torch._dynamo" in sys.modules:
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
