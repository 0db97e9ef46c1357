# shellcheck shell=bash
# Python set-up shared by the prepared GPU scripts (gpu_profile.sh, gpu_suite.sh, gpu_pong.sh); sourced, not run.
#
# The lent GPU machine (one H200) cannot reach a package index, and its python3 -- the one with CUDA torch and jax --
# is itself a virtualenv (/opt/torch/.venv). A venv made from it with --system-site-packages sees the BASE
# interpreter's packages, not that venv's torch (checked: `import torch` fails in such a nested venv). So:
#   here, with pip access:  gpu_fetch_wheels .whl   -> the Python 3.12 x86-64 wheels the image lacks (~44 MB)
#   there:                  gpu_install_site python3 /tmp/sf-gpu-site .whl "$REPO"; export PYTHONPATH=/tmp/sf-gpu-site
# which installs the wheels and this project (a plain, non-editable build: its package-dir mapping puts envs/ at
# sample_fast.envs) into one --target folder. Run Python from outside the repo then: the repo's ./sample_fast would
# shadow the installed package, whose envs/ is inside it.
#
# Not carried: warp-lang (149 MB, over the device tool's 64 MiB per call), so the warp backend runs on a GPU machine
# only where warp is already importable (gpu_suite.sh checks and skips its warp sections otherwise).

#: What the image lacks (it has torch, jax, numba, numba-cuda, scipy, absl-py, etils, numpy, matplotlib, tensorboard,
#: rich, cloudpickle, pyyaml, packaging, zipp, fsspec, opencv): the trainer's own needs, MuJoCo + MJX, the ale backend.
GPU_WHEELS="hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 gymnasium==1.4.0
  farama-notifications==0.0.6 tensordict==0.14.3 pyvers==0.2.3 orjson==3.13.0 importlib-metadata==10.2.0
  mujoco==4.0.1 mujoco-core==4.0.1 mujoco-studio==4.0.1 mujoco-mjx==3.17.0 mujoco-warp==4.0.0 glfw==2.11.0
  pyopengl==3.1.10 trimesh==5.2.0 websockets==17.4 ale-py==0.12.1 torchrl==0.14.1 hoptorch==0.1.4"

gpu_fetch_wheels() {  # gpu_fetch_wheels DIR: GPU_WHEELS for CPython 3.12 on x86-64 Linux into DIR (pip access needed)
  local dir=$1 w pip=("${PYTHON:-python3}" -m pip)
  mkdir -p "$dir"
  grep -qx "/$(basename "$dir")/" .git/info/exclude 2>/dev/null || echo "/$(basename "$dir")/" >> .git/info/exclude
  for w in $GPU_WHEELS; do
    case $w in
      antlr4-python3-runtime*)  # hydra's parser runtime has no wheel on PyPI: built here (pure Python, any version)
        "${pip[@]}" wheel -q --no-deps -w "$dir" "$w" ;;
      *)
        "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$w" ;;
    esac || echo "could not fetch $w"
  done
  du -sh "$dir"
}

gpu_install_site() {  # gpu_install_site PY SITE WHEELS REPO: the wheels (else GPU_WHEELS from PyPI) and REPO -> SITE
  local py=$1 site=$2 wheels=$3 repo=$4
  "$py" -c "import torch" || { echo "setup: $py has no torch"; return 1; }
  rm -rf "$site"
  local pip=("$py" -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site")
  if [ -d "$wheels" ]; then
    "${pip[@]}" --no-index "$wheels"/*.whl "$repo" || return 1
  else
    # shellcheck disable=SC2086  # a list of requirements
    "${pip[@]}" $GPU_WHEELS "$repo" || return 1
  fi
  rm -rf "$repo/build" "$repo/sample_fast.egg-info"  # the in-tree build's leftovers
  echo "setup: $py with PYTHONPATH=$site"
}
