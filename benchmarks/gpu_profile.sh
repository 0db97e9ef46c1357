#!/usr/bin/env bash
# The one prepared GPU command of sample_fast: sets up Python, then runs each GPU measurement as its own section with
# its own timeout, so one hung or slow section cannot eat the others' time. Fits in 10 minutes on one H200 (16 CPU
# cores) from a fresh machine. Results (JSON + Markdown) and the log go to $OUT when set, else benchmarks/results/.
#
#   bash benchmarks/gpu_profile.sh                 # run everything (from the repo root)
#   bash benchmarks/gpu_profile.sh --fetch-wheels  # on a machine WITH pip access: put the wheels the GPU machine
#                                                  # lacks into .whl/ (Python 3.12, x86-64), for offline machines
#   SECTIONS="setup mjx_fast" bash benchmarks/gpu_profile.sh   # only some sections
#
# Python set-up (section "setup"), first that applies:
#   1. $SF_PYTHON is set: use that interpreter as is.
#   2. python3 already has a CUDA jax and a CUDA torch (the H200 image): the wheels it lacks -- from .whl/ when it
#      exists (offline machines; `--fetch-wheels` here), else from PyPI -- and this project go into one --target
#      folder on PYTHONPATH (benchmarks/gpu_setup.sh; the image's python3 is itself a venv, so a
#      --system-site-packages venv made from it would not see its torch and jax).
#   3. otherwise: a fresh venv with pip: jax[cuda12], torch (CUDA build), mujoco, mujoco-mjx, numba, numba-cuda, and
#      the project with `pip install -e . --no-deps`.
#
# Adding a section (other components): write a function `section_<name>` below and add <name> to ALL_SECTIONS with
# its timeout in seconds; keep the sum of timeouts under 570 s. Use "$PY" and write results under "$OUT_DIR".
set -u
cd "$(dirname "$0")/.."
REPO="$(pwd)"
OUT_DIR="${OUT:-$REPO/benchmarks/results}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_profile.log"
VENV="${SF_VENV:-/tmp/sf-gpu-venv}"
WHEELS="$REPO/.whl"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# JAX would otherwise reserve 75% of GPU memory up front and leave torch little; MJX allocates what it needs.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/sf-jax-cache}"

# The wheels the H200 image lacks, and their install: benchmarks/gpu_setup.sh (shared by every GPU script).
# shellcheck source=benchmarks/gpu_setup.sh
. "$REPO/benchmarks/gpu_setup.sh"
SITE=/tmp/sf-gpu-site
if [ "${1:-}" = "--fetch-wheels" ]; then
  gpu_fetch_wheels "$WHEELS"
  exit 0
fi

exec > >(tee -a "$LOG") 2>&1
echo "gpu_profile: $(date -u +%FT%TZ) host $(hostname), out $OUT_DIR"

PY=python3
PY_FILE=/tmp/sf-gpu-python  # the setup section (a child process under timeout) writes the interpreter it chose
[ -f "$PY_FILE" ] && PY="$(cat "$PY_FILE")"  # a previous run's set-up, when SECTIONS skips "setup"

section_setup() {
  local PY
  rm -rf "$SITE"
  if [ -n "${SF_PYTHON:-}" ]; then
    echo "$SF_PYTHON" > "$PY_FILE"
    echo "setup: using \$SF_PYTHON=$SF_PYTHON as is"
    return 0
  elif python3 -c "import jax, torch; assert jax.devices('gpu') and torch.cuda.is_available()" 2>/dev/null; then
    echo "setup: python3 has CUDA jax + torch; the rest into $SITE"
    gpu_install_site python3 "$SITE" "$WHEELS" "$REPO" || return 1
    echo python3 > "$PY_FILE"
    return 0
  fi
  # jax 0.10's CUDA wheels: extras cuda13 (current; matches PyPI's default Linux torch, built for CUDA 13) and
  # cuda12 (older drivers). PyPI's Linux torch wheel is the CUDA build.
  echo "setup: building a fresh venv at $VENV (jax[cuda13], CUDA torch, mujoco-mjx, numba)"
  python3 -m venv "$VENV" || return 1
  PY="$VENV/bin/python"
  "$PY" -m pip install -q "jax[cuda13]==0.10.2" || "$PY" -m pip install -q "jax[cuda12]==0.10.2" || return 1
  "$PY" -m pip install -q torch mujoco mujoco-mjx gymnasium numba numba-cuda pytest pytest-timeout || return 1
  "$PY" -m pip install -q --no-deps --no-build-isolation -e "$REPO" || return 1
  echo "$PY" > "$PY_FILE"
  echo "setup: using $PY"
}

section_sanity() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  cd /tmp || return 1  # not the repo: its ./sample_fast would shadow the installed copy (benchmarks/gpu_setup.sh)
  "$PY" - <<'EOF'
import jax, torch, mujoco
from mujoco import mjx  # noqa: F401
import sample_fast.envs
print("jax", jax.__version__, jax.devices(), "| torch", torch.__version__, torch.cuda.is_available(),
      "| mujoco", mujoco.__version__)
assert jax.devices("gpu") and torch.cuda.is_available(), "no GPU seen by jax or torch"
# DLPack hand-off on the GPU: the torch tensor must alias the XLA buffer.
x = jax.device_put(jax.numpy.arange(8.0), jax.devices("gpu")[0])
t = torch.from_dlpack(x)
print("dlpack zero-copy on cuda:", t.device, t.data_ptr() == x.unsafe_buffer_pointer())
EOF
}

# MJX Ant: env-only steps/s and compile time at 1024..65536 envs; MuJoCo C (all 16 cores) at 1024 for the ratio.
section_mjx_fast() {
  "$PY" "$REPO/benchmarks/bench_mjx.py" --device cuda --batch-sizes 1024,4096,16384,65536 --option-sets fast \
    --seconds 5 --case-timeout-s 110 --c-batch-sizes 1024 --out "$OUT_DIR" --name mjx_gpu_fast
}

section_mjx_gymnasium() {
  "$PY" "$REPO/benchmarks/bench_mjx.py" --device cuda --batch-sizes 1024,4096,16384,65536 --option-sets gymnasium \
    --seconds 5 --case-timeout-s 110 --c-batch-sizes 1024 --out "$OUT_DIR" --name mjx_gpu_gymnasium
}

# name:timeout_s, in run order (the MJX speed settings first: they are the ones training on a GPU would use).
ALL_SECTIONS="setup:150 sanity:40 mjx_fast:180 mjx_gymnasium:190"

run_section() {
  local name=$1 limit=$2 t0 rc
  t0=$(date +%s)
  echo "=== [$name] start $(date -u +%T), timeout ${limit}s"
  export -f "section_$name" gpu_install_site
  export PY REPO OUT_DIR VENV WHEELS PY_FILE SITE GPU_WHEELS
  timeout --kill-after=10 "$limit" bash -c "section_$name"
  rc=$?
  if [ "$name" = setup ] && [ $rc -eq 0 ]; then
    PY="$(cat "$PY_FILE")"
    [ -d "$SITE" ] && export PYTHONPATH="$SITE"
  fi
  echo "=== [$name] rc=$rc after $(( $(date +%s) - t0 ))s"
  return $rc
}

WANT="${SECTIONS:-}"
for entry in $ALL_SECTIONS; do
  name=${entry%%:*}
  limit=${entry##*:}
  if [ -n "$WANT" ] && ! [[ " $WANT " == *" $name "* ]]; then
    continue
  fi
  if ! run_section "$name" "$limit" && [ "$name" = setup ]; then
    echo "setup failed; the other sections need it. Stopping."
    exit 1
  fi
done
echo "gpu_profile: done $(date -u +%FT%TZ); results in $OUT_DIR"
