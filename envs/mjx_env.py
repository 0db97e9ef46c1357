"""The ``mjx`` backend: N copies of a MuJoCo task stepped by MJX as one jitted JAX program, handed to torch by DLPack.

Owns: the MJX model on the JAX device, the batched ``mjx.Data`` plus per-env PRNG keys and episode counters (one
pytree, donated to every step), and the two compiled programs (``reset`` and ``step``). The whole env step --
``frame_skip`` physics steps, ``rne_postconstraint`` when the task reads ``cfrc_ext``, observation, reward,
termination, time limit, non-finite guard and same-step auto-reset -- is ONE ``jit(vmap(...))`` call, so on a GPU a
step is one dispatch. Task semantics come from ``envs.tasks`` (written once for numpy and jax.numpy); the MjModel
comes from ``envs.physics.build_model`` so model options mean the same here and on the ``mujoco`` backend.
Deviations from MuJoCo C / gymnasium are listed in ``MJX_DEVIATIONS`` and ``env.deviations``; see docs/mjx.md.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import torch
from mujoco import mjx

from . import physics, tasks
from .base import BatchedEnv, EnvError, OptionError, Spec, StepResult
from .sim_options import MJX_OPTIONS

MJX_DEVIATIONS = """\
* Physics runs in float32 (MuJoCo C and gymnasium use float64); trajectories drift apart after tens of steps.
* MJX has no PGS solver: humanoid.xml's solver="PGS" becomes Newton (MuJoCo's default), recorded in env.deviations.
* Collision and constraint code are MJX's own (same contact model, different implementation and iteration order).
* Reset noise comes from jax.random (per-env keys derived from the seed), not numpy.
"""

_SOLVERS = {"newton": mujoco.mjtSolver.mjSOL_NEWTON, "cg": mujoco.mjtSolver.mjSOL_CG}

#: Compiled programs of this process, by everything they depend on (``MjxEnv._program_key``): an env identical to
#: one built before (the trainer's second sampler split, a test's second env) reuses its reset / step executables
#: instead of tracing, lowering and compiling them again. The model is an argument of the programs, not a constant,
#: and each env keeps its own state buffers, so sharing an executable shares no state. Bounded, least recent first.
_PROGRAMS: collections.OrderedDict[tuple, tuple[Any, Any, Any, tasks.TaskDef]] = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()  # held while building: a second identical env waits for the first one's programs
PROGRAM_CACHE_SIZE = 8


class EnvState(NamedTuple):
    """Everything that changes between steps, batched ``[N, ...]``. Donated to each step (buffers are reused)."""

    data: Any  # mjx.Data, batched
    keys: jax.Array  # [N, 2] uint32 PRNG keys, one stream per env
    ep_return: jax.Array  # [N] float, running undiscounted return
    ep_length: jax.Array  # [N] int32, steps in the current episode


class StepOut(NamedTuple):
    obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    physics_reset: jax.Array


def _impl_field(d: Any, name: str) -> Any:
    """Fields MJX moved under ``Data._impl`` (cfrc_ext, cinert) in recent versions; read without the warning."""
    impl = getattr(d, "_impl", None)
    if impl is not None and hasattr(impl, name):
        return getattr(impl, name)
    return getattr(d, name)


def _physics(d: Any, fields: tuple[str, ...]) -> tasks.Physics:
    """The ``Physics`` record of one env (inside vmap), filling only the fields the task reads."""
    get = {
        "cfrc_ext": lambda: _impl_field(d, "cfrc_ext"),
        "cinert": lambda: _impl_field(d, "cinert"),
    }
    vals = {f: (get[f]() if f in get else getattr(d, f)) for f in fields}
    return tasks.Physics(**{"qpos": d.qpos, "qvel": d.qvel, **vals})


#: ``Physics`` fields that need nothing past ``mjx.kinematics`` at a reset (cfrc_ext is zero there, as in gymnasium).
_KINEMATIC_FIELDS = frozenset({"qpos", "qvel", "xpos", "xipos", "cfrc_ext"})


def reset_forward(mx: Any, d: Any, fields: tuple[str, ...], gravcomp: bool) -> Any:
    """The stages of ``mj_forward`` that a reset's observation and the next step's starting position read.

    Gymnasium's reset calls ``mj_forward``; of its results a task reads only ``fields`` (``Physics``), and ``mjx.step``
    begins with a full forward pass of its own, so collision, constraints and the solver are not needed here. Running
    only ``kinematics`` (xpos, xipos), ``com_pos`` (cinert), ``com_vel`` (cvel) and the actuation chain
    (qfrc_actuator: tendon, transmission, the actuator velocities, ``fwd_actuation``) gives the same values as
    ``mjx.forward`` and compiles faster, the step program too, which holds a reset for the envs that end their
    episode (Humanoid: benchmarks/results/mjx_compile/README.md). Actuator gravity compensation reads ``passive``'s
    forces: then the full pass.
    """
    wanted = set(fields)
    d = mjx.kinematics(mx, d)
    if wanted <= _KINEMATIC_FIELDS:
        return d
    if "qfrc_actuator" in wanted and gravcomp:
        return mjx.forward(mx, d)
    d = mjx.com_pos(mx, d)  # cinert, cdof (com_vel and the Jacobians of site transmissions need them)
    if "cvel" in wanted:
        d = mjx.com_vel(mx, d)
    if "qfrc_actuator" in wanted:
        d = mjx.transmission(mx, mjx.tendon(mx, d))
        d = d.tree_replace(  # as mjx.fwd_velocity sets them (fwd_actuation's bias terms read the velocities)
            {"_impl.actuator_velocity": d._impl.actuator_moment @ d.qvel, "_impl.ten_velocity": d._impl.ten_J @ d.qvel}
        )
        d = mjx.fwd_actuation(mx, d)
    return d


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's and MJX's options resolved and checked, without building a model or compiling; raises ``EnvError``.

    ``MjxEnv`` calls it first, and so does the trainer's config check (``sample_fast.envs.check_options``), so a
    config is rejected for exactly what this backend would reject. 64-bit precision is checked against this
    process's ``jax_enable_x64`` (``JAX_ENABLE_X64`` in the environment sets it at import, in child processes too).
    ``model_params`` needs the model: checked later.
    """
    if name not in tasks.TASKS:
        raise EnvError(f"backend 'mjx' runs the MuJoCo tasks {sorted(tasks.TASKS)}, not {name!r}")
    opts = tasks.resolve_options(tasks.TASKS[name], options, MJX_OPTIONS)
    precision = opts["precision"]
    if precision not in ("float32", "float64"):
        raise EnvError(f"precision must be 'float32' or 'float64', got {precision!r}")
    if precision == "float64" and not jax.config.jax_enable_x64:
        raise OptionError(
            "precision",
            precision,
            "needs 64-bit JAX, which is off in this process (jax.config.jax_enable_x64 is False)",
            hint="set JAX_ENABLE_X64=1 in the environment (or call jax.config.update('jax_enable_x64', True)) "
            "before making the env, or use precision='float32'",
        )
    if opts["solver"] is not None and opts["solver"] not in _SOLVERS:
        raise EnvError(f"solver must be one of {sorted(_SOLVERS)} or None, got {opts['solver']!r}")
    tasks.check_int_option(opts, "xla_opt_level", 0, none="XLA's default")
    return opts


def jax_device_for(device: torch.device) -> Any:
    """The JAX device matching a torch device: ``cuda:k`` -> JAX GPU k, ``cpu`` -> the JAX CPU device."""
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as e:
            raise EnvError(
                f"device {device} needs a CUDA build of jax, which found no GPU ({e}); "
                "install with: pip install 'jax[cuda12]', or use device='cpu'"
            ) from None
        idx = device.index or 0
        if idx >= len(gpus):
            raise EnvError(f"device {device}: JAX sees only {len(gpus)} GPU(s); use cuda:0..cuda:{len(gpus) - 1}")
        return gpus[idx]
    raise EnvError(f"backend 'mjx' runs on 'cpu' or 'cuda' devices, not {device}")


def _cast_tree(tree: Any, dtype: Any) -> Any:
    """Floating leaves of ``tree`` cast to ``dtype``."""

    def cast(x: Any) -> Any:
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree_util.tree_map(cast, tree)


def _where_rows(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per leaf of the pytrees ``a`` and ``b`` (rows = envs): ``a``'s rows where ``mask``, else ``b``'s."""

    def pick(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)

    return jax.tree_util.tree_map(pick, a, b)


def _batch_programs(
    reset_one: Callable, step_one: Callable, mx_axes: Any, max_steps: int | None, skip_idle_reset: bool
) -> tuple[Callable, Callable, Callable]:  # fmt: skip
    """The batch's traced functions over one env's (``MjxEnv._per_env_programs``), vmapped over the envs
    (``mx_axes``: None when one model is shared by every env): ``reset_all(mx, keys)``, ``step_all(state, mx,
    actions)`` with the time limit, non-finite-state resets and same-step auto-reset, and ``reset_some(state, mx,
    obs, mask)``."""

    def reset_all(mx: Any, keys: jax.Array) -> tuple[EnvState, jax.Array]:
        keys, sub = _split_keys(keys)
        data, obs = jax.vmap(reset_one, in_axes=(mx_axes, 0))(mx, sub)
        n = keys.shape[0]
        state = EnvState(data, keys, jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32))
        return state, obs

    def step_all(state: EnvState, mx: Any, actions: jax.Array) -> tuple[EnvState, StepOut]:
        data, obs, reward, terminated, finite = jax.vmap(step_one, in_axes=(mx_axes, 0, 0))(mx, state.data, actions)
        bad = ~finite
        reward = jnp.where(bad, 0.0, reward)
        obs = jnp.where(bad[:, None], 0.0, obs)  # observations never carry NaN; final_obs row is zeros
        terminated = terminated | bad
        ep_length = state.ep_length + 1
        truncated = ep_length >= max_steps if max_steps is not None else jnp.zeros_like(terminated)
        done = terminated | truncated
        ep_return = state.ep_return + reward
        keys, sub = _split_keys(state.keys)

        def with_reset(_: None) -> tuple[Any, jax.Array]:
            fresh, fresh_obs = jax.vmap(reset_one, in_axes=(mx_axes, 0))(mx, sub)
            return _where_rows(done, fresh, data), jnp.where(done[:, None], fresh_obs, obs)

        if skip_idle_reset:
            # PERF: on the CPU the reset branch (kinematics or a forward pass per env) runs only when some env
            # ended its episode: most steps of small batches.
            new_data, next_obs = jax.lax.cond(jnp.any(done), with_reset, lambda _: (data, obs), None)
        else:
            # PERF: on a GPU a data-dependent cond costs a device->host read of the predicate per step, and with
            # thousands of envs some episode ends nearly every step anyway: always compute, select per row.
            new_data, next_obs = with_reset(None)
        out = StepOut(
            obs=next_obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=obs,
            episode_return=jnp.where(done, ep_return, 0.0),
            episode_length=jnp.where(done, ep_length, 0),
            physics_reset=bad,
        )
        new_state = EnvState(new_data, keys, jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length))
        return new_state, out

    def reset_some(state: EnvState, mx: Any, obs: jax.Array, mask: jax.Array) -> tuple[EnvState, jax.Array]:
        # Only the chosen envs' keys advance, so the others' future reset draws are the same as without it.
        next_keys, sub = _split_keys(state.keys)
        fresh, fresh_obs = jax.vmap(reset_one, in_axes=(mx_axes, 0))(mx, sub)
        new_state = EnvState(
            _where_rows(mask, fresh, state.data),
            jnp.where(mask[:, None], next_keys, state.keys),
            jnp.where(mask, 0.0, state.ep_return),
            jnp.where(mask, 0, state.ep_length),
        )
        return new_state, jnp.where(mask[:, None], fresh_obs, obs)

    return reset_all, step_all, reset_some


class MjxEnv(BatchedEnv):
    """MJX backend. See the module docstring; build with ``sample_fast.envs.make(name, n, backend="mjx")``.

    Attributes beyond ``BatchedEnv``: ``compile_s`` (seconds this instance spent getting its reset + step programs:
    about 0 when an identical env of this process had compiled them, ``programs_reused``),
    ``deviations`` (model changes made for MJX), ``options`` (resolved task + backend options), ``mj_model`` (the
    MjModel actually simulated), ``jax_device``.
    """

    backend = "mjx"

    def __init__(self, name: str, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, **options: Any):
        self.options = opts = check_options(name, options)
        self.name = name
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.task = task = tasks.TASKS[name]
        self.jax_device = jax_device_for(self.device)
        self.dtype = jnp.float64 if opts["precision"] == "float64" else jnp.float32
        if opts["compilation_cache_dir"]:
            jax.config.update("jax_compilation_cache_dir", str(opts["compilation_cache_dir"]))

        self.mj_model = model = physics.build_model(task, opts)
        self.deviations = self._adapt_model(model, opts["solver"])
        self.consts = physics.model_consts(model)
        self.frame_skip = int(opts["frame_skip"])
        self.dt = float(model.opt.timestep) * self.frame_skip
        self.max_episode_steps = opts["max_episode_steps"]
        self.observation_spec = Spec(shape=(task.obs_size(self.consts, opts),), dtype=torch.float32)
        lo, hi = model.actuator_ctrlrange.T
        self.action_spec = Spec(
            shape=(model.nu,),
            dtype=torch.float32,
            low=torch.as_tensor(lo, dtype=torch.float32),
            high=torch.as_tensor(hi, dtype=torch.float32),
        )
        try:
            self._mx = self._cast(mjx.put_model(model, device=self.jax_device))
        except NotImplementedError as e:
            raise EnvError(f"task {name!r} uses a MuJoCo feature MJX does not implement: {e}") from e
        # Domain randomization: the randomized fields get a leading env axis and vmap maps over them (in_axes 0);
        # every other model field stays shared (in_axes None), so the step program is otherwise unchanged.
        self._mx_axes = None
        if opts["model_params"] is not None:
            from .custom import check_model_params

            params = check_model_params(model, opts["model_params"], self.num_envs)
            batched = {k: jax.device_put(jnp.asarray(v, self.dtype), self.jax_device) for k, v in params.items()}
            self._mx = self._mx.tree_replace(batched)
            self._mx_axes = jax.tree_util.tree_map(lambda _: None, self._mx).tree_replace({k: 0 for k in batched})
        self._body_mass = np.asarray(self.consts.body_mass)
        self._seed = int(seed)
        self._state: EnvState | None = None
        self._out: StepOut | None = None
        self._last_obs: jax.Array | None = None  # the obs the last step or reset returned (an immutable JAX array)
        self._build_programs()

    # ----- set-up ---------------------------------------------------------------------------------------
    @staticmethod
    def _adapt_model(model: mujoco.MjModel, solver: str | None) -> list[str]:
        """Replace MuJoCo features MJX lacks, returning one line per change (also listed in docs/mjx.md)."""
        changes = []
        if solver is not None:
            model.opt.solver = _SOLVERS[solver]  # a known name (check_options)
        elif model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
            changes.append("solver PGS -> Newton (MJX implements only CG and Newton)")
        return changes

    def _cast(self, tree: Any) -> Any:
        """Cast floating leaves to the env's precision (a no-op in float32 without x64)."""
        return _cast_tree(tree, self.dtype)

    def _program_key(self) -> tuple:
        """What the compiled programs depend on: the simulated model (its bytes, after ``_adapt_model``), the resolved
        options (values closed over), which model fields are per env (``model_params``: their values are arguments),
        the batch size, precision and x64 mode, the device, and ``skips_idle_reset``'s choice of reset branch."""
        buf = np.zeros(mujoco.mj_sizeModel(self.mj_model), np.uint8)
        mujoco.mj_saveModel(self.mj_model, None, buf)
        opts = {k: v for k, v in self.options.items() if k not in ("model_params", "compilation_cache_dir")}
        per_env = None
        if self._mx_axes is not None:
            per_env = tuple(sorted((k, np.shape(v)) for k, v in self.options["model_params"].items()))
        # id(task): the task's functions are traced into the programs, and a custom robot can be registered again
        # under its name with other functions (the cache entry holds the task, so the id stays its own meanwhile)
        return (self.name, id(self.task), hashlib.sha256(buf.tobytes()).hexdigest(), repr(sorted(opts.items())),
                per_env, self.num_envs, str(self.dtype), bool(jax.config.jax_enable_x64), str(self.jax_device),
                skips_idle_reset(self.jax_device))  # fmt: skip

    def _build_programs(self) -> None:
        """Trace and compile reset and step once per process for identical envs (``_PROGRAMS``); ``compile_s``
        records the time this instance spent (about 0 when it reused the programs: ``programs_reused``)."""
        t0 = time.perf_counter()
        keys = jax.device_put(_seed_keys(self._seed, self.num_envs), self.jax_device)
        key = self._program_key()
        with _PROGRAMS_LOCK:
            entry = _PROGRAMS.get(key)
            self.programs_reused = entry is not None
            if entry is None:
                entry = (*self._compile_programs(keys), self.task)  # the task: see _program_key
                _PROGRAMS[key] = entry
                while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
                    _PROGRAMS.popitem(last=False)
            _PROGRAMS.move_to_end(key)
        self._reset_fn, self._step_fn, self._reset_some, _ = entry
        self._state, _ = self._reset_fn(self._mx, keys)
        self.compile_s = time.perf_counter() - t0

    def _compile_programs(self, keys: jax.Array) -> tuple[Any, Any, Any]:
        """``(reset, step, reset_some)`` for this instance: reset and step traced and compiled now, ``reset_some``
        on the first ``reset(env_mask=...)``."""
        reset_one, step_one = self._per_env_programs()
        reset_all, step_all, reset_some = _batch_programs(
            reset_one, step_one, self._mx_axes, self.options["max_episode_steps"], skips_idle_reset(self.jax_device)
        )
        level = self.options["xla_opt_level"]
        compiler_options = None if level is None else {"xla_backend_optimization_level": int(level)}
        reset_fn = jax.jit(reset_all).lower(self._mx, keys).compile(compiler_options)
        state, _ = reset_fn(self._mx, keys)
        actions = jax.device_put(jnp.zeros((self.num_envs, self.consts.nu), jnp.float32), self.jax_device)
        # Donating the state lets XLA write the next state into the same buffers (no per-step allocation).
        step_fn = jax.jit(step_all, donate_argnums=(0,)).lower(state, self._mx, actions).compile(compiler_options)
        return reset_fn, step_fn, jax.jit(reset_some, donate_argnums=(0,))

    def _per_env_programs(self) -> tuple[Callable, Callable]:
        """One env's traced functions: ``reset_one(mx, key) -> (data, obs)`` and ``step_one(mx, d, action) ->
        (data, obs, reward, terminated, finite)``, this instance's task, options and dtype closed over."""
        task, opts, frame_skip, dt, dtype = self.task, self.options, self.frame_skip, self.dt, self.dtype
        consts = self.consts._replace(body_mass=jnp.asarray(self._body_mass, dtype=dtype))
        fields = task.fields
        needs_rne = "cfrc_ext" in fields
        noise_scale = float(opts["reset_noise_scale"])
        normal_qvel = task.reset_noise == "uniform_normal"
        zero_cfrc = jnp.zeros((self.consts.nbody, 6), dtype)
        gravcomp = bool(self.mj_model.flg_gravcomp)  # some body has gravity compensation
        cast = functools.partial(_cast_tree, dtype=dtype)  # not self._cast: _PROGRAMS must not keep this env alive

        def reset_one(mx: Any, key: jax.Array) -> tuple[Any, jax.Array]:
            # Gymnasium: qpos = init_qpos + U(-s, s); qvel = init_qvel + s*N(0,1) (ant, cheetah) or U(-s, s).
            kq, kv = jax.random.split(key)
            qpos = mx.qpos0 + jax.random.uniform(kq, (mx.nq,), dtype, -noise_scale, noise_scale)
            if normal_qvel:
                qvel = noise_scale * jax.random.normal(kv, (mx.nv,), dtype)
            else:
                qvel = jax.random.uniform(kv, (mx.nv,), dtype, -noise_scale, noise_scale)
            d = cast(mjx.make_data(mx)).replace(qpos=qpos, qvel=qvel)
            # PERF: mjx.step begins with a full forward pass, so a reset only needs what the first observation and
            # position read: kinematics (xpos, xipos) for most tasks, which compiles ~10x faster than mjx.forward.
            d = reset_forward(mx, d, fields, gravcomp)
            if needs_rne:
                # Gymnasium's reset calls only mj_forward, so cfrc_ext is zero in the first observation.
                d = d.tree_replace({"_impl.cfrc_ext": zero_cfrc}) if hasattr(d, "_impl") else d
            return d, task.observation(jnp, _physics(d, fields), opts, consts).astype(jnp.float32)

        def physics_step(mx: Any, d: Any, action: jax.Array) -> Any:
            d = d.replace(ctrl=action.astype(dtype))
            # PERF: fori_loop keeps one copy of mjx.step in the program (an unrolled loop compiles frame_skip copies).
            d = jax.lax.fori_loop(0, frame_skip, lambda _, dd: mjx.step(mx, dd), d)
            if needs_rne:
                d = mjx.rne_postconstraint(mx, d)  # gymnasium calls mj_rnePostConstraint after every env step
            return d

        def step_one(mx: Any, d: Any, action: jax.Array) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
            pos_before = task.position(jnp, _physics(d, fields), opts, consts)
            d = physics_step(mx, d, action)
            p = _physics(d, fields)
            velocity = (task.position(jnp, p, opts, consts) - pos_before) / dt
            reward, healthy = task.reward(jnp, p, opts, consts, action.astype(dtype), velocity)
            terminated = tasks.is_terminated(jnp, healthy, opts)
            obs = task.observation(jnp, p, opts, consts)
            finite = jnp.all(jnp.isfinite(d.qpos)) & jnp.all(jnp.isfinite(d.qvel)) & jnp.all(jnp.isfinite(obs))
            finite = finite & jnp.isfinite(reward)
            return d, obs.astype(jnp.float32), reward.astype(jnp.float32), terminated, finite

        return reset_one, step_one

    # ----- BatchedEnv hooks --------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is not None:
            self._seed = int(seed)
            keys = jax.device_put(_seed_keys(self._seed, self.num_envs), self.jax_device)
        else:
            keys = self._state.keys
        self._state, obs = self._reset_fn(self._mx, keys)
        jax.block_until_ready(obs)  # SYNC: reset is rare; hand torch a finished buffer
        self._last_obs = obs
        return _to_torch(obs), {}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = jax.device_put(jnp.asarray(env_mask.cpu().numpy()), self.jax_device)  # SYNC: a rare, small copy
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            self._state, obs = self._reset_some(self._state, self._mx, self._last_obs, mask)
        jax.block_until_ready(obs)
        self._last_obs = obs
        return _to_torch(obs), {}

    def _send(self, actions: torch.Tensor) -> None:
        # The clone decouples the step from the caller's buffer: with async dispatch the step may still be
        # reading the actions when send() returns, and callers reuse action buffers.
        jax_actions = jax.dlpack.from_dlpack(actions.detach().contiguous().clone())
        if jax_actions.devices() != {self.jax_device}:
            jax_actions = jax.device_put(jax_actions, self.jax_device)
        # PERF: JAX async dispatch: this returns as soon as the step is enqueued.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            self._state, self._out = self._step_fn(self._state, self._mx, jax_actions)

    def _recv(self, actions: torch.Tensor) -> StepResult:
        out, self._out = self._out, None
        jax.block_until_ready(out)  # SYNC: the one wait per step
        self._last_obs = out.obs  # for reset(env_mask=...): the rows of the envs that are not reset
        info = {
            "final_obs": _to_torch(out.final_obs),
            "episode_return": _to_torch(out.episode_return),
            "episode_length": _to_torch(out.episode_length).to(torch.int64),
            "physics_reset": _to_torch(out.physics_reset),
        }
        return StepResult(
            _to_torch(out.obs), _to_torch(out.reward), _to_torch(out.terminated), _to_torch(out.truncated), info
        )

    def _close(self) -> None:
        self._state = None
        self._out = None
        self._last_obs = None

    def physics_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(qpos [N, nq], qvel [N, nv])`` of every env now, in the env's precision (copies; for tests/debugging)."""
        d = self._state.data
        return torch.from_dlpack(jnp.array(d.qpos)), torch.from_dlpack(jnp.array(d.qvel))

    # ----- test hook --------------------------------------------------------------------------------------
    def _poison_physics(self, env_idx: int) -> None:
        """Test hook: set env ``env_idx``'s qvel to NaN, as a diverged simulation would."""
        d = self._state.data
        self._state = self._state._replace(data=d.replace(qvel=d.qvel.at[env_idx].set(jnp.nan)))


def skips_idle_reset(jax_device: Any) -> bool:
    """Whether the step program computes the auto-reset branch only when some env's episode ended (``lax.cond``:
    the CPU), or always, selecting per row (GPUs: see ``step_all``). Both give the same results; a module-level
    function so the tests can build the GPU program on the CPU."""
    return jax_device.platform == "cpu"


def _seed_keys(seed: int, num_envs: int) -> jax.Array:
    return jax.random.split(jax.random.PRNGKey(seed), num_envs)


def _split_keys(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advance every env's key; returns (next keys, keys to use now), both ``[N, 2]``."""
    both = jax.vmap(jax.random.split)(keys)
    return both[:, 0], both[:, 1]


def _to_torch(x: jax.Array) -> torch.Tensor:
    """Zero-copy view of a JAX array as a torch tensor on the same device (DLPack)."""
    return torch.from_dlpack(x)
