"""The ``warp`` backend: N worlds of a MuJoCo task stepped by MuJoCo Warp (MJWarp, on NVIDIA Warp), read by torch
through zero-copy views.

Owns: the MJWarp ``Model`` and batched ``Data`` (Warp arrays on the env's device), torch views of the arrays the task
reads (``wp.to_torch``: same storage, no copy), per-world reset RNG state (a seed and a counter per world, drawn in a
Warp kernel), the episode counters and the static input/output tensors of the step, and on CUDA the captured CUDA
graph of one whole env step. The env step -- actions in, ``frame_skip`` x ``mjw.step``, ``rne_postconstraint`` where
the task reads ``cfrc_ext``, the task maths (``envs.tasks`` with torch as the array namespace), the non-finite guard,
the contact/constraint overflow flags and the same-step auto-reset of ended worlds -- is one function: on CUDA it is
captured once (torch and Warp on one stream) and replayed by ``send()``; on the CPU it runs eagerly. The MjModel comes
from ``envs.physics.build_model``, so model options mean the same here as on the ``mujoco`` and ``mjx`` backends.
Deviations from MuJoCo C / gymnasium are listed in ``WARP_DEVIATIONS`` and ``env.deviations``; see docs/warp.md.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from importlib import metadata
from typing import Any

import mujoco
import numpy as np
import torch

from . import physics, tasks
from .base import BatchedEnv, EnvError, OptionError, Spec, StepResult

#: The versions this backend is built and tested on (pyproject.toml and scripts/setup.sh pin the same; docs/warp.md
#: says how to move the pin).
PINNED_VERSIONS = {"mujoco-warp": "4.0.0", "warp-lang": "1.19.0"}
INSTALL_LINE = "pip install " + " ".join(f"{k}=={v}" for k, v in PINNED_VERSIONS.items())

try:
    import mujoco_warp as mjw
    import warp as wp
except ImportError as e:  # sample_fast.envs turns this into an EnvError with the install line
    raise ImportError(f"{e}; the warp backend needs: {INSTALL_LINE}") from e

from mujoco_warp._src.io import _default_nconmax, _default_njmax  # noqa: E402  (MJWarp's own size guesses)
from mujoco_warp._src.types import OverflowType  # noqa: E402

from .sim_options import WARP_OPTIONS  # noqa: E402

WARP_DEVIATIONS = """\
* Physics runs in float32 (MuJoCo C and gymnasium use float64); trajectories drift apart after tens of steps.
* MJWarp has no PGS solver: humanoid.xml's solver="PGS" becomes Newton (MuJoCo's default), recorded in env.deviations.
* Collision and constraint code are MJWarp's own (same contact model, different implementation and summation order).
* Contacts and constraint rows live in fixed buffers (nconmax, njmax); an overflow raises EnvError naming the option.
* Reset noise comes from Warp's counter-based RNG (one seed and counter per world), not numpy.
"""

_SOLVERS = {"newton": mujoco.mjtSolver.mjSOL_NEWTON, "cg": mujoco.mjtSolver.mjSOL_CG}

#: Overflow bits that mean MJWarp dropped contacts or constraint rows, with the option that fixes each.
_OVERFLOWS = (
    (int(OverflowType.BROADPHASE), "nconmax", "more collision candidates than the contact buffer holds"),
    (int(OverflowType.NARROWPHASE), "nconmax", "more contacts than the contact buffer holds"),
    (int(OverflowType.CCD), "nconmax", "more convex-collision contacts than the buffer holds"),
    (int(OverflowType.NEFC), "njmax", "more constraint rows than njmax in a world"),
    (int(OverflowType.NJMAX_NNZ), "njmax", "more constraint Jacobian non-zeros than the buffer (sized by njmax)"),
)

#: Headroom of the per-task buffer sizes over the most contacts / constraint rows a probe rollout saw.
SIZE_HEADROOM = 2.0
#: The probe: MuJoCo C rollouts of the task with uniform random actions (seeded), from the task's reset noise.
_PROBE_ROLLOUTS, _PROBE_STEPS = 2, 200


def versions() -> dict[str, str]:
    """Installed versions of the two packages this backend pins."""
    out = {}
    for pkg in PINNED_VERSIONS:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "unknown"
    return out


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's and MJWarp's options resolved and checked, without building a model or compiling; raises
    ``EnvError``. ``WarpEnv`` calls it first, and so does the trainer's config check (``sample_fast.envs
    .check_options``), so a config is rejected for exactly what this backend would reject. ``model_params`` needs
    the model: checked later."""
    if name not in tasks.TASKS:
        raise EnvError(f"backend 'warp' runs the MuJoCo tasks {sorted(tasks.TASKS)}, not {name!r}")
    opts = tasks.resolve_options(tasks.TASKS[name], options, WARP_OPTIONS)
    if opts["solver"] is not None and opts["solver"] not in _SOLVERS:
        raise EnvError(f"solver must be one of {sorted(_SOLVERS)} or None, got {opts['solver']!r}")
    tasks.check_int_option(opts, "nconmax", 1, none="sized per task")
    tasks.check_int_option(opts, "njmax", 1, none="sized per task")
    if not isinstance(opts["cuda_graph"], bool):
        raise OptionError("cuda_graph", opts["cuda_graph"], "must be True or False")
    cache = opts["kernel_cache_dir"]
    if cache is not None and (not isinstance(cache, (str, os.PathLike)) or not str(cache)):
        raise OptionError("kernel_cache_dir", cache, "must be a directory path or None")
    return opts


def set_kernel_cache_dir(path: str | os.PathLike[str] | None) -> str:
    """Point Warp's kernel cache at ``path`` (process-wide; created if missing) and return the directory in use.
    None keeps the current one ($WARP_CACHE_PATH or Warp's default). Compiled kernels are reused from it by every
    later process, so only the first build of a task pays the compile."""
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        os.makedirs(path, exist_ok=True)
        if _warp_initialized():
            from warp._src import build  # the public route (wp.config before wp.init) is closed once initialized

            build.init_kernel_cache(path)
        else:
            wp.config.kernel_cache_dir = path
    _init_warp()
    return str(wp.config.kernel_cache_dir)


def _warp_initialized() -> bool:
    from warp._src import context

    return context.runtime is not None


def _init_warp() -> None:
    wp.config.log_level = wp.LOG_WARNING  # no "Module ... load" line per kernel
    wp.init()


def warp_device_for(device: torch.device) -> Any:
    """The Warp device matching a torch device; raises ``EnvError`` listing Warp's devices when there is none."""
    _init_warp()
    if device.type not in ("cpu", "cuda"):
        raise EnvError(f"backend 'warp' runs on 'cpu' or 'cuda' devices, not {device}")
    name = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
    names = [str(d) for d in wp.get_devices()]
    if name not in names:
        raise EnvError(
            f"device {device}: Warp has no device {name!r}; Warp sees {names}"
            + (" (no CUDA device: is the NVIDIA driver installed?)" if device.type == "cuda" else "")
            + "; use one of those, e.g. device='cpu'"
        )
    return wp.get_device(name)


class TorchNamespace:
    """``torch`` as the array namespace of ``envs.tasks``, on one device: every attribute is torch's, except
    ``asarray``, which puts constants (``xp.asarray((0.3, 0.6))`` in a task function) on the env's device and keeps
    them, so no host-to-device copy happens inside a step (which a CUDA graph capture would reject)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._consts: dict[Any, torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def asarray(self, x: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x.to(device=self.device, dtype=dtype or x.dtype)
        key = (repr(np.asarray(x).tolist()), np.asarray(x).dtype.str, dtype)
        t = self._consts.get(key)
        if t is None:
            arr = np.asarray(x)
            t = torch.as_tensor(arr, device=self.device)
            if dtype is not None or t.is_floating_point():
                t = t.to(dtype or torch.float32)
            self._consts[key] = t
        return t


def buffer_sizes(model: mujoco.MjModel, task: tasks.TaskDef, opts: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(nconmax, njmax, seen_ncon, seen_nefc)``: contacts and constraint rows per world for ``model``.

    Each is ``SIZE_HEADROOM`` times the most a probe saw (MuJoCo C rollouts with uniform random actions from the
    task's reset noise, ``_PROBE_ROLLOUTS`` x ``_PROBE_STEPS`` env steps: the robot falls, rolls and lies on the
    floor), and never less than MJWarp's own guess for the model; the options ``nconmax``/``njmax`` override."""
    d = mujoco.MjData(model)
    rng = np.random.default_rng(0)
    lo, hi = model.actuator_ctrlrange.T
    lo, hi = np.where(model.actuator_ctrllimited, lo, -1.0), np.where(model.actuator_ctrllimited, hi, 1.0)
    scale = float(opts["reset_noise_scale"])
    max_ncon = max_nefc = 0
    for _ in range(_PROBE_ROLLOUTS):
        mujoco.mj_resetData(model, d)
        d.qpos[:] = model.qpos0 + rng.uniform(-scale, scale, model.nq)
        d.qvel[:] = rng.uniform(-scale, scale, model.nv)
        for _ in range(_PROBE_STEPS):
            d.ctrl[:] = rng.uniform(lo, hi)
            mujoco.mj_step(model, d, nstep=int(opts["frame_skip"]))
            if not (np.isfinite(d.qpos).all() and np.isfinite(d.qvel).all()):
                break
            max_ncon, max_nefc = max(max_ncon, d.ncon), max(max_nefc, d.nefc)
    nconmax = opts["nconmax"] or max(_default_nconmax(model), _round_up(SIZE_HEADROOM * max_ncon, 8))
    njmax = opts["njmax"] or max(_default_njmax(model), _round_up(SIZE_HEADROOM * max_nefc, 16))
    return int(nconmax), int(njmax), max_ncon, max_nefc


def _round_up(x: float, k: int) -> int:
    return int(math.ceil(x / k) * k) if x > 0 else 0


@wp.kernel
def _reset_noise(
    reset: wp.array(dtype=wp.bool),
    seeds: wp.array(dtype=wp.int32),
    counters: wp.array(dtype=wp.int32),
    qpos0: wp.array2d(dtype=wp.float32),
    scale: wp.float32,
    normal_qvel: wp.int32,
    qpos: wp.array2d(dtype=wp.float32),
    qvel: wp.array2d(dtype=wp.float32),
):
    """Gymnasium's reset noise for the worlds in ``reset``: qpos = qpos0 + U(-s, s); qvel = s * N(0, 1) (ant,
    cheetah) or U(-s, s). Each world draws from its own stream (seed, counter), so results do not depend on which
    other worlds reset."""
    w = wp.tid()
    if not reset[w]:
        return
    state = wp.rand_init(seeds[w], counters[w])
    counters[w] = counters[w] + 1
    row = w % qpos0.shape[0]  # qpos0 is shared (one row) unless randomized per world
    for i in range(qpos.shape[1]):
        qpos[w, i] = qpos0[row, i] + wp.randf(state, -scale, scale)
    for i in range(qvel.shape[1]):
        if normal_qvel != 0:
            qvel[w, i] = scale * wp.randn(state)
        else:
            qvel[w, i] = wp.randf(state, -scale, scale)


def resets_every_step(device: torch.device) -> bool:
    """Whether the step runs the auto-reset on every step and selects by row (CUDA: no host read, capturable), or only
    when some world is done (the CPU, eager). Both give the same results; a module-level function so the tests run
    the CUDA variant on the CPU."""
    return device.type == "cuda"


class WarpEnv(BatchedEnv):
    """MuJoCo Warp backend. See the module docstring; build with ``sample_fast.envs.make(name, n, backend="warp")``.

    Attributes beyond ``BatchedEnv``: ``compile_s`` (seconds of the first step and reset: Warp's kernel build or
    cache load, and on CUDA the graph capture), ``deviations`` (model changes made for MJWarp), ``options``
    (resolved), ``mj_model`` (the MjModel simulated), ``mjw_model``/``mjw_data`` (MJWarp's), ``nconmax``/``njmax``
    (the buffer sizes in use), ``wp_device``, ``cuda_graph`` (True when steps replay a captured graph),
    ``versions`` (installed mujoco-warp and warp-lang).
    """

    backend = "warp"

    def __init__(self, name: str, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, **options: Any):
        self.options = opts = check_options(name, options)
        self.name = name
        self.num_envs = n = int(num_envs)
        self.device = torch.device(device)
        self.task = task = tasks.TASKS[name]
        self.versions = versions()
        if self.versions != PINNED_VERSIONS:
            warnings.warn(
                f"the warp backend is pinned to {PINNED_VERSIONS} but {self.versions} is installed; physics speed "
                f"and results may differ (docs/warp.md: moving the pin). Install the pin with: {INSTALL_LINE}",
                stacklevel=2,
            )
        self.kernel_cache_dir = set_kernel_cache_dir(opts["kernel_cache_dir"])
        self.wp_device = warp_device_for(self.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.device.index or 0)

        self.mj_model = model = physics.build_model(task, opts)
        self.deviations = self._adapt_model(model, opts["solver"])
        self.consts = physics.model_consts(model)
        self.frame_skip = int(opts["frame_skip"])
        self.dt = float(model.opt.timestep) * self.frame_skip
        self.max_episode_steps = opts["max_episode_steps"]
        self.observation_spec = Spec(shape=(task.obs_size(self.consts, opts),), dtype=torch.float32)
        lo, hi = model.actuator_ctrlrange[:, 0].copy(), model.actuator_ctrlrange[:, 1].copy()
        limited = model.actuator_ctrllimited.astype(bool)
        lo[~limited], hi[~limited] = -np.inf, np.inf
        self.action_spec = Spec(
            shape=(model.nu,),
            dtype=torch.float32,
            low=torch.as_tensor(lo, dtype=torch.float32),
            high=torch.as_tensor(hi, dtype=torch.float32),
        )
        from .custom import check_model_params

        params = check_model_params(model, opts["model_params"], n)
        self.nconmax, self.njmax, self.probe_ncon, self.probe_nefc = buffer_sizes(model, task, opts)
        with wp.ScopedDevice(self.wp_device):
            try:
                self.mjw_model = mjw.put_model(model, batch_sizes={k: n for k in params} or None)
            except NotImplementedError as e:
                raise EnvError(
                    f"task {name!r} uses a MuJoCo feature MuJoCo Warp {self.versions['mujoco-warp']} does not "
                    f"implement: {e} Remove it from the MJCF, or use backend='mujoco'"
                ) from e
            except ValueError as e:
                raise EnvError(f"task {name!r} cannot run on MuJoCo Warp: {e}") from e
            self.mjw_model.opt.warn_overflow = 0  # overflows raise EnvError here (recv) instead of printing
            self.mjw_data = mjw.make_data(model, nworld=n, nconmax=self.nconmax, njmax=self.njmax)
            for k, v in params.items():
                wp.to_torch(getattr(self.mjw_model, k)).view(n, *np.shape(getattr(model, k))).copy_(
                    torch.as_tensor(v, dtype=torch.float32)
                )
        self._build_views()
        self._seed = int(seed)
        self._seed_worlds(self._seed)
        self._graph: Any = None
        self.cuda_graph = False
        self._in_flight = False
        self._needs_reset = True
        t0 = time.perf_counter()
        self._warm_up()
        self.compile_s = time.perf_counter() - t0

    # ----- set-up ---------------------------------------------------------------------------------------
    @staticmethod
    def _adapt_model(model: mujoco.MjModel, solver: str | None) -> list[str]:
        """Replace MuJoCo features MJWarp lacks, returning one line per change (also listed in docs/warp.md)."""
        changes = []
        if solver is not None:
            model.opt.solver = _SOLVERS[solver]
        elif model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
            model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
            changes.append("solver PGS -> Newton (MJWarp implements only CG and Newton)")
        return changes

    def _build_views(self) -> None:
        """Torch views of the Warp arrays the step reads and writes, and the step's static tensors."""
        d, dev, n = self.mjw_data, self.device, self.num_envs
        self.xp = TorchNamespace(dev)
        self._views = {f: wp.to_torch(getattr(d, f)) for f in self.task.fields}
        self._qpos, self._qvel = wp.to_torch(d.qpos), wp.to_torch(d.qvel)
        self._ctrl = wp.to_torch(d.ctrl)
        self._overflow = wp.to_torch(d.overflow)
        self._cfrc_ext = wp.to_torch(d.cfrc_ext)
        self._lo = self.action_spec.low.to(dev)
        self._hi = self.action_spec.high.to(dev)
        self._body_mass = torch.as_tensor(self.consts.body_mass, dtype=torch.float32, device=dev)
        self._consts = self.consts._replace(body_mass=self._body_mass)
        self._actions = torch.zeros(n, self.consts.nu, dtype=torch.float32, device=dev)
        self._mask = torch.zeros(n, dtype=torch.bool, device=dev)  # the worlds to reset, read by Warp kernels
        self._wp_mask = wp.from_torch(self._mask, dtype=wp.bool)
        self._ep_return = torch.zeros(n, dtype=torch.float32, device=dev)
        self._ep_length = torch.zeros(n, dtype=torch.int64, device=dev)
        self._position = torch.zeros(n, self._position_size(), dtype=torch.float32, device=dev)
        self._obs = torch.zeros(n, *self.observation_spec.shape, dtype=torch.float32, device=dev)
        self._overflow_seen = torch.zeros(len(_OVERFLOWS), dtype=torch.bool, device=dev)
        self._out: tuple[torch.Tensor, ...] | None = None
        fields = set(self.task.fields)
        # What a reset world needs before its first observation: nothing (qpos/qvel tasks), kinematics (positions),
        # or a full forward pass (cinert, cvel, qfrc_actuator) -- run on every world, the selection is by row.
        self._reset_pass = None if fields <= {"qpos", "qvel"} else (
            mjw.kinematics if fields <= {"qpos", "qvel", "xpos", "xipos", "cfrc_ext"} else mjw.forward
        )  # fmt: skip

    def _position_size(self) -> int:
        phys = tasks.Physics(**{f: torch.zeros(1, *v.shape[1:]) for f, v in self._views.items()})
        consts = self.consts._replace(body_mass=torch.as_tensor(self.consts.body_mass, dtype=torch.float32))
        return int(self.task.position(TorchNamespace(torch.device("cpu")), phys, self.options, consts).shape[-1])

    def _seed_worlds(self, seed: int) -> None:
        """One RNG stream per world: a seed from ``SeedSequence(seed).spawn(N)`` and a draw counter from 0."""
        seeds = np.array([s.generate_state(1, np.uint32)[0] for s in np.random.SeedSequence(seed).spawn(self.num_envs)])
        if not hasattr(self, "_seeds"):
            with wp.ScopedDevice(self.wp_device):
                self._seeds = wp.zeros(self.num_envs, dtype=wp.int32)
                self._counters = wp.zeros(self.num_envs, dtype=wp.int32)
        # In place: a captured CUDA graph holds these arrays' addresses.
        self._sync()
        self._seeds.assign(seeds.view(np.int32))
        self._counters.zero_()
        self._sync_warp()

    def _physics(self) -> tasks.Physics:
        return tasks.Physics(**self._views)

    # ----- the step and the reset, as device work only (no host reads: captured on CUDA) -------------------
    def _reset_masked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Reset the worlds in ``self._mask`` (MJWarp's ``reset_data``, reset noise, the pass the first observation
        needs); return every world's would-be first observation and position (callers select rows by the mask)."""
        m, d, opts = self.mjw_model, self.mjw_data, self.options
        mjw.reset_data(m, d, reset=self._wp_mask)
        wp.launch(
            _reset_noise,
            dim=self.num_envs,
            inputs=[self._wp_mask, self._seeds, self._counters, m.qpos0, float(opts["reset_noise_scale"]),
                    int(self.task.reset_noise == "uniform_normal")],
            outputs=[d.qpos, d.qvel],
        )  # fmt: skip
        if self._reset_pass is not None:
            self._reset_pass(m, d)
        if "cfrc_ext" in self._views:  # gymnasium's reset runs mj_forward only: cfrc_ext is zero in the first obs
            self._cfrc_ext.masked_fill_(self._mask[:, None, None], 0.0)
        phys, xp = self._physics(), self.xp
        obs = self.task.observation(xp, phys, opts, self._consts).to(torch.float32).clone()
        return obs, self.task.position(xp, phys, opts, self._consts).to(torch.float32).clone()

    def _step_body(self) -> tuple[torch.Tensor, ...]:
        """One env step on device from ``self._actions``; returns the step's outputs (static on CUDA graphs)."""
        m, d, opts, xp, task, consts = self.mjw_model, self.mjw_data, self.options, self.xp, self.task, self._consts
        ctrl = torch.clamp(self._actions, self._lo, self._hi)  # as the mujoco backend: the reward sees the clip
        self._ctrl.copy_(ctrl)
        for _ in range(self.frame_skip):
            mjw.step(m, d)
        if "cfrc_ext" in self._views:
            mjw.rne_postconstraint(m, d)  # gymnasium calls mj_rnePostConstraint after every env step
        ov = self._overflow
        for k, (bit, _, _) in enumerate(_OVERFLOWS):  # before the reset below clears the flags of reset worlds
            self._overflow_seen[k] |= ((ov & bit) != 0).any()
        p = self._physics()
        # The task functions may return views of the Warp arrays (position() is xpos[..., 1, :2] for Ant): copies,
        # because the reset below rewrites those arrays in place (kinematics runs on every world).
        position = task.position(xp, p, opts, consts).to(torch.float32).clone()
        velocity = (position - self._position) / self.dt
        reward, healthy = task.reward(xp, p, opts, consts, ctrl, velocity)
        reward = reward.to(torch.float32).clone()
        terminated = tasks.is_terminated(xp, healthy, opts).clone()
        obs = task.observation(xp, p, opts, consts).to(torch.float32).clone()
        finite = torch.isfinite(p.qpos).all(-1) & torch.isfinite(p.qvel).all(-1) & torch.isfinite(obs).all(-1)
        bad = ~(finite & torch.isfinite(reward))
        reward = torch.where(bad, 0.0, reward)
        obs = torch.where(bad[:, None], 0.0, obs)  # observations never carry NaN; the final_obs row is zeros
        terminated = terminated | bad
        self._ep_length += 1
        if self.max_episode_steps is not None:
            truncated = self._ep_length >= self.max_episode_steps
        else:
            truncated = torch.zeros_like(terminated)
        done = terminated | truncated
        self._ep_return += reward
        episode_return = torch.where(done, self._ep_return, 0.0)
        episode_length = torch.where(done, self._ep_length, 0)
        self._ep_return.masked_fill_(done, 0.0)
        self._ep_length.masked_fill_(done, 0)
        self._mask.copy_(done)
        if resets_every_step(self.device) or bool(done.any()):
            # PERF: on CUDA no branch on "some world is done" (a host read, and not capturable): the reset runs on
            # every step and selects by row, as MJX does on a GPU; with thousands of worlds some episode ends nearly
            # every step anyway. On the CPU (eager) it runs only when some world is done.
            fresh_obs, fresh_pos = self._reset_masked()
            next_obs = torch.where(done[:, None], fresh_obs, obs)
            position = torch.where(done[:, None], fresh_pos, position)
        else:
            next_obs = obs
        self._position.copy_(position)
        self._obs.copy_(next_obs)
        return next_obs, reward, terminated, truncated, obs, episode_return, episode_length, bad

    def _warm_up(self) -> None:
        """Build (or load from the cache) every kernel by running a reset and a step; on CUDA capture the step."""
        if self.device.type != "cuda":
            with wp.ScopedDevice(self.wp_device):
                self._reset_all()
                self._step_body()
            self._seed_worlds(self._seed)  # the warm-up drew from the streams: start them again
            self._needs_reset = True
            return
        self._stream = torch.cuda.Stream(device=self.device)
        self._wp_stream = wp.stream_from_torch(self._stream)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream), wp.ScopedDevice(self.wp_device), wp.ScopedStream(self._wp_stream):
            self._reset_all()
            for _ in range(2):  # side-stream warm-up before capture, as torch.cuda.graph asks
                self._step_body()
        if self.options["cuda_graph"]:
            graph = torch.cuda.CUDAGraph()
            with wp.ScopedDevice(self.wp_device), wp.ScopedStream(self._wp_stream):
                with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
                    wp.capture_begin(device=self.wp_device, force_module_load=False, external=True)
                    try:
                        self._graph_out = self._step_body()
                    finally:
                        wp.capture_end(device=self.wp_device)
            self._graph = graph
            self.cuda_graph = True
        self._stream.synchronize()
        self._seed_worlds(self._seed)
        self._needs_reset = True

    def _reset_all(self) -> torch.Tensor:
        self._mask.fill_(True)
        obs, pos = self._reset_masked()
        self._position.copy_(pos)
        self._obs.copy_(obs)
        self._ep_return.zero_()
        self._ep_length.zero_()
        self._overflow_seen.zero_()
        return obs

    # ----- BatchedEnv hooks --------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        self._finish_in_flight()
        if seed is not None:
            self._seed = int(seed)
            self._seed_worlds(self._seed)
        with self._device_scope():
            self._reset_all()
        self._sync()  # SYNC: reset is rare; hand the caller finished tensors
        self._needs_reset = False
        return self._obs.clone(), {}  # cloned on the caller's stream, after the sync

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Reset only the worlds where ``env_mask`` (bool ``[N]`` on the env's device) is True, each from its own
        RNG stream; return every world's observation (fresh rows where reset, the current ones elsewhere)."""
        if self._needs_reset:
            return self._reset(None)
        mask = torch.as_tensor(env_mask, device=self.device)
        if mask.dtype != torch.bool or tuple(mask.shape) != (self.num_envs,):
            raise EnvError(
                f"env_mask must be a bool tensor of shape ({self.num_envs},); got {mask.dtype} {tuple(mask.shape)}"
            )
        self._finish_in_flight()
        with self._device_scope():
            self._mask.copy_(mask)
            fresh_obs, fresh_pos = self._reset_masked()
            self._obs.copy_(torch.where(mask[:, None], fresh_obs, self._obs))
            self._position.copy_(torch.where(mask[:, None], fresh_pos, self._position))
            self._ep_return.masked_fill_(mask, 0.0)
            self._ep_length.masked_fill_(mask, 0)
        self._sync()
        return self._obs.clone(), {}

    def _send(self, actions: torch.Tensor) -> None:
        if self._needs_reset:
            self._pending = None
            raise EnvError("call reset() before the first step")
        if self.device.type == "cuda":
            caller = torch.cuda.current_stream(self.device)
            self._stream.wait_stream(caller)  # the actions, and the caller's reads of the last outputs, come first
            actions.record_stream(self._stream)  # the caller may free it before the copy below has run
            with torch.cuda.stream(self._stream):
                self._actions.copy_(actions, non_blocking=True)
                if self._graph is not None:
                    self._graph.replay()  # PERF: the whole env step is one graph launch
                    out = self._graph_out
                else:
                    with wp.ScopedDevice(self.wp_device), wp.ScopedStream(self._wp_stream):
                        out = self._step_body()
                seen = self._overflow_seen.to("cpu", non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
            self._out, self._overflow_check = out, (seen, event)
        else:
            self._actions.copy_(actions)
            with wp.ScopedDevice(self.wp_device):
                self._out = self._step_body()
            self._overflow_check = (self._overflow_seen, None)
        self._in_flight = True

    def _recv(self, actions: torch.Tensor) -> StepResult:
        out, self._out = self._out, None
        self._in_flight = False
        if self.device.type == "cuda":
            caller = torch.cuda.current_stream(self.device)
            caller.wait_stream(self._stream)  # device-side ordering: the caller's kernels see the finished step
            out = tuple(t.clone() for t in out)  # the graph's output buffers are rewritten by the next step
        self._raise_on_overflow()
        next_obs, reward, terminated, truncated, final_obs, episode_return, episode_length, bad = out
        info = {
            "final_obs": final_obs,
            "episode_return": episode_return,
            "episode_length": episode_length,
            "physics_reset": bad,
        }
        return StepResult(next_obs, reward, terminated, truncated, info)

    def _raise_on_overflow(self) -> None:
        seen, event = self._overflow_check
        if event is not None:
            event.synchronize()  # SYNC: waits for this step (the caller needs its outputs next anyway)
        if not bool(seen.any()):
            return
        what = [(opt, why) for (_, opt, why), hit in zip(_OVERFLOWS, seen.tolist(), strict=True) if hit]
        opt = what[0][0]
        now = {"nconmax": self.nconmax, "njmax": self.njmax}[opt]
        self._needs_reset = True  # the state is suspect: the next step needs a reset (or a new env)
        raise EnvError(
            f"MuJoCo Warp buffer overflow in task {self.name!r}: {what[0][1]} ({opt}={now} per world, "
            f"{self.num_envs} worlds); contacts or constraints were dropped, so the step is not trustworthy. Raise the "
            f"option {opt} (make(..., {opt}={2 * now}) or env.options.{opt}={2 * now}) and make the env again"
        )

    def _finish_in_flight(self) -> None:
        if self._in_flight:
            self._out = None
            self._in_flight = False
        self._sync()

    def _device_scope(self) -> Any:
        """Run on the env's stream (after the caller's work so far) and Warp device."""
        if self.device.type == "cuda":
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            return _Scopes(torch.cuda.stream(self._stream), wp.ScopedDevice(self.wp_device),
                           wp.ScopedStream(self._wp_stream))  # fmt: skip
        return _Scopes(wp.ScopedDevice(self.wp_device))

    def _sync(self) -> None:
        if self.device.type == "cuda" and hasattr(self, "_stream"):
            self._stream.synchronize()

    def _sync_warp(self) -> None:
        if self.device.type == "cuda":
            wp.synchronize_device(self.wp_device)

    def _close(self) -> None:
        self._sync()
        self._graph = None
        self._graph_out = None
        self._out = None
        self._views = {}

    # ----- tests and debugging ------------------------------------------------------------------------------
    def physics_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(qpos [N, nq], qvel [N, nv])`` of every world now (float32 copies)."""
        self._sync()
        return self._qpos.clone(), self._qvel.clone()

    def _poison_physics(self, env_idx: int) -> None:
        """Test hook: set world ``env_idx``'s qvel to NaN, as a diverged simulation would."""
        self._sync()
        self._qvel[env_idx] = float("nan")


class _Scopes:
    """Enter several context managers as one."""

    def __init__(self, *scopes: Any) -> None:
        self.scopes = scopes

    def __enter__(self) -> None:
        for s in self.scopes:
            s.__enter__()

    def __exit__(self, *exc: Any) -> None:
        for s in reversed(self.scopes):
            s.__exit__(*exc)
