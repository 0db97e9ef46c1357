#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest (e.g. --runslow, -k mujoco).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MUJOCO_GL=${MUJOCO_GL:-egl}
# MuJoCo Warp kernels compile once into this ignored folder; a CI that keeps .cache/ between runs skips the compile.
export WARP_CACHE_PATH=${WARP_CACHE_PATH:-$PWD/.cache/warp}
# Two pytest-xdist workers: alone, the suite keeps one core busy for most of its second half (its multi-process tests
# mostly wait on one process at a time); two workers keep both busy (937 -> 714 s on a 2-core host:
# benchmarks/results/test_suite_time/).
# SAMPLE_FAST_TEST_WORKERS=0 runs it in one process (the MJX compile jobs then run in the background, conftest.py).
exec .venv/bin/python -m pytest -q -n "${SAMPLE_FAST_TEST_WORKERS:-2}" --dist worksteal "$@"
