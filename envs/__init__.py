"""sample_fast.envs: one batched-env API over MuJoCo C, MJX, EnvPool, gymnasium and a pure-torch toy env.

    from sample_fast.envs import make
    with make("ant", num_envs=64) as env:            # backend="auto": mujoco on CPU, warp (else mjx) with CUDA
        obs, info = env.reset()
        obs, reward, terminated, truncated, info = env.step(actions)

Names: the MuJoCo tasks in ``TASKS`` (``ant``, ``halfcheetah``, ``hopper``, ``walker2d``, ``humanoid``, and robots
added with ``sample_fast.envs.custom.register_robot``), ``toy``, ``gymnasium:<registered id>`` for any gymnasium
env (or ``gymnasium:<module>:<id>``, which imports the module that registers it first, as ``gymnasium.make`` does),
and Atari games as ``<Game>-v5`` (``Pong-v5``, ``SpaceInvaders-v5``: ``sample_fast.envs.atari``). The episode
convention is in ``sample_fast.envs.base``; ``sample_fast.envs.adapters`` wraps any BatchedEnv as a gymnasium
VectorEnv, a TorchRL EnvBase or an Isaac-style VecTask. ``check_options`` checks options the way a backend's
constructor does, without building anything (the trainer's config check uses it). Importing this package registers
gymnasium ids (``gymnasium.make_vec("sample_fast/Ant-v5", num_envs=64)``; ``sample_fast.envs.registration``).
Backends import lazily, so ``import sample_fast.envs`` never pulls in JAX, EnvPool or ale-py.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from . import atari, registration, sim_options
from .base import BatchedEnv, EnvError, OptionError, Spec, StepResult, UnknownOptionError
from .tasks import TASKS

__all__ = [
    "make",
    "check_options",
    "backend_options",
    "BatchedEnv",
    "EnvError",
    "OptionError",
    "UnknownOptionError",
    "Spec",
    "StepResult",
    "TASKS",
    "BACKENDS",
    "available_backends",
]

#: backend name -> (module, class name, pip package that provides it)
BACKENDS: dict[str, tuple[str, str, str]] = {
    "mujoco": ("mujoco_env", "MujocoEnv", "mujoco"),
    "mjx": ("mjx_env", "MjxEnv", "mujoco-mjx jax"),
    "warp": ("warp_env", "WarpEnv", "mujoco-warp==4.0.0 warp-lang==1.19.0"),
    "envpool": ("envpool_env", "EnvPoolEnv", "envpool"),
    "ale": ("ale_env", "AleEnv", "ale-py"),
    "gymnasium": ("gymnasium_env", "GymnasiumEnv", "gymnasium"),
    "toy": ("toy", "ToyEnv", "(built in)"),
}

#: Backends that simulate on the env's device (CUDA when available): ``device=None`` picks cuda for them.
GPU_BACKENDS = ("auto", "mjx", "warp")

#: The backends that run Atari games (``<Game>-v5`` names); envpool's MuJoCo class is in ``BACKENDS``.
ATARI_BACKENDS: dict[str, tuple[str, str, str]] = {
    "envpool": ("envpool_atari", "EnvPoolAtariEnv", "envpool"),
    "ale": ("ale_env", "AleEnv", "ale-py"),
}

_BACKEND_MODULES = {
    "mujoco": "mujoco",
    "mjx": "mujoco.mjx",
    "warp": "mujoco_warp",
    "envpool": "envpool",
    "ale": "ale_py",
    "gymnasium": "gymnasium",
}


def available_backends() -> list[str]:
    """Backends whose packages import on this machine."""
    out = []
    for name in BACKENDS:
        mod = _BACKEND_MODULES.get(name)
        if mod is None:
            out.append(name)
            continue
        try:
            if importlib.util.find_spec(mod.split(".")[0]) is not None:
                out.append(name)
        except (ImportError, ValueError):
            pass
    return out


def _known_names() -> str:
    return ", ".join(sorted(TASKS)) + ", toy, gymnasium:<id> (e.g. gymnasium:Pendulum-v1), <Game>-v5 (Atari: Pong-v5)"


def warp_imports() -> bool:
    """Whether the warp backend's packages (mujoco_warp, warp) import here: ``auto`` prefers warp over mjx on CUDA
    then. Imports them (once per process; only asked on CUDA)."""
    global _WARP_IMPORTS
    if _WARP_IMPORTS is None:
        try:
            importlib.import_module(f"{__name__}.warp_env")
            _WARP_IMPORTS = True
        except Exception:  # an ImportError, or a broken CUDA/driver install failing at import
            _WARP_IMPORTS = False
    return _WARP_IMPORTS


_WARP_IMPORTS: bool | None = None


def resolve_backend(name: str, backend: str, device: torch.device) -> str:
    """Pick the backend for ``name``. ``auto``: for MuJoCo tasks on a CUDA ``device`` warp when it imports, else mjx;
    on the CPU mujoco; for Atari games envpool where it is installed, else ale."""
    if backend not in (*BACKENDS, "auto"):
        raise EnvError(f"unknown backend {backend!r}; choose one of: auto, {', '.join(BACKENDS)}")
    if name == "toy":
        if backend not in ("auto", "toy"):
            raise EnvError(f"env 'toy' runs only on backend 'toy' (got {backend!r}); use backend='auto'")
        return "toy"
    if name.startswith("gymnasium:"):
        if backend not in ("auto", "gymnasium"):
            raise EnvError(f"{name!r} runs on backend 'gymnasium' (got {backend!r}); use backend='auto'")
        return "gymnasium"
    if atari.is_atari_name(name):
        atari.rom_id(name)  # an unknown game raises here, listing the closest names
        if backend not in ("auto", *ATARI_BACKENDS):
            raise EnvError(f"Atari game {name!r} runs on backends {', '.join(ATARI_BACKENDS)} (got {backend!r})")
        if backend == "auto":
            # Atari emulation runs on the CPU whatever the device. EnvPool is the faster of the two here
            # (docs/peers.md, 2 threads: Pong-v5 ~4.6k agent steps/s at 16 envs vs ale-py's ~3.9k), but it is an
            # optional dependency and ale-py a required one.
            return "envpool" if importlib.util.find_spec("envpool") is not None else "ale"
        return backend
    if name not in TASKS:
        raise EnvError(f"unknown env {name!r}; known envs: {_known_names()}")
    if backend == "ale":
        raise EnvError(f"backend 'ale' runs Atari games (<Game>-v5, e.g. Pong-v5), not {name!r}")
    if backend == "toy":
        raise EnvError(f"backend 'toy' runs only env 'toy', not {name!r}")
    if backend == "gymnasium":
        gym_id = TASKS[name].gymnasium_id
        raise EnvError(f"backend 'gymnasium' takes 'gymnasium:<id>' names; for {name!r} use 'gymnasium:{gym_id}'")
    if backend == "auto":
        if device.type != "cuda":
            return "mujoco"
        return "warp" if warp_imports() else "mjx"
    return backend


def make(
    name: str,
    num_envs: int,
    backend: str = "auto",
    device: str | torch.device | None = None,
    seed: int = 0,
    **task_options: Any,
) -> BatchedEnv:
    """Build a ``BatchedEnv`` of ``num_envs`` copies of ``name``.

    Args:
        name: a task in ``TASKS``, ``"toy"``, ``"gymnasium:<id>"`` or an Atari game ``"<Game>-v5"``.
        num_envs: number of environments, >= 1.
        backend: ``auto``, ``mujoco``, ``mjx``, ``warp``, ``envpool``, ``ale``, ``gymnasium`` or ``toy``.
        device: where tensors live. Default: ``cuda`` for mjx, warp and auto (MuJoCo tasks) when available,
            else ``cpu``.
        seed: seeds resets (noise on the initial state) and anything random in the backend.
        task_options: task settings (e.g. ``ctrl_cost_weight``, ``max_episode_steps``) and backend settings
            (e.g. ``num_threads`` for mujoco, ``solver_iterations`` for MuJoCo/MJX). Unknown ones raise EnvError.
    """
    if not isinstance(name, str) or not name:
        raise EnvError(f"env name must be a non-empty string; known envs: {_known_names()}")
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
    if device is None:
        device = "cuda" if (backend in GPU_BACKENDS and torch.cuda.is_available() and name in TASKS) else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EnvError(f"invalid device {device!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EnvError(f"device {device} requested but torch sees no CUDA device; use device='cpu'")
    chosen = resolve_backend(name, backend, device)
    cls = getattr(_backend_module(chosen, name), _backends_for(name)[chosen][1])
    try:
        return cls(name, num_envs, device=device, seed=seed, **task_options)
    except UnknownOptionError as e:
        raise _with_owners(e, chosen) from None


def check_options(name: str, backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check ``options`` for ``name`` on ``backend`` (resolved, not ``auto``) the way that backend's constructor
    does, without building anything; return them resolved (defaults filled in).

    Raises what ``make`` would raise for them: ``EnvError``, ``OptionError`` (one option, e.g. ``contacts='feet'`` on
    envpool) or ``UnknownOptionError`` (naming the backends that do take such an option). The trainer's config check
    (``sample_fast.config.resolve``) calls it, so a config fails before any process starts or file is written.
    What needs a built model or env (``model_params`` shapes, gymnasium.make's own keyword arguments) is not checked.
    """
    module = _backend_module(backend, name)
    try:
        out = module.check_options(name, dict(options))
    except UnknownOptionError as e:
        raise _with_owners(e, backend) from None
    return out[0] if isinstance(out, tuple) else out  # envpool also returns its envpool.make kwargs


def backend_options(name: str, backend: str) -> frozenset[str]:
    """The option names ``backend`` takes for the MuJoCo task ``name``: the options every task takes, the task's
    own, and the backend's (imports the backend's module). Used to carry a config from one backend to another
    (``sample_fast.wiring.on_cpu_simulator``: an mjx config on the mujoco backend)."""
    from .tasks import COMMON_OPTIONS

    own = getattr(_backend_module(backend, name), _OWN_OPTIONS[backend]) if backend in _OWN_OPTIONS else ()
    return frozenset({*COMMON_OPTIONS, *TASKS[name].options, *own})


#: backend -> the attribute of its module holding its own options (besides the task options)
_OWN_OPTIONS = {"mujoco": "BACKEND_OPTIONS", "mjx": "MJX_OPTIONS", "warp": "WARP_OPTIONS", "envpool": "BACKEND_OPTIONS"}
#: The options of the backends whose packages are slow to import, without importing them: envs/sim_options.py.
_LIGHT_OPTIONS = {
    "mjx": sim_options.MJX_OPTIONS,
    "warp": sim_options.WARP_OPTIONS,
    "envpool": sim_options.ENVPOOL_OPTIONS,
}


def _backends_for(name: str) -> dict[str, tuple[str, str, str]]:
    """The backend table for ``name``: Atari games have their own envpool class (and the ale backend)."""
    return ATARI_BACKENDS if atari.is_atari_name(name) else BACKENDS


def _backend_module(backend: str, name: str = "") -> Any:
    module_name, _, package = _backends_for(name)[backend]
    try:
        return importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as e:
        install = package if "==" in package else package.split()[0]  # pinned backends: the whole pin
        raise EnvError(
            f"backend {backend!r} needs the package(s) {package}, which did not import ({e}); "
            f"install with: pip install {install}"
        ) from e


def _with_owners(error: UnknownOptionError, backend: str) -> UnknownOptionError:
    """``error`` plus, for each unknown option that another backend takes, which backend that is (importing the
    other backends' modules: only on this error path)."""
    owners: dict[str, list[str]] = {}
    for other, attr in _OWN_OPTIONS.items():
        if other == backend:
            continue
        if other in _LIGHT_OPTIONS:  # plain data: no JAX / Warp import on an error path
            own = _LIGHT_OPTIONS[other]
        else:
            try:
                own = getattr(importlib.import_module(f"{__name__}.{BACKENDS[other][0]}"), attr)
            except ImportError:
                continue
        for key in error.unknown:
            if key in own:
                owners.setdefault(key, []).append(other)
    if not owners:
        return error
    taken = "; ".join(f"{k} is an option of backend {' and '.join(map(repr, b))}" for k, b in owners.items())
    return UnknownOptionError(f"{error} ({taken}, not of {backend!r})", error.unknown, error.valid, owners, error.hint)


# gymnasium ids (sample_fast/Ant-v5, sample_fast/Toy-v0, sample_fast/Pong-v5, ...): envs/registration.py
registration.register_all()
