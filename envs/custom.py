"""Custom robots: a user's MJCF plus observation/reward/termination functions as a task on ``mujoco`` and ``mjx``.

Owns turning user code into a ``TaskDef`` (``envs.tasks``) and registering it, so ``make(name, n, backend=...)``
builds it on both physics backends with the same semantics; validating the user's MJCF and functions up front
(one call on the initial state, shape checks, a JAX trace when MJX is wanted), and building per-env model
parameter arrays for domain randomization (the ``model_params`` option of both backends). It steps no physics
beyond that one check and owns no env state.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import mujoco
import numpy as np

from .base import EnvError
from .tasks import TASKS, Physics, TaskDef, register_task

__all__ = [
    "register_robot",
    "load_mjcf",
    "randomize_model_params",
    "check_model_params",
    "per_env_models",
    "RANDOMIZABLE_FIELDS",
]

#: ``Physics`` fields a task can read (``fields=`` picks the ones gathered each step; more fields cost time).
PHYSICS_FIELDS = ("qpos", "qvel", "cfrc_ext", "cinert", "cvel", "qfrc_actuator", "xpos", "xipos")

#: MjModel fields the ``model_params`` option can set per env (both backends), with a one-line meaning.
RANDOMIZABLE_FIELDS: dict[str, str] = {
    "body_mass": "[nbody] mass of each body (kg)",
    "body_inertia": "[nbody, 3] principal inertia of each body",
    "geom_friction": "[ngeom, 3] sliding, torsional, rolling friction",
    "dof_damping": "[nv] joint damping",
    "dof_armature": "[nv] joint armature",
    "dof_frictionloss": "[nv] joint dry friction",
    "actuator_gainprm": "[nu, 10] actuator gain parameters (gainprm[:, 0] is the gain of motors)",
    "actuator_biasprm": "[nu, 10] actuator bias parameters (position actuators: biasprm[:, 1] = -kp)",
    "jnt_stiffness": "[njnt] joint stiffness",
}


def _is_mjcf_text(xml: str) -> bool:
    return xml.lstrip().startswith("<")


def load_mjcf(xml: str | os.PathLike[str]) -> tuple[mujoco.MjModel, str | None, str | None]:
    """Compile ``xml`` (an MJCF file path or MJCF text) and return ``(model, xml_file, xml_string)``.

    ``xml_file`` is the absolute path when a path was given (MuJoCo resolves meshes relative to it), else None.
    Errors (missing file, invalid XML, a missing mesh or texture) raise ``EnvError`` with MuJoCo's own message and
    the file it came from.
    """
    xml = os.fspath(xml)
    if _is_mjcf_text(xml):
        where, xml_file, xml_string = "MJCF string", None, xml
        load = lambda: mujoco.MjSpec.from_string(xml)  # noqa: E731
    else:
        xml_file = os.path.abspath(os.path.expanduser(xml))
        if not os.path.isfile(xml_file):
            raise EnvError(f"MJCF file {xml_file} does not exist; pass an existing .xml path or the MJCF text itself")
        where, xml_string = xml_file, None
        load = lambda: mujoco.MjSpec.from_file(xml_file)  # noqa: E731
    try:
        # Meshes and textures are read by compile(), not by the parser: both go in the try.
        model = load().compile()
    except Exception as e:
        hint = ""
        if xml_string is not None and ("file" in str(e).lower() or "resource" in str(e).lower()):
            hint = " (MJCF text resolves mesh/texture paths from the current directory; pass the file path instead)"
        raise EnvError(f"could not load {where}: {e}{hint}") from e
    return model, xml_file, xml_string


def _physics_of(model: mujoco.MjModel, fields: Sequence[str]) -> Physics:
    """The ``Physics`` record of the model's initial state (after ``mj_forward``) as a batch of one env."""
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    if "cfrc_ext" in fields:
        mujoco.mj_rnePostConstraint(model, data)
    vals = {f: np.array(getattr(data, f))[None] for f in ("qpos", "qvel", *fields)}
    return Physics(**vals)


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _call(role: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        raise EnvError(
            f"the {role} function {_fn_name(fn)} failed on the initial state: {type(e).__name__}: {e}"
        ) from e


def _expect_shape(role: str, fn: Callable[..., Any], value: Any, expected: tuple, xp_name: str, rule: str) -> None:
    shape = tuple(getattr(value, "shape", ()))
    if shape != expected:
        raise EnvError(
            f"the {role} function {_fn_name(fn)} returned shape {shape} with xp={xp_name}; expected {expected} "
            f"({rule}). Index with [..., i] and reduce over axis=-1 so the same code serves a numpy batch [N, ...] "
            "(mujoco backend) and one env inside jax.vmap (mjx backend)"
        )


def _validate_numpy(fns: dict[str, Callable[..., Any]], phys: Physics, nu: int) -> int:
    """Call each function once on a batch of one env (numpy); return the observation size."""
    obs = np.asarray(_call("observation", fns["observation"], np, phys))
    if obs.ndim != 2 or obs.shape[0] != 1:
        _expect_shape("observation", fns["observation"], obs, (1, "obs_dim"), "numpy", "[N, obs_dim] for N envs")
    obs_dim = int(obs.shape[1])
    if not np.issubdtype(obs.dtype, np.floating) and not np.issubdtype(obs.dtype, np.integer):
        raise EnvError(
            f"the observation function {_fn_name(fns['observation'])} returned dtype {obs.dtype}; need numbers"
        )
    action = np.zeros((1, nu))
    reward = np.asarray(_call("reward", fns["reward"], np, phys, action))
    _expect_shape("reward", fns["reward"], reward, (1,), "numpy", "one float per env: [N]")
    if fns.get("terminated") is not None:
        term = np.asarray(_call("terminated", fns["terminated"], np, phys))
        _expect_shape("terminated", fns["terminated"], term, (1,), "numpy", "one bool per env: [N]")
        if term.dtype != np.bool_:
            raise EnvError(
                f"the terminated function {_fn_name(fns['terminated'])} returned dtype {term.dtype}; it must return "
                "bools (e.g. xp.abs(phys.qpos[..., 0]) > 1.0)"
            )
    return obs_dim


def _validate_jax(fns: dict[str, Callable[..., Any]], phys: Physics, nu: int, obs_dim: int) -> None:
    """Trace each function for ONE env (as inside the mjx backend's vmap) without compiling; check shapes."""
    import jax
    import jax.numpy as jnp

    one = Physics(
        **{
            k: (None if v is None else jax.ShapeDtypeStruct(v.shape[1:], jnp.float32))
            for k, v in phys._asdict().items()
        }
    )
    action = jax.ShapeDtypeStruct((nu,), jnp.float32)
    checks = [
        ("observation", lambda p, a: fns["observation"](jnp, p), (obs_dim,), "[obs_dim] for one env"),
        ("reward", lambda p, a: fns["reward"](jnp, p, a), (), "a scalar for one env"),
    ]
    if fns.get("terminated") is not None:
        checks.append(("terminated", lambda p, a: fns["terminated"](jnp, p), (), "a scalar bool for one env"))
    for role, fn, expected, rule in checks:
        try:
            out = jax.eval_shape(fn, one, action)
        except Exception as e:
            raise EnvError(
                f"the {role} function {_fn_name(fns[role])} does not trace under JAX (the mjx backend runs it with "
                f"xp=jax.numpy on one env): {type(e).__name__}: {e}. Use xp.* instead of np.* and no Python control "
                "flow on array values"
            ) from e
        _expect_shape(role, fns[role], out, expected, "jax.numpy", rule)


def register_robot(
    name: str,
    xml: str | os.PathLike[str],
    observation: Callable[..., Any] | None = None,
    reward: Callable[..., Any] | None = None,
    terminated: Callable[..., Any] | None = None,
    *,
    task: Any = None,
    fields: Sequence[str] = ("qpos", "qvel", "xpos"),
    frame_skip: int = 1,
    max_episode_steps: int | None = 1000,
    reset_noise_scale: float = 0.0,
    reset_noise: str = "uniform",
    check_jax: bool | None = None,
    overwrite: bool = False,
) -> TaskDef:
    """Register a robot task built from MJCF and task functions; then ``make(name, n, backend="mujoco"|"mjx")``.

    Args:
        name: the task name for ``make``.
        xml: path to an MJCF file (meshes resolve relative to it) or the MJCF text.
        observation: ``observation(xp, phys) -> [..., obs_dim]``; ``phys`` is an ``envs.tasks.Physics`` with the
            ``fields`` filled, batched ``[N, ...]`` under numpy (mujoco backend) or one env under ``jax.numpy``
            inside vmap (mjx backend). Write it once with ``xp`` and ``[..., i]`` indexing.
        reward: ``reward(xp, phys, action) -> [...]`` float; ``action`` is the control the actuators got
            (clipped to ``ctrlrange``), ``phys`` the state after the step.
        terminated: optional ``terminated(xp, phys) -> [...]`` bool (True ends the episode, no bootstrap).
        task: instead of the three functions, an object with methods ``observation``, ``reward`` and optionally
            ``terminated`` of the same signatures (a ``fields`` attribute, when present, overrides ``fields``).
        fields: ``Physics`` fields to gather each step (``qpos`` and ``qvel`` always are).
        frame_skip: physics steps per env step (``dt = timestep * frame_skip``).
        max_episode_steps: time limit (truncation), or None; ``make(..., max_episode_steps=...)`` overrides it.
        reset_noise_scale: initial state = ``qpos0 + U(-s, s)``, ``qvel = U(-s, s)`` (``reset_noise="uniform"``)
            or ``s * N(0, 1)`` (``"uniform_normal"``). Overridable in ``make``.
        check_jax: also trace the functions with ``jax.numpy`` now (default: when JAX is installed).
        overwrite: replace an already registered task of that name.

    Returns the registered ``TaskDef``. Raises ``EnvError`` for an unloadable MJCF (MuJoCo's message and the file)
    or a task function that fails or returns the wrong shape (the function's name and the expected shape).
    """
    if not isinstance(name, str) or not name:
        raise EnvError(f"robot name must be a non-empty string, got {name!r}")
    if name in TASKS and not overwrite:
        raise EnvError(f"a task named {name!r} exists already; pick another name or pass overwrite=True")
    observation, reward, terminated, fields = _task_functions(observation, reward, terminated, task, fields)
    if reset_noise not in ("uniform", "uniform_normal"):
        raise EnvError(f"reset_noise must be 'uniform' or 'uniform_normal', got {reset_noise!r}")
    if not isinstance(frame_skip, int) or frame_skip < 1:
        raise EnvError(f"frame_skip must be a positive int, got {frame_skip!r}")

    model, xml_file, xml_string = load_mjcf(xml)
    if model.nu == 0:
        raise EnvError(f"{xml_file or 'the MJCF'} has no actuators; add an <actuator> so the env takes actions")
    fns = {"observation": observation, "reward": reward, "terminated": terminated}
    phys = _physics_of(model, fields)
    obs_dim = _validate_numpy(fns, phys, model.nu)
    if check_jax is None:
        import importlib.util

        check_jax = importlib.util.find_spec("jax") is not None
    if check_jax:
        _validate_jax(fns, phys, model.nu, obs_dim)
    task_obs, task_position, task_reward = _task_hooks(observation, reward, terminated)
    options = {
        "max_episode_steps": max_episode_steps,
        "reset_noise_scale": float(reset_noise_scale),
        "terminate_when_unhealthy": terminated is not None,
    }
    td = TaskDef(
        name=name,
        xml_file=xml_file or "",
        gymnasium_id="",
        envpool_id="",
        frame_skip=frame_skip,
        fields=fields,
        options=options,
        observation=task_obs,
        position=task_position,
        reward=task_reward,
        reset_noise=reset_noise,
        xml_string=xml_string,
        obs_size=lambda consts, opts: obs_dim,
    )
    return register_task(td, overwrite=overwrite)


def _task_functions(
    observation: Callable[..., Any] | None, reward: Callable[..., Any] | None, terminated: Callable[..., Any] | None,
    task: Any, fields: Sequence[str],
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any] | None, tuple[str, ...]]:  # fmt: skip
    """``register_robot``'s task functions (from ``task``'s methods, or as given) and its ``fields`` in
    ``PHYSICS_FIELDS`` order with ``qpos`` and ``qvel`` added; ``EnvError`` naming the fix when they do not fit."""
    if task is not None:
        if observation is not None or reward is not None or terminated is not None:
            raise EnvError("pass either task=<object with observation/reward/terminated methods> or the functions")
        for method in ("observation", "reward"):
            if not callable(getattr(task, method, None)):
                raise EnvError(
                    f"task object {task!r} has no method {method}(xp, phys{', action' * (method == 'reward')})"
                )
        observation, reward = task.observation, task.reward
        terminated = getattr(task, "terminated", None)
        fields = getattr(task, "fields", fields)
    if observation is None or reward is None:
        raise EnvError("register_robot needs observation(xp, phys) and reward(xp, phys, action) (or task=...)")
    unknown = sorted(set(fields) - set(PHYSICS_FIELDS))
    if unknown:
        raise EnvError(f"unknown physics field(s) {unknown}; choose from {', '.join(PHYSICS_FIELDS)}")
    return observation, reward, terminated, tuple(f for f in PHYSICS_FIELDS if f in set(fields) | {"qpos", "qvel"})


def _task_hooks(
    observation: Callable[..., Any], reward: Callable[..., Any], terminated: Callable[..., Any] | None
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:  # fmt: skip
    """The user's functions in the signatures ``TaskDef`` calls: observation, position and ``(reward, healthy)``."""

    def task_obs(xp: Any, p: Physics, o: dict, c: Any) -> Any:
        return observation(xp, p)

    def task_position(xp: Any, p: Physics, o: dict, c: Any) -> Any:
        return p.qpos[..., :1]  # only feeds info["x_position"]; custom rewards get no velocity term

    def task_reward(xp: Any, p: Physics, o: dict, c: Any, action: Any, velocity: Any) -> tuple[Any, Any]:
        r = reward(xp, p, action)
        healthy = ~terminated(xp, p) if terminated is not None else xp.ones_like(r) > 0
        return r, healthy

    return task_obs, task_position, task_reward


def randomize_model_params(
    task_or_model: str | mujoco.MjModel,
    num_envs: int,
    seed: int = 0,
    scale: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, np.ndarray]:
    """Per-env model parameters for the ``model_params`` option: each field's default value times a factor drawn
    uniformly from ``scale[field] = (lo, hi)``, one draw per env and element. Returns ``{field: [num_envs, ...]}``.

    Example: ``randomize_model_params("arm", 64, scale={"body_mass": (0.8, 1.2), "geom_friction": (0.5, 1.5)})``.
    """
    if isinstance(task_or_model, str):
        if task_or_model not in TASKS:
            raise EnvError(f"unknown task {task_or_model!r}; known: {', '.join(sorted(TASKS))}")
        task = TASKS[task_or_model]
        model = load_mjcf(task.xml_string if task.xml_string is not None else task.xml_path)[0]
    else:
        model = task_or_model
    rng = np.random.default_rng(seed)
    out = {}
    for field_name, (lo, hi) in (scale or {}).items():
        if field_name not in RANDOMIZABLE_FIELDS:
            raise EnvError(f"cannot randomize {field_name!r}; randomizable fields: {', '.join(RANDOMIZABLE_FIELDS)}")
        base = np.asarray(getattr(model, field_name), dtype=np.float64)
        out[field_name] = base[None] * rng.uniform(lo, hi, (num_envs, *base.shape))
    return out


def check_model_params(model: mujoco.MjModel, params: Mapping[str, Any] | None, num_envs: int) -> dict[str, np.ndarray]:
    """Validate the ``model_params`` option: ``{field: [num_envs, *model.<field>.shape]}`` for fields in
    ``RANDOMIZABLE_FIELDS``, finite. Returns float64 copies. Used by the mujoco and mjx backends."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise EnvError(f"model_params must be a dict {{field: array [num_envs, ...]}}, got {type(params).__name__}")
    out = {}
    for name, value in params.items():
        if name not in RANDOMIZABLE_FIELDS:
            raise EnvError(f"cannot randomize {name!r}; randomizable fields: {', '.join(RANDOMIZABLE_FIELDS)}")
        arr = np.array(value, dtype=np.float64)
        expected = (num_envs, *np.shape(getattr(model, name)))
        if arr.shape != expected:
            raise EnvError(
                f"model_params[{name!r}] has shape {arr.shape}; expected {expected} (num_envs, then "
                f"{RANDOMIZABLE_FIELDS[name]})"
            )
        if not np.isfinite(arr).all():
            raise EnvError(f"model_params[{name!r}] holds NaN or inf")
        out[name] = arr
    return out


def per_env_models(model: mujoco.MjModel, params: Mapping[str, np.ndarray], num_envs: int) -> list[mujoco.MjModel]:
    """One ``MjModel`` copy per env with its row of each ``params`` field written in (mujoco backend)."""
    models = []
    for i in range(num_envs):
        m = copy.copy(model)  # MjModel's copy is deep (its own C buffers)
        for name, arr in params.items():
            getattr(m, name)[:] = arr[i]
        models.append(m)
    return models
