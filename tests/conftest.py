"""Shared test settings: ``slow`` tests run only with --runslow; ``gpu`` tests only with a CUDA device. The
``load_bench`` fixture imports a script of ``benchmarks/`` by name."""

import importlib.util
import os
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    skip_gpu = pytest.mark.skip(reason="gpu: no CUDA device on this machine")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture
def load_bench():
    """``load_bench("bench_envs")``: the module ``benchmarks/bench_envs.py`` (benchmarks/ is not a package)."""

    def load(name: str):
        path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
