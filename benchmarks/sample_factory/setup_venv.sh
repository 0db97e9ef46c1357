#!/usr/bin/env bash
# Builds Sample Factory's own virtualenv at .venv-sf/ (repository root), for the `sample_factory` peer of
# `python -m sample_fast.benchmark`. Sample Factory 2.1.1 pins numpy<2 and gymnasium<1, so it cannot share
# sample_fast's .venv. Safe to rerun; does nothing when the venv already imports sample_factory.
#   bash benchmarks/sample_factory/setup_venv.sh
#   TORCH_SPEC="torch==2.13.0" PYTHON=python3.11 bash benchmarks/sample_factory/setup_venv.sh
# Order matters (see docs/benchmark.md): torch first and pinned (the CPU wheel where there is no GPU; an unpinned
# torch would pull a multi-GB CUDA build), then sample-factory (it brings gymnasium 0.29 and numpy 1.26), then
# mujoco and imageio (gymnasium 0.29's Ant-v4 needs imageio at import), then ale-py 0.9.1 for its Atari example (the
# newest ale-py for gymnasium 0.29; it ships the ROMs, so nothing is downloaded) with a .pth that imports it in every
# process of the venv: gymnasium 0.29 does not load ale-py's envs by itself, and SF's spawned workers call gym.make.
# Last, sample_fast_sf_sticky.py (beside this script) goes into site-packages with a .pth that imports it: with
# SAMPLE_FAST_SF_STICKY=<p> set, SF's *NoFrameskip-v4 envs get sticky actions p (benchmarks/sf_pong_race.py sets
# 0.25, env=pong's value); without it, nothing changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VENV=${SF_VENV:-.venv-sf}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
SF_SPEC=${SF_SPEC:-sample-factory==2.1.1}
MUJOCO_SPEC=${MUJOCO_SPEC:-mujoco==4.0.0}
ALE_SPEC=${ALE_SPEC:-ale-py==0.9.1}
HERE=benchmarks/sample_factory
install_sticky_hook() {
  local site
  site=$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp "$HERE/sample_fast_sf_sticky.py" "$site/sample_fast_sf_sticky.py"
  printf 'import sample_fast_sf_sticky\n' > "$site/sample_fast_sf_sticky.pth"
}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sample_factory, sf_examples.mujoco, mujoco, torch, gymnasium; gymnasium.make("PongNoFrameskip-v4")' >/dev/null 2>&1; then
  install_sticky_hook "$VENV/bin/python"  # cheap; keeps an older venv's copy of the hook current
  echo "setup_venv: $VENV already has Sample Factory $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sample-factory"))')"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Keep the venv out of git without touching the project's .gitignore.
printf '*\n' > "$VENV/.gitignore"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
echo "setup_venv: installing $TORCH_SPEC"
"$VPY" -m pip install -q "$TORCH_SPEC"
echo "setup_venv: installing $SF_SPEC"
"$VPY" -m pip install -q "$SF_SPEC"
echo "setup_venv: installing $MUJOCO_SPEC imageio"
"$VPY" -m pip install -q "$MUJOCO_SPEC" imageio
echo "setup_venv: installing $ALE_SPEC"
"$VPY" -m pip install -q "$ALE_SPEC"
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf 'import ale_py\n' > "$SITE/sample_fast_register_ale.pth"
install_sticky_hook "$VPY"
SAMPLE_FAST_SF_STICKY=0.25 "$VPY" -c 'import sample_fast_sf_sticky as s; p = s.check(); assert p == 0.25, p' \
  || { echo "setup_venv: the sticky-actions hook did not take effect" >&2; exit 1; }
"$VPY" -c 'import importlib.metadata as m, sample_factory, sf_examples.mujoco.train_mujoco, mujoco, gymnasium, torch, numpy
gymnasium.make("PongNoFrameskip-v4").close()
print("setup_venv: ok: sample-factory", m.version("sample-factory"), "torch", torch.__version__,
      "gymnasium", gymnasium.__version__, "numpy", numpy.__version__, "mujoco", mujoco.__version__,
      "ale-py", m.version("ale-py"))'
