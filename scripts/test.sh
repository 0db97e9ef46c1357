#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest (e.g. --runslow, -k mujoco).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MUJOCO_GL=${MUJOCO_GL:-egl}
# MuJoCo Warp kernels compile once into this ignored folder; a CI that keeps .cache/ between runs skips the compile.
export WARP_CACHE_PATH=${WARP_CACHE_PATH:-$PWD/.cache/warp}
exec .venv/bin/python -m pytest -q "$@"
