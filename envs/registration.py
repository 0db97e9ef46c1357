"""gymnasium ids for our envs: ``gymnasium.make("sample_fast/Hopper-v5")`` and
``gymnasium.make_vec("sample_fast/Ant-v5", num_envs=64)`` build sample_fast envs.

Registered when ``sample_fast.envs`` is imported (or name the module in the id, gymnasium's own convention:
``gymnasium.make_vec("sample_fast.envs:sample_fast/Ant-v5", num_envs=64)``):

* ``sample_fast/<Task>`` for every MuJoCo task, under its gymnasium name (``sample_fast/Ant-v5``,
  ``sample_fast/HalfCheetah-v5``, ``sample_fast/Hopper-v5``, ``sample_fast/Walker2d-v5``, ``sample_fast/Humanoid-v5``);
* ``sample_fast/Toy-v0`` (the toy env; ``kind=...`` and its other options as keyword arguments);
* ``sample_fast/<Game>-v5`` for every Atari game ale-py ships (``sample_fast/Pong-v5``).

``gymnasium.make`` gives a ``GymnasiumSingleEnv`` over a one-env batch; ``gymnasium.make_vec`` (its default
``vector_entry_point`` mode) a ``GymnasiumVectorEnv`` over a batch of ``num_envs``, in gymnasium's default
``AutoresetMode.NEXT_STEP`` unless ``autoreset_mode="same_step"`` is passed. Other keyword arguments go to
``sample_fast.envs.make``: ``backend``, ``device``, ``seed`` and the task's options (``max_episode_steps``, ...).
Only ids are registered here (no backend is imported); the env is built when gymnasium calls the entry point.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import gymnasium
import numpy as np

from .tasks import TASKS

NAMESPACE = "sample_fast"
TOY_ID = f"{NAMESPACE}/Toy-v0"


def make_single(name: str, render_mode: str | None = None, **options: Any) -> gymnasium.Env:
    """``gymnasium.make``'s entry point: a ``GymnasiumSingleEnv`` over ``sample_fast.envs.make(name, 1, ...)``."""
    from . import make
    from .adapters import GymnasiumSingleEnv
    from .base import EnvError

    if render_mode is not None:
        raise EnvError(f"render_mode={render_mode!r}: sample_fast envs do not render through gymnasium; drop it")
    if options.get("seed") is None:
        # Unseeded gymnasium envs differ from one another; a fixed default would make every env built one by one
        # (DummyVecEnv, SyncVectorEnv) a clone of the others until reset(seed=...) is called.
        options["seed"] = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
    return GymnasiumSingleEnv(make(name, 1, **options))


def make_vector(name: str, num_envs: int = 1, autoreset_mode: Any = "next_step", **options: Any) -> Any:
    """``gymnasium.make_vec``'s vector entry point: a ``GymnasiumVectorEnv`` over ``make(name, num_envs, ...)``."""
    from . import make
    from .adapters import GymnasiumVectorEnv, check_autoreset_mode

    mode = check_autoreset_mode(autoreset_mode)  # before building anything
    return GymnasiumVectorEnv(make(name, num_envs, **options), autoreset_mode=mode)


def _atari_games() -> list[str]:
    """``<Game>-v5`` of every ROM ale-py ships, listed from its package folder (importing ale-py costs ~0.3 s)."""
    spec = importlib.util.find_spec("ale_py")
    if spec is None or not spec.submodule_search_locations:
        return []
    from .atari import game_name

    roms = os.path.join(list(spec.submodule_search_locations)[0], "roms")
    try:
        return sorted(game_name(f[: -len(".bin")]) for f in os.listdir(roms) if f.endswith(".bin"))
    except OSError:
        return []


def registered_ids() -> dict[str, str]:
    """gymnasium id -> our env name, for every id this module registers."""
    ids = {f"{NAMESPACE}/{task.gymnasium_id}": name for name, task in TASKS.items() if task.gymnasium_id}
    ids[TOY_ID] = "toy"
    ids.update({f"{NAMESPACE}/{game}": game for game in _atari_games()})
    return ids


def register_all() -> None:
    """Register every id of ``registered_ids`` with gymnasium (idempotent)."""
    for env_id, name in registered_ids().items():
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            env_id,
            entry_point=f"{__name__}:make_single",
            vector_entry_point=f"{__name__}:make_vector",
            kwargs={"name": name},
            disable_env_checker=True,  # our adapters are checked by the tests (check_env); no per-step checker
            order_enforce=True,
        )
