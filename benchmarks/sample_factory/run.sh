#!/usr/bin/env bash
# Runs Sample Factory's APPO on a MuJoCo task in .venv-sf for a bounded number of env steps, kills every process it
# started, and prints its non-overlapping 10-s FPS windows (the same code path as the suite's `sample_factory` peer).
#   bash benchmarks/sample_factory/setup_venv.sh       # once
#   bash benchmarks/sample_factory/run.sh --env ant --env-steps 300000 --timeout-s 300
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
if [ ! -x .venv-sf/bin/python ]; then
  echo "run.sh: no .venv-sf; build it with: bash benchmarks/sample_factory/setup_venv.sh" >&2
  exit 2
fi
exec "$PY" -m sample_fast.benchmark.sample_factory_peer "$@"
