"""Builds the MjModel a task runs on, with the model options shared by the mujoco and mjx backends.

Owns: loading the task's MJCF (gymnasium's own files), applying ``solver_iterations``, ``ls_iterations`` and
``contacts="feet"`` (only feet-floor contact pairs, the MJX speed setting), skipping constraint-island discovery
where a model has one kinematic tree (same results, less work), and reading ``ModelConsts``.
Both physics backends call ``build_model`` so that the same options give the same model on both.
"""

from __future__ import annotations

import warnings
from typing import Any

import mujoco
import numpy as np

from .base import EnvError
from .tasks import CONES, INTEGRATORS, ModelConsts, TaskDef


def build_model(task: TaskDef, opts: dict[str, Any], xml: str | None = None) -> mujoco.MjModel:
    """Compile the task's model with ``opts`` applied. ``xml`` (MJCF text) overrides the task's own XML."""
    xml = xml if xml is not None else task.xml_string
    source = "MJCF string" if xml is not None else task.xml_path
    try:
        spec = mujoco.MjSpec.from_string(xml) if xml is not None else mujoco.MjSpec.from_file(task.xml_path)
    except Exception as e:  # MuJoCo's parser error names line and element
        raise EnvError(f"could not load MJCF for task {task.name!r} ({source}): {e}") from e
    if opts.get("contacts", "all") == "feet":
        floor = "floor"
        names = {g.name for g in spec.geoms}
        missing = [n for n in (*task.feet, floor) if n not in names]
        if missing or not task.feet:
            raise EnvError(f"contacts='feet' needs geoms {missing or 'feet'} in task {task.name!r}; use contacts='all'")
        for g in spec.geoms:
            g.contype = 0
            g.conaffinity = 0
        for foot in task.feet:
            spec.add_pair(geomname1=floor, geomname2=foot)
    try:
        with warnings.catch_warnings():  # humanoid.xml uses the deprecated settotalmass; harmless here
            warnings.simplefilter("ignore", UserWarning)
            model = spec.compile()  # meshes and textures are read here, so a missing asset fails here
    except Exception as e:
        raise EnvError(f"could not compile MJCF for task {task.name!r} ({source}): {e}") from e
    if opts.get("solver_iterations") is not None:
        model.opt.iterations = int(opts["solver_iterations"])
    if opts.get("ls_iterations") is not None:
        model.opt.ls_iterations = int(opts["ls_iterations"])
    if opts.get("cone") is not None:
        model.opt.cone = getattr(mujoco.mjtCone, CONES[opts["cone"]])
    if opts.get("integrator") is not None:
        model.opt.integrator = getattr(mujoco.mjtIntegrator, INTEGRATORS[opts["integrator"]])
    skip_island_discovery(model)
    return model


def skip_island_discovery(model: mujoco.MjModel) -> bool:
    """Turn off MuJoCo's constraint-island discovery where it cannot find more than one island; True if it did.

    PERF: MuJoCo (on by default since 3.3.6; 4.0 here) partitions the constraints into islands of kinematic trees
    before each solve. A model whose moving bodies form one kinematic tree (``ntree <= 1``: every task here, and
    most single robots against a static world) has at most one island, so the discovery is pure overhead: 3-8% of
    an env step's physics on the five tasks (Ant 200 -> 187 µs per agent step; benchmarks/bench_islands.py), with
    bit-identical states and ``cfrc_ext`` (tests/test_env_physics.py). Models with several trees (a robot and free
    objects) keep it, and so do models with sleeping enabled (``mjENBL_SLEEP``), which MuJoCo decides per island.
    """
    if model.ntree > 1 or model.opt.enableflags & int(mujoco.mjtEnableBit.mjENBL_SLEEP):
        return False
    model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_ISLAND)
    return True


def model_consts(model: mujoco.MjModel) -> ModelConsts:
    return ModelConsts(
        body_mass=np.asarray(model.body_mass, dtype=np.float64).copy(),
        nq=model.nq,
        nv=model.nv,
        nu=model.nu,
        nbody=model.nbody,
    )
