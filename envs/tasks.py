"""Task definitions shared by every physics backend: observation, reward, termination and reset noise.

Each function is written once against an array namespace ``xp`` (``numpy`` for the MuJoCo C backend, batched
``[N, ...]``; ``jax.numpy`` for MJX, one env inside ``vmap``), indexing with ``[..., i]`` so both shapes work.
The semantics follow gymnasium's v5 MuJoCo envs (``gymnasium/envs/mujoco/*_v5.py``), option names included;
deviations are listed in ``DEVIATIONS``. Physics quantities come in a ``Physics`` record of arrays.

This module owns no simulation state and imports neither MuJoCo nor JAX.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Where gymnasium keeps the MJCF files its v5 envs load; our tasks use the very same files.
GYM_ASSETS = os.path.join(os.path.dirname(__import__("gymnasium").__file__), "envs", "mujoco", "assets")

DEVIATIONS = """\
* Auto-reset happens in the step that ends an episode (gymnasium's vector "same-step" mode), final observation in
  info["final_obs"]; gymnasium's vector default is next-step reset.
* Observations and rewards are float32 (gymnasium returns float64 observations).
* Reset noise is drawn from each backend's own generator (numpy PCG64 per env on mujoco, jax.random on mjx), so a
  given seed gives different (equally distributed) initial states on the two backends and gymnasium.
* A non-finite physics state resets that env and is reported as terminated with info["physics_reset"].
* mujoco backend: out-of-range actions are clipped to the actuator range before the control cost is computed
  (gymnasium charges the control cost of the unclipped action; MuJoCo clamps the control either way).
"""


class Physics(NamedTuple):
    """The physics quantities task functions read, batched ``[..., ...]`` (numpy) or per env (jax).

    Only the fields a task lists in ``TaskDef.fields`` are filled; the others are None.
    """

    qpos: Any
    qvel: Any
    cfrc_ext: Any = None  # [..., nbody, 6]
    cinert: Any = None  # [..., nbody, 10]
    cvel: Any = None  # [..., nbody, 6]
    qfrc_actuator: Any = None  # [..., nv]
    xpos: Any = None  # [..., nbody, 3]
    xipos: Any = None  # [..., nbody, 3]


class ModelConsts(NamedTuple):
    """Constants a task needs from the model (filled by the backend from ``MjModel``)."""

    body_mass: Any  # [nbody]
    nq: int
    nv: int
    nu: int
    nbody: int


@dataclass(frozen=True)
class TaskDef:
    """One task. ``options`` holds every option with its default (gymnasium's v5 names where they exist).

    Callables take ``(xp, phys, opts, consts)``; ``position`` returns the coordinates whose finite difference over
    ``dt`` is the velocity the forward reward uses, ``reward`` returns ``(reward, healthy)``.
    """

    name: str
    xml_file: str
    gymnasium_id: str
    envpool_id: str
    frame_skip: int
    fields: tuple[str, ...]
    options: dict[str, Any]
    observation: Callable[..., Any]
    position: Callable[..., Any]
    reward: Callable[..., Any]
    reset_noise: str  # "uniform" (qpos and qvel uniform) or "uniform_normal" (qpos uniform, qvel normal)
    feet: tuple[str, ...] = ()  # geoms that touch the floor with contacts="feet"
    xml_string: str | None = field(default=None, repr=False)  # MJCF text; when set, used instead of xml_file
    obs_size: Callable[[ModelConsts, dict[str, Any]], int] = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def xml_path(self) -> str:
        """The MJCF file: ``xml_file`` itself when absolute (custom robots), else gymnasium's asset of that name."""
        return os.path.join(GYM_ASSETS, self.xml_file)  # join() returns xml_file unchanged when it is absolute


#: Options every task accepts: episode length and MuJoCo model options (used on both mujoco and mjx backends, so
#: MJX-tuned settings can be compared step for step with MuJoCo C).
COMMON_OPTIONS: dict[str, Any] = {
    "max_episode_steps": 1000,
    "frame_skip": None,  # None: the task's own
    "solver_iterations": None,  # None: the model's own (MuJoCo default 100)
    "ls_iterations": None,  # None: the model's own (50)
    "contacts": "all",  # "all": the XML's collision rules; "feet": only feet-floor pairs (fast on MJX)
    "cone": None,  # None: the model's own friction cone; "pyramidal" or "elliptic" (MJX and C agree closer)
    "integrator": None,  # None: the model's own (Ant: RK4); "euler", "rk4", "implicit", "implicitfast"
}


#: Accepted values of the ``cone`` and ``integrator`` options, mapped to MuJoCo's enum member names.
CONES = {"pyramidal": "mjCONE_PYRAMIDAL", "elliptic": "mjCONE_ELLIPTIC"}
INTEGRATORS = {
    "euler": "mjINT_EULER",
    "rk4": "mjINT_RK4",
    "implicit": "mjINT_IMPLICIT",
    "implicitfast": "mjINT_IMPLICITFAST",
}


def _sum_sq(xp: Any, x: Any, axes: tuple[int, ...]) -> Any:
    return xp.sum(x * x, axis=axes)


def _velocity(before: Any, after: Any, dt: float) -> Any:
    return (after - before) / dt


# ----- Ant (gymnasium/envs/mujoco/ant_v5.py) -----------------------------------------------------------------
def _ant_obs(xp, p: Physics, o, c):
    parts = [p.qpos[..., 2:] if o["exclude_current_positions_from_observation"] else p.qpos]
    if o["include_velocities_in_observation"]:  # False: a partially observed task (docs/recurrent.md)
        parts.append(p.qvel)
    if o["include_cfrc_ext_in_observation"]:
        lo, hi = o["contact_force_range"]
        f = xp.clip(p.cfrc_ext[..., 1:, :], lo, hi)
        parts.append(f.reshape(f.shape[:-2] + (f.shape[-2] * f.shape[-1],)))
    return xp.concatenate(parts, axis=-1)


def _ant_pos(xp, p: Physics, o, c):
    return p.xpos[..., o["main_body"], :2]


def _healthy_z(xp, p: Physics, o, z_index: int):
    lo, hi = o["healthy_z_range"]
    finite = xp.all(xp.isfinite(p.qpos), axis=-1) & xp.all(xp.isfinite(p.qvel), axis=-1)
    z = p.qpos[..., z_index]
    return finite & (z >= lo) & (z <= hi)


def _ant_reward(xp, p: Physics, o, c, action, velocity):
    healthy = _healthy_z(xp, p, o, 2)
    forward = o["forward_reward_weight"] * velocity[..., 0]
    ctrl = o["ctrl_cost_weight"] * _sum_sq(xp, action, (-1,))
    lo, hi = o["contact_force_range"]
    contact = o["contact_cost_weight"] * _sum_sq(xp, xp.clip(p.cfrc_ext, lo, hi), (-2, -1))
    # v5 pays the healthy reward only while healthy; Ant-v4 paid it on every step while terminating on unhealthy.
    paid = (healthy | True) if o["healthy_reward_always"] else healthy
    return forward + paid * o["healthy_reward"] - ctrl - contact, healthy


# ----- HalfCheetah (half_cheetah_v5.py) ----------------------------------------------------------------------
def _x_obs(xp, p: Physics, o, c, clip_qvel: bool = False):
    pos = p.qpos[..., 1:] if o["exclude_current_positions_from_observation"] else p.qpos
    if not o.get("include_velocities_in_observation", True):  # a partially observed task (docs/recurrent.md)
        return pos
    vel = xp.clip(p.qvel, -10.0, 10.0) if clip_qvel else p.qvel
    return xp.concatenate([pos, vel], axis=-1)


def _x_pos(xp, p: Physics, o, c):
    return p.qpos[..., 0:1]


def _cheetah_reward(xp, p: Physics, o, c, action, velocity):
    forward = o["forward_reward_weight"] * velocity[..., 0]
    ctrl = o["ctrl_cost_weight"] * _sum_sq(xp, action, (-1,))
    healthy = xp.ones_like(forward) > 0
    return forward - ctrl, healthy


# ----- Hopper and Walker2d (hopper_v5.py, walker2d_v5.py) ----------------------------------------------------
def _hopper_healthy(xp, p: Physics, o):
    state = xp.concatenate([p.qpos[..., 2:], p.qvel], axis=-1)
    lo_s, hi_s = o["healthy_state_range"]
    lo_z, hi_z = o["healthy_z_range"]
    lo_a, hi_a = o["healthy_angle_range"]
    z, angle = p.qpos[..., 1], p.qpos[..., 2]
    return xp.all((state > lo_s) & (state < hi_s), axis=-1) & (z > lo_z) & (z < hi_z) & (angle > lo_a) & (angle < hi_a)


def _walker_healthy(xp, p: Physics, o):
    lo_z, hi_z = o["healthy_z_range"]
    lo_a, hi_a = o["healthy_angle_range"]
    z, angle = p.qpos[..., 1], p.qpos[..., 2]
    return (z > lo_z) & (z < hi_z) & (angle > lo_a) & (angle < hi_a)


def _make_hop_reward(healthy_fn):
    def reward(xp, p: Physics, o, c, action, velocity):
        healthy = healthy_fn(xp, p, o)
        forward = o["forward_reward_weight"] * velocity[..., 0]
        ctrl = o["ctrl_cost_weight"] * _sum_sq(xp, action, (-1,))
        return forward + healthy * o["healthy_reward"] - ctrl, healthy

    return reward


# ----- Humanoid (humanoid_v5.py) -----------------------------------------------------------------------------
def _flat_from1(p_arr):
    x = p_arr[..., 1:, :]
    return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def _humanoid_obs(xp, p: Physics, o, c):
    parts = [p.qpos[..., 2:] if o["exclude_current_positions_from_observation"] else p.qpos, p.qvel]
    if o["include_cinert_in_observation"]:
        parts.append(_flat_from1(p.cinert))
    if o["include_cvel_in_observation"]:
        parts.append(_flat_from1(p.cvel))
    if o["include_qfrc_actuator_in_observation"]:
        parts.append(p.qfrc_actuator[..., 6:])
    if o["include_cfrc_ext_in_observation"]:
        parts.append(_flat_from1(p.cfrc_ext))
    return xp.concatenate(parts, axis=-1)


def _mass_center(xp, p: Physics, o, c):
    m = xp.asarray(c.body_mass)
    return xp.sum(p.xipos * m[:, None], axis=-2)[..., :2] / xp.sum(m)


def _humanoid_reward(xp, p: Physics, o, c, action, velocity):
    healthy = _humanoid_healthy(xp, p, o)
    forward = o["forward_reward_weight"] * velocity[..., 0]
    ctrl = o["ctrl_cost_weight"] * _sum_sq(xp, action, (-1,))
    lo, hi = o["contact_cost_range"]
    contact = xp.clip(o["contact_cost_weight"] * _sum_sq(xp, p.cfrc_ext, (-2, -1)), lo, hi)
    return forward + healthy * o["healthy_reward"] - ctrl - contact, healthy


def _humanoid_healthy(xp, p: Physics, o):
    lo, hi = o["healthy_z_range"]
    z = p.qpos[..., 2]
    return (z > lo) & (z < hi)


# ----- obs sizes (used for specs before any physics runs) ----------------------------------------------------
def _ant_size(c: ModelConsts, o):
    n = c.nq - 2 * o["exclude_current_positions_from_observation"] + c.nv * o["include_velocities_in_observation"]
    return n + (c.nbody - 1) * 6 * o["include_cfrc_ext_in_observation"]


def _x_size(c: ModelConsts, o):
    return (
        c.nq - o["exclude_current_positions_from_observation"] + c.nv * o.get("include_velocities_in_observation", True)
    )


def _humanoid_size(c: ModelConsts, o):
    n = c.nq - 2 * o["exclude_current_positions_from_observation"] + c.nv
    n += (c.nbody - 1) * 10 * o["include_cinert_in_observation"]
    n += (c.nbody - 1) * 6 * o["include_cvel_in_observation"]
    n += (c.nv - 6) * o["include_qfrc_actuator_in_observation"]
    n += (c.nbody - 1) * 6 * o["include_cfrc_ext_in_observation"]
    return n


TASKS: dict[str, TaskDef] = {
    "ant": TaskDef(
        name="ant",
        xml_file="ant.xml",
        gymnasium_id="Ant-v5",
        envpool_id="Ant-v5",
        frame_skip=5,
        fields=("qpos", "qvel", "cfrc_ext", "xpos"),
        options={
            "forward_reward_weight": 1.0,
            "ctrl_cost_weight": 0.5,
            "contact_cost_weight": 5e-4,
            "healthy_reward": 1.0,
            "healthy_reward_always": False,  # True: Ant-v4's rule (healthy reward on the terminal step too)
            "main_body": 1,
            "terminate_when_unhealthy": True,
            "healthy_z_range": (0.2, 1.0),
            "contact_force_range": (-1.0, 1.0),
            "reset_noise_scale": 0.1,
            "exclude_current_positions_from_observation": True,
            "include_cfrc_ext_in_observation": True,
            # False: joint and body velocities leave the observation (a POMDP: a policy must infer them from
            # successive positions, i.e. needs memory; docs/recurrent.md). Not a gymnasium option.
            "include_velocities_in_observation": True,
        },
        observation=_ant_obs,
        position=_ant_pos,
        reward=_ant_reward,
        reset_noise="uniform_normal",
        obs_size=_ant_size,
        feet=("left_ankle_geom", "right_ankle_geom", "third_ankle_geom", "fourth_ankle_geom"),
    ),
    "halfcheetah": TaskDef(
        name="halfcheetah",
        xml_file="half_cheetah.xml",
        gymnasium_id="HalfCheetah-v5",
        envpool_id="HalfCheetah-v5",
        frame_skip=5,
        fields=("qpos", "qvel"),
        options={
            "forward_reward_weight": 1.0,
            "ctrl_cost_weight": 0.1,
            "reset_noise_scale": 0.1,
            "exclude_current_positions_from_observation": True,
            "terminate_when_unhealthy": False,
            # False: velocities leave the observation (a POMDP, docs/recurrent.md). Not a gymnasium option.
            "include_velocities_in_observation": True,
        },
        observation=_x_obs,
        position=_x_pos,
        reward=_cheetah_reward,
        reset_noise="uniform_normal",
        obs_size=_x_size,
        feet=("bfoot", "ffoot", "bshin", "fshin", "head", "torso"),
    ),
    "hopper": TaskDef(
        name="hopper",
        xml_file="hopper.xml",
        gymnasium_id="Hopper-v5",
        envpool_id="Hopper-v5",
        frame_skip=4,
        fields=("qpos", "qvel"),
        options={
            "forward_reward_weight": 1.0,
            "ctrl_cost_weight": 1e-3,
            "healthy_reward": 1.0,
            "terminate_when_unhealthy": True,
            "healthy_state_range": (-100.0, 100.0),
            "healthy_z_range": (0.7, float("inf")),
            "healthy_angle_range": (-0.2, 0.2),
            "reset_noise_scale": 5e-3,
            "exclude_current_positions_from_observation": True,
        },
        observation=lambda xp, p, o, c: _x_obs(xp, p, o, c, clip_qvel=True),
        position=_x_pos,
        reward=_make_hop_reward(_hopper_healthy),
        reset_noise="uniform",
        obs_size=_x_size,
        feet=("foot_geom", "leg_geom", "thigh_geom", "torso_geom"),
    ),
    "walker2d": TaskDef(
        name="walker2d",
        xml_file="walker2d_v5.xml",
        gymnasium_id="Walker2d-v5",
        envpool_id="Walker2d-v5",
        frame_skip=4,
        fields=("qpos", "qvel"),
        options={
            "forward_reward_weight": 1.0,
            "ctrl_cost_weight": 1e-3,
            "healthy_reward": 1.0,
            "terminate_when_unhealthy": True,
            "healthy_z_range": (0.8, 2.0),
            "healthy_angle_range": (-1.0, 1.0),
            "reset_noise_scale": 5e-3,
            "exclude_current_positions_from_observation": True,
        },
        observation=lambda xp, p, o, c: _x_obs(xp, p, o, c, clip_qvel=True),
        position=_x_pos,
        reward=_make_hop_reward(_walker_healthy),
        reset_noise="uniform",
        obs_size=_x_size,
        feet=(
            "foot_geom",
            "foot_left_geom",
            "leg_geom",
            "leg_left_geom",
            "thigh_geom",
            "thigh_left_geom",
            "torso_geom",
        ),
    ),
    "humanoid": TaskDef(
        name="humanoid",
        xml_file="humanoid.xml",
        gymnasium_id="Humanoid-v5",
        envpool_id="Humanoid-v5",
        frame_skip=5,
        fields=("qpos", "qvel", "cfrc_ext", "cinert", "cvel", "qfrc_actuator", "xipos"),
        options={
            "forward_reward_weight": 1.25,
            "ctrl_cost_weight": 0.1,
            "contact_cost_weight": 5e-7,
            "contact_cost_range": (float("-inf"), 10.0),
            "healthy_reward": 5.0,
            "terminate_when_unhealthy": True,
            "healthy_z_range": (1.0, 2.0),
            "reset_noise_scale": 1e-2,
            "exclude_current_positions_from_observation": True,
            "include_cinert_in_observation": True,
            "include_cvel_in_observation": True,
            "include_qfrc_actuator_in_observation": True,
            "include_cfrc_ext_in_observation": True,
        },
        observation=_humanoid_obs,
        position=_mass_center,
        reward=_humanoid_reward,
        reset_noise="uniform",
        obs_size=_humanoid_size,
        feet=("right_foot", "left_foot", "right_shin1", "left_shin1"),
    ),
}

#: Ant with gymnasium Ant-v4's defaults (27-dim observation, no contact cost, the healthy reward paid on the
#: terminal step too): ``make("ant", n, **ANT_V4_OPTIONS)``. Used to compare with peers that train Ant-v4.
ANT_V4_OPTIONS: dict[str, Any] = {
    "include_cfrc_ext_in_observation": False,
    "contact_cost_weight": 0.0,
    "healthy_reward_always": True,
}


def register_task(task: TaskDef, overwrite: bool = False) -> TaskDef:
    """Add ``task`` to ``TASKS`` so ``make(task.name, ...)`` builds it on the mujoco and mjx backends."""
    from .base import EnvError

    if task.name in TASKS and not overwrite:
        raise EnvError(f"a task named {task.name!r} exists already; pick another name or pass overwrite=True")
    if task.name == "toy" or task.name.startswith("gymnasium:"):
        raise EnvError(f"task name {task.name!r} is reserved; pick another name")
    TASKS[task.name] = task
    return task


def resolve_options(task: TaskDef, given: dict[str, Any], backend_options: dict[str, Any]) -> dict[str, Any]:
    """Merge ``given`` over the task's and common defaults and check the common ones; raises ``EnvError``.

    ``backend_options`` are the backend's own settings with defaults (e.g. ``num_threads``); they are accepted too.
    Unknown names raise ``UnknownOptionError`` listing the valid ones. Every backend's ``check_options`` starts here,
    and so does the trainer's config check (through ``sample_fast.envs.check_options``).
    """
    from .base import EnvError, OptionError, UnknownOptionError

    defaults = {**COMMON_OPTIONS, **task.options, **backend_options}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UnknownOptionError(
            f"unknown option(s) {unknown} for task {task.name!r}; valid options: {', '.join(sorted(defaults))}",
            unknown,
            sorted(defaults),
        )
    opts = {**defaults, **given}
    if opts["frame_skip"] is None:
        opts["frame_skip"] = task.frame_skip
    if opts["contacts"] not in ("all", "feet"):
        raise EnvError(f"contacts must be 'all' or 'feet', got {opts['contacts']!r}")
    if opts["contacts"] == "feet" and not task.feet:
        raise OptionError("contacts", "feet", f"needs the feet geoms of task {task.name!r}, which has none listed",
                          hint="use contacts='all'")  # fmt: skip
    if opts["cone"] not in (None, *CONES):
        raise EnvError(f"cone must be one of {sorted(CONES)} or None (the model's own), got {opts['cone']!r}")
    if opts["integrator"] not in (None, *INTEGRATORS):
        raise EnvError(f"integrator must be one of {sorted(INTEGRATORS)} or None, got {opts['integrator']!r}")
    check_int_option(opts, "frame_skip", 1)
    check_int_option(opts, "max_episode_steps", 1, none="no time limit")
    check_int_option(opts, "solver_iterations", 0, none="the model's own")
    check_int_option(opts, "ls_iterations", 0, none="the model's own")
    return opts


def check_int_option(opts: dict[str, Any], key: str, minimum: int, none: str | None = None) -> None:
    """``opts[key]`` must be an int >= ``minimum`` (or None, meaning ``none``, when that is given)."""
    from .base import OptionError

    value = opts[key]
    if value is None and none is not None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = f"an int >= {minimum}" + (f" or None ({none})" if none is not None else "")
        raise OptionError(key, value, f"must be {allowed}")


def is_terminated(xp: Any, healthy: Any, opts: dict[str, Any]) -> Any:
    """Gymnasium: ``terminated = (not is_healthy) and terminate_when_unhealthy``."""
    if not opts.get("terminate_when_unhealthy", False):
        return healthy & False
    return ~healthy
