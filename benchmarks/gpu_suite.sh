#!/usr/bin/env bash
# GPU profile of sample_fast in under 10 minutes: MuJoCo Warp's kernel compile time (empty cache, then cached), then
# the FPS suite's GPU preset (Ant at 4096-65536 envs) for each stage -- env only, + inference, + training -- and each
# device simulator (mjx, warp), then the advantage kernels on CUDA. Every section has its own timeout (SIGINT first,
# so the suite writes what it measured, then SIGKILL), so one hang cannot eat the budget; the timeouts add up to
# 530 s. Rows carry steps/s, compile_s and GPU memory (gpu_mem_used_gib: the driver's used memory, all allocators).
#   bash benchmarks/gpu_suite.sh                    # on a CUDA machine; results in $OUT (gpu_suite.md + an archive)
#                                                   # or benchmarks/results/gpu-<date>-<host>/
#   GPU_SUITE_SMOKE=1 bash benchmarks/gpu_suite.sh  # the same script on the CPU with tiny sizes (proves it works)
#   GPU_SUITE_BACKENDS=warp bash benchmarks/gpu_suite.sh   # one device simulator only (default: "mjx warp")
# Extra arguments are Hydra overrides passed to every suite section, e.g. `num_envs=[4096,16384]`.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# With $OUT (the device tool, which brings back at most 8 files, 2 folders down) the sections write to a work folder,
# and $OUT gets gpu_suite.md plus one archive of every result file (no kernel cache, no checkpoints).
OUT_DIR=${OUT:+/tmp/sf-gpu-suite}
[ -n "${OUT:-}" ] && rm -rf "$OUT_DIR"  # a rerun on the same machine must not archive the last run's files
OUT_DIR=${OUT_DIR:-$REPO/benchmarks/results/gpu-$(date -u +%Y-%m-%d)-$(hostname)}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# Python: $PYTHON, else the project's .venv (scripts/setup.sh), else -- the lent GPU machine, where neither exists --
# python3 with the carried wheels (.whl/, `bash benchmarks/gpu_pong.sh --fetch-wheels` here) and this project
# installed into one folder on PYTHONPATH (benchmarks/gpu_setup.sh). The sections run from $OUT_DIR, not the repo,
# whose ./sample_fast would shadow that installed copy.
PY=${PYTHON:-$REPO/.venv/bin/python}
if [ ! -x "$PY" ]; then
  # shellcheck source=benchmarks/gpu_setup.sh
  . "$REPO/benchmarks/gpu_setup.sh"
  PY=python3
  export -f gpu_install_site
  export GPU_WHEELS
  timeout 120 bash -c 'gpu_install_site "$@"' _ "$PY" /tmp/sf-gpu-site "$REPO/.whl" "$REPO" \
    || { echo "gpu_suite: set-up failed (or took over 120 s)"; exit 1; }
  export PYTHONPATH=/tmp/sf-gpu-site
fi
cd "$OUT_DIR" || exit 1
export MUJOCO_GL=${MUJOCO_GL:-egl}
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX and torch share the GPU: no 75% grab by JAX
BACKENDS=${GPU_SUITE_BACKENDS:-mjx warp}
if [[ " $BACKENDS " == *" warp "* ]] && ! "$PY" -c "import warp" 2>/dev/null; then
  # warp-lang's wheel (149 MB) is more than the device tool carries in one call (64 MiB): no warp there unless the
  # machine has it
  echo "gpu_suite: warp does not import here; its sections are skipped"
  BACKENDS=${BACKENDS//warp/}
fi
# Warp's kernel cache for this run: empty at first, so the compile section measures a cold compile and fills it for
# every later section (each suite case is a fresh process that loads the kernels from it).
WARP_CACHE=${WARP_CACHE:-$OUT_DIR/warp-kernels}

if [ "${GPU_SUITE_SMOKE:-0}" = "1" ]; then
  # CPU, tiny: every section and every file the real run writes, in about a minute.
  SIZES="device=cpu num_envs=[8] repeats=1 seconds_per_repeat=0.3 warmup_s=0 peers=[] measure_timeout_s=240"
  SIZES="$SIZES train.rollout_len=8"
  T_WARP=300; T_ENV=300; T_INF=300; T_TRAIN=300; T_ADV=120
  ADV_ARGS="--device cpu --quick --num-envs 256 --rounds 5 --out $OUT_DIR/advantages_smoke"
  WARP_ARGS="--device cpu --quick --no-mujoco"
else
  SIZES=""
  # per backend: 2 x (60 + 60 + 80) s, + 100 s warp compile + 30 s advantages = 530 s of sections (+ start-up) < 10 min
  T_WARP=100; T_ENV=60; T_INF=60; T_TRAIN=80; T_ADV=30
  ADV_ARGS="--device cuda --out $OUT_DIR/advantages_cuda"
  WARP_ARGS="--device cuda --batch-sizes 4096 --seconds 2 --no-mujoco"
fi

status=0
section() {  # section <name> <timeout_s> <command...>
  local name=$1 limit=$2; shift 2
  echo "=== gpu_suite: $name (timeout ${limit}s) ==="
  local t0=$SECONDS
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  local rc=$?
  echo "=== gpu_suite: $name: exit $rc after $((SECONDS - t0)) s ==="
  [ $rc -eq 0 ] || status=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null > "$OUT_DIR/gpu.csv" || true
if [[ " $BACKENDS " == *" warp "* ]]; then
  mkdir -p "$WARP_CACHE"
  # shellcheck disable=SC2086  # WARP_ARGS is a list of arguments
  section "warp kernel compile" "$T_WARP" "$PY" "$REPO/benchmarks/bench_warp.py" $WARP_ARGS --cache-dir "$WARP_CACHE" \
    --out "$OUT_DIR" --name warp_compile
fi
for stage in env inference train; do
  case $stage in env) limit=$T_ENV ;; inference) limit=$T_INF ;; train) limit=$T_TRAIN ;; esac
  for backend in $BACKENDS; do
    # shellcheck disable=SC2086  # SIZES is a list of overrides
    section "suite $stage $backend" "$limit" "$PY" -m sample_fast.benchmark preset=gpu "stages=[$stage]" \
      "backends=[$backend]" "++backend_options.warp.kernel_cache_dir=$WARP_CACHE" \
      "out_dir=$OUT_DIR" "out_name=gpu_${stage}_$backend" \
      "title=sample_fast GPU suite: $stage stage on $backend" progress=false $SIZES "$@"
  done
done
if [ -f "$REPO/benchmarks/bench_advantages.py" ]; then
  # shellcheck disable=SC2086
  section "advantage kernels" "$T_ADV" "$PY" "$REPO/benchmarks/bench_advantages.py" $ADV_ARGS
else
  echo "gpu_suite: benchmarks/bench_advantages.py not found; advantage kernels skipped"
fi
# --- distributed=ddp, 1 rank on a real NCCL group (docs/distributed.md): the wrapper's overhead against the same
# training run in one process. GPU_SUITE_DDP=0 skips it. Each run: its own run dir, progress.csv and exit line.
if [ "${GPU_SUITE_DDP:-1}" = "1" ]; then
  if [ "${GPU_SUITE_SMOKE:-0}" = "1" ]; then
    DDP_ARGS="env=toy run.device=cpu"; DDP_S=15; T_DDP=120
  else
    DDP_ARGS="env=ant"; DDP_S=60; T_DDP=150
  fi
  for ddp_case in plain ddp; do
    ddp_dir="$OUT_DIR/distributed_$ddp_case"
    if [ $ddp_case = plain ]; then ddp_cmd=("$PY" -m sample_fast.train)
    else ddp_cmd=("$PY" -m torch.distributed.run --nproc_per_node=1 -m sample_fast.train distributed=ddp); fi
    # shellcheck disable=SC2086  # DDP_ARGS is a list of overrides
    section "distributed $ddp_case (1 rank)" "$T_DDP" "${ddp_cmd[@]}" $DDP_ARGS "run.dir=$ddp_dir" \
      run.total_env_steps=1e10 "run.time_limit_s=$DDP_S" logging.progress=plain logging.interval_s=5 \
      logging.tensorboard=false logging.plot=false > "$OUT_DIR/distributed_$ddp_case.log" 2>&1
    tail -3 "$OUT_DIR/distributed_$ddp_case.log"
  done
  {
    echo "## distributed=ddp, 1 rank vs 1 process ($DDP_ARGS, ${DDP_S} s each; progress.csv fps rows)"
    for ddp_case in plain ddp; do
      echo "- $ddp_case: $(grep -E '^steps ' "$OUT_DIR/distributed_$ddp_case.log" | tail -2 | head -1)"
    done
  } > "$OUT_DIR/distributed.md"
fi
{
  echo "# sample_fast GPU suite ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname))"
  echo
  for f in "$OUT_DIR"/warp_compile.md "$OUT_DIR"/gpu_env_*.md "$OUT_DIR"/gpu_inference_*.md "$OUT_DIR"/gpu_train_*.md \
    "$OUT_DIR"/advantages_*.md "$OUT_DIR"/distributed.md; do
    [ -f "$f" ] && { cat "$f"; echo; }
  done
} > "$OUT_DIR/gpu_suite.md"
if [ -n "${OUT:-}" ]; then
  cp "$OUT_DIR/gpu_suite.md" "$OUT/"
  tar czf "$OUT/gpu_suite_files.tar.gz" --exclude=warp-kernels --exclude=checkpoints --exclude='*.pt' -C "$OUT_DIR" .
  OUT_DIR=$OUT
fi
echo "gpu_suite: results in $OUT_DIR (summary: $OUT_DIR/gpu_suite.md)"
exit $status
