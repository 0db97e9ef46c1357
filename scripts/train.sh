#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and trains. Arguments are Hydra overrides, e.g. `bash scripts/train.sh env=ant`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m sample_fast.train "$@"
