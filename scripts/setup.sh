#!/usr/bin/env bash
# Builds the project-local virtualenv .venv and installs sample_fast into it (editable), with every backend that
# installs on this machine. Safe to rerun. Never pulls a CUDA build of torch onto a machine without a GPU:
# torch is installed first, pinned (the CPU wheel where no NVIDIA driver is present), so the package's own
# `torch>=...` requirement is already satisfied when pip resolves it.
#   bash scripts/setup.sh            # CPU or GPU, auto-detected
#   TORCH_SPEC="torch==2.13.0" bash scripts/setup.sh   # choose the torch build yourself
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "sample_fast needs Python >= 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
if [ -z "${TORCH_SPEC:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    TORCH_SPEC="torch"            # a GPU is present: the default (CUDA) build is what the user wants
  else
    TORCH_SPEC="torch==2.13.0"    # the CPU wheel; an unpinned torch would drag in a multi-GB CUDA build
  fi
fi
# PERF: pip byte-compiles every file it installs, one after the other, on one core (about a third of set-up). The
# installs below skip that (--no-compile) and compileall does it on the other cores: torch's files while pip
# unpacks everything else, the rest at the end with every core (benchmarks/results/test_suite_time/README.md).
# The .pyc files matter here: with PYTHONDONTWRITEBYTECODE=1 (as in this project's CI) nothing is cached at import.
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
COMPILE_PID=
stop_compile() { if [ -n "$COMPILE_PID" ]; then kill "$COMPILE_PID" 2>/dev/null || true; fi; }
# A background job of a script ignores Ctrl-C (SIGINT), so these traps stop it on every way out.
trap stop_compile EXIT
trap 'stop_compile; exit 130' INT
trap 'stop_compile; exit 143' TERM
if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: installing $TORCH_SPEC"
  before=$(ls "$SITE")
  "$VPY" -m pip install -q --no-compile "$TORCH_SPEC"
  # what this install added (torch and its dependencies), compiled while pip goes on with the other packages
  added=()
  while IFS= read -r name; do added+=("$SITE/$name"); done < <(comm -13 <(echo "$before") <(ls "$SITE") | grep -v '[.]dist-info$')
  if [ ${#added[@]} -gt 0 ]; then
    "$VPY" -m compileall -q -j 1 "${added[@]}" >/dev/null 2>&1 &  # python itself, so the EXIT trap can stop it
    COMPILE_PID=$!
  fi
fi
echo "setup: installing sample_fast (editable) and its dependencies"
"$VPY" -m pip install -q --no-compile -e ".[dev]"
# MuJoCo Warp (the warp backend) is pinned in pyproject.toml; installed again here with the pin spelled out so a
# stale venv moves to it (docs/warp.md: moving the pin). -c keeps pip from touching the torch installed above.
WARP_PINS="mujoco-warp==4.0.0 warp-lang==1.19.0"
# shellcheck disable=SC2086  # WARP_PINS is a list of requirements
"$VPY" -m pip install -q --no-compile $WARP_PINS -c <("$VPY" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])')
# EnvPool is optional: it ships wheels for Linux x86_64 only. CI installs it whenever it can.
if ! "$VPY" -m pip install -q --no-compile "envpool>=1.2" 2>/dev/null; then
  echo "setup: envpool did not install on this platform; its backend and tests are skipped"
fi
echo "setup: byte-compiling the installed packages"
if [ -n "$COMPILE_PID" ]; then
  wait "$COMPILE_PID" || true
  COMPILE_PID=
fi
# every core; files compiled before are skipped (their .pyc is up to date); a file that does not compile is skipped,
# as pip skips it (compileall's exit status then says 1)
"$VPY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
"$VPY" -c 'import torch; assert torch.__version__, "torch missing"; print("setup: torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")'
echo "setup: done. Activate with: source .venv/bin/activate"
