#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest (e.g. --runslow, -k mujoco).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MUJOCO_GL=${MUJOCO_GL:-egl}
exec .venv/bin/python -m pytest -q "$@"
