"""The exact pins of pyproject.toml: the physics and compiler packages are pinned with ``==`` (docs/mjx.md and
docs/warp.md, "Versions"), the environment set-up built has exactly the pinned versions, and the other places that
name those versions (the warp backend's record, the GPU scripts' wheel list) say the same."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A new release of any of these changes physics results or compile time and speed, or (tensordict, torchrl: pre-1.0)
#: the slot store's and the adapters' behaviour, so each is pinned exactly.
MUST_PIN = ("mujoco", "mujoco-mjx", "mujoco-warp", "warp-lang", "jax", "jaxlib", "tensordict", "torchrl")


def _requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])


def _exact_pins() -> dict[str, str]:
    pins = {}
    for req in _requirements():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^;,\s]+)", req.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(3)
    return pins


def test_the_physics_and_compiler_packages_are_pinned_exactly():
    pins = _exact_pins()
    assert [p for p in MUST_PIN if p not in pins] == [], "pin these with == in pyproject.toml (docs/mjx.md: Versions)"


def test_the_installed_versions_are_the_pins():
    wrong = {}
    for pkg, want in _exact_pins().items():
        have = importlib.metadata.version(pkg)
        if have != want:
            wrong[pkg] = (have, want)
    assert wrong == {}, f"installed vs pinned (rerun bash scripts/setup.sh): {wrong}"


def test_the_warp_record_and_the_gpu_wheels_name_the_same_versions():
    from sample_fast.envs import warp_env

    pins = _exact_pins()
    assert {k: pins[k] for k in warp_env.PINNED_VERSIONS} == warp_env.PINNED_VERSIONS
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert all(f"{k}=={v}" in setup for k, v in warp_env.PINNED_VERSIONS.items())  # WARP_PINS
    gpu = re.search(r'GPU_WHEELS="([^"]*)"', (ROOT / "benchmarks" / "gpu_setup.sh").read_text()).group(1)
    gpu_pins = dict(w.split("==") for w in gpu.split())
    shared = {"mujoco", "mujoco-mjx", "mujoco-warp", "tensordict", "torchrl"}
    assert {k: gpu_pins[k] for k in shared} == {k: pins[k] for k in shared}
    assert gpu_pins["mujoco-core"] == gpu_pins["mujoco-studio"] == pins["mujoco"]  # mujoco 4 requires them equal
