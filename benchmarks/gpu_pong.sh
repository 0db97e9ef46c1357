#!/usr/bin/env bash
# GPU Pong (issue #15): `python -m sample_fast.train env=pong` on a lent GPU machine (one H200, 16 CPU cores). The
# emulator runs on the CPU (ale-py's AtariVectorEnv, C++ threads: its ROMs are in its wheel, unlike EnvPool's 140 MB
# asset package, so the carried wheels stay small); the policy acts (sampler.device=auto: the learner's GPU for a CNN)
# and learns on the GPU, bf16 autocast. It reports the wall-clock time to a mean score of 0 / +18 / +20 over the
# last 100 games and the env steps/s. Goal: +20 in under 2 minutes (rl_games + EnvPool report about 2 minutes on one
# RTX 3090, without sticky actions; env=pong keeps the v5 default of 0.25). About 7 minutes, at most 525 s of sections.
#
#   bash benchmarks/gpu_pong.sh --fetch-wheels     # HERE, with pip access: the wheels the GPU image lacks -> .whl/
#                                                  # (benchmarks/gpu_setup.sh: one set for every GPU script)
#   bash benchmarks/gpu_pong.sh                    # THERE, from the repo root (device tool: carry .whl); $OUT or
#                                                  # benchmarks/results/gpu_pong-<date>/ gets the results
#   GPU_PONG_SMOKE=1 bash benchmarks/gpu_pong.sh   # the same sections on the CPU with tiny sizes (~1 minute)
#
# Files written (8 at most, for the device tool): gpu_pong.log, gpu.csv (nvidia-smi), progress.csv, config.yaml and
# meta.json of the run, race.md + race.png (benchmarks/pong_race.py: times to each score), summary.md.
# The recipe is env=pong's (CleanRL's ppo_atari on APPO) with sizes for 16 cores and a GPU learner: 256 envs (2
# groups of 128), rollout 128, minibatches of 1024 samples (16 per batch), 4 epochs. Not yet run on a GPU.
set -u
cd "$(dirname "$0")/.."
REPO="$(pwd)"
OUT_DIR="${OUT:-$REPO/benchmarks/results/gpu_pong-$(date -u +%Y-%m-%d)}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_pong.log"
WHEELS="${GPU_PONG_WHEELS:-$REPO/.whl}"
RUN_DIR="${GPU_PONG_RUN_DIR:-/tmp/sf-gpu-pong-run}"  # checkpoints and TensorBoard stay out of $OUT (8 files)
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 MUJOCO_GL=egl

# shellcheck source=benchmarks/gpu_setup.sh
. "$REPO/benchmarks/gpu_setup.sh"
if [ "${1:-}" = "--fetch-wheels" ]; then
  gpu_fetch_wheels "$WHEELS"
  exit 0
fi

exec > >(tee -a "$LOG") 2>&1
echo "gpu_pong: $(date -u +%FT%TZ) host $(hostname), out $OUT_DIR"

if [ "${GPU_PONG_SMOKE:-0}" = "1" ]; then
  DEVICE=cpu; LIMIT_S=25
  SIZES="env.num_envs=4 env.num_threads=1 sampler.rollout_len=8 learner.num_minibatches=2 logging.interval_s=2"
else
  DEVICE=cuda; LIMIT_S=300
  SIZES="env.num_envs=256 learner.num_minibatches=16 logging.interval_s=5"
fi

PY_FILE=/tmp/sf-pong-python
SITE=/tmp/sf-gpu-site  # the wheels and this project, installed with --target (benchmarks/gpu_setup.sh)
section_setup() {
  if [ -n "${SF_PYTHON:-}" ]; then
    rm -rf "$SITE"; echo "$SF_PYTHON" > "$PY_FILE"; echo "setup: using \$SF_PYTHON=$SF_PYTHON as is"; return 0
  fi
  if [ "${GPU_PONG_SMOKE:-0}" = "1" ] && [ "${GPU_PONG_SETUP:-}" != "wheels" ] && [ -x "$REPO/.venv/bin/python" ]; then
    rm -rf "$SITE"; echo "$REPO/.venv/bin/python" > "$PY_FILE"; echo "setup: the smoke run uses .venv (scripts/setup.sh)"
    return 0
  fi
  local py=${GPU_PONG_PYTHON:-python3}
  gpu_install_site "$py" "$SITE" "$WHEELS" "$REPO" && echo "$py" > "$PY_FILE"
}

section_sanity() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT_DIR/gpu.csv" 2>/dev/null || true
  cd /tmp || return 1  # not the repo (benchmarks/gpu_setup.sh)
  "$PY" - "$DEVICE" <<'EOF'
import sys, time
import torch
from sample_fast.envs import make
device = sys.argv[1]
import sample_fast
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "| sample_fast from", sample_fast.__file__)
assert device == "cpu" or torch.cuda.is_available(), "no CUDA device seen by torch"
with make("Pong-v5", 16, backend="ale", seed=0) as env:
    obs, _ = env.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(100):
        env.step(torch.randint(0, env.action_spec.num_actions, (16,)))
    print(f"ale Pong-v5, 16 envs: obs {tuple(obs.shape)} {obs.dtype}, {1600 / (time.perf_counter() - t0):,.0f} env steps/s")
EOF
}

section_pong() {
  rm -rf "$RUN_DIR" && mkdir -p "$RUN_DIR" && cd "$RUN_DIR" || return 1  # not the repo (gpu_setup.sh)
  # shellcheck disable=SC2086  # SIZES is a list of overrides
  "$PY" -m sample_fast.train env=pong env.backend=ale run.device="$DEVICE" run.dir="$RUN_DIR" \
    run.time_limit_s="$LIMIT_S" logging.progress=plain logging.tensorboard=false $SIZES
  local rc=$?
  for f in progress.csv config.yaml meta.json; do cp "$RUN_DIR/$f" "$OUT_DIR/" 2>/dev/null; done
  return $rc
}

section_report() {
  "$PY" "$REPO/benchmarks/pong_race.py" --ours "$OUT_DIR/progress.csv" --out "$OUT_DIR/race" \
    --title "Pong-v5, env=pong on one GPU ($DEVICE; $SIZES)" || return 1
  {
    echo "# GPU Pong ($(date -u +%FT%TZ), $(hostname))"
    echo
    echo "Command: python -m sample_fast.train env=pong env.backend=ale run.device=$DEVICE run.time_limit_s=$LIMIT_S $SIZES"
    echo
    cat "$OUT_DIR/race.md"
  } > "$OUT_DIR/summary.md"
}

# name:timeout_s, in run order; the Pong run's limit is its own time limit plus start-up and the final checkpoint.
# Worst case 525 s: inside the device tool's 600 s per command.
ALL_SECTIONS="setup:90 sanity:45 pong:$((LIMIT_S + 60)) report:30"

PY=python3
status=0
for entry in $ALL_SECTIONS; do
  name=${entry%%:*}
  limit=${entry##*:}
  t0=$(date +%s)
  echo "=== [$name] start $(date -u +%T), timeout ${limit}s"
  export -f "section_$name" gpu_install_site
  export PY REPO OUT_DIR WHEELS PY_FILE SITE RUN_DIR DEVICE LIMIT_S SIZES GPU_WHEELS
  # SIGINT first: the trainer writes its final checkpoint and progress rows, then exits
  timeout --signal=INT --kill-after=30 "$limit" bash -c "section_$name"
  rc=$?
  echo "=== [$name] rc=$rc after $(( $(date +%s) - t0 ))s"
  if [ "$name" = setup ]; then
    [ $rc -eq 0 ] || { echo "setup failed; the other sections need it. Stopping."; exit 1; }
    PY="$(cat "$PY_FILE")"
    [ -d "$SITE" ] && export PYTHONPATH="$SITE"
  fi
  [ $rc -eq 0 ] || status=1
done
echo "gpu_pong: done $(date -u +%FT%TZ); results in $OUT_DIR"
exit $status
