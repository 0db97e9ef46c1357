"""The ``mujoco`` backend: MuJoCo C through the official bindings, stepped on a persistent pool of threads.

Owns each env's physics state (a row of MuJoCo's ``mjSTATE_INTEGRATION`` vector, everything the next step depends
on), one ``MjData`` per worker thread through which the envs are stepped (one ``MjModel`` from
``physics.build_model``), the per-env reset generators with each env's prepared next reset, and the batch arrays the
workers gather physics into. Task semantics (observation, reward, termination, reset noise) come from ``envs.tasks``
and are computed vectorised in numpy over the whole batch; this module adds only stepping, gathering, auto-reset and
bookkeeping.

Per env step the threads take the envs from a shared counter (the caller's thread too: in ``step``, and in ``recv``
for the envs still unclaimed, with ``caller_steps``), in runs of a few envs with the default compiled kernel (one
GIL-free call per run, ``envs.mujoco_kernel``) or one at a time with ``kernel="python"`` (the bindings' calls, each
releasing the GIL), and, for each env: load its state (``ctrl`` included) into the thread's ``MjData``
(``mj_setState``), ``mj_step`` ``frame_skip`` times, ``mj_rnePostConstraint`` where the task reads ``cfrc_ext``
(exactly like gymnasium's ``MujocoEnv``), store the state back (``mj_getState``), copy the task's fields into the
env's rows of the batch arrays, and, if the env's next reset is not prepared yet, prepare it (draw the noise,
``mj_resetData`` + ``mj_forward``, first observation; in Python). ``recv`` then does the maths and copies prepared
resets in for the envs that are done. Results depend on nothing but each env's own state and generator, so they
are identical for any thread count and schedule (tested). Stepping through one cache-hot ``MjData`` per thread (as
``mujoco.rollout`` does) is bit-identical to keeping one ``MjData`` per env, measured a few percent cheaper, and
needs ~1 KiB per env instead of ~750 KiB.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import traceback
from typing import Any

import mujoco
import numpy as np
import torch

from .base import BatchedEnv, EnvError, Spec, StepResult
from .physics import build_model, model_consts
from .tasks import TASKS, Physics, is_terminated, resolve_options

#: Backend options (besides the task options in ``envs.tasks``) with their defaults.
BACKEND_OPTIONS: dict[str, Any] = {
    "num_threads": None,  # None: os.cpu_count(); never more than num_envs
    "step_timeout_s": 60.0,  # recv() raises if the workers have not finished a step by then
    "model_params": None,  # per-env MjModel fields {field: [num_envs, ...]} (domain randomization, envs.custom)
    "caller_steps": False,  # True: recv() steps the envs no worker has claimed yet itself instead of only waiting
    "kernel": "compiled",  # "compiled": runs of envs stepped in one GIL-free call (envs.mujoco_kernel); "python"
    "worker_nice": 0,  # added to the stepping threads' nice value (Linux; 0-19): the caller's thread preempts them
    "pin_workers": False,  # True: stepping thread k runs only on the k-th core this process may use (mod their count)
}

#: How many runs of envs each stepping thread claims per step with the compiled kernel (a run is one GIL-free
#: call): more runs balance the threads better when one is descheduled, fewer take the GIL fewer times.
_RUNS_PER_THREAD = 4

#: MuJoCo warnings that mean the physics blew up: MuJoCo has already reset that MjData, we reset it properly.
_BAD = sorted(
    int(w)
    for w in (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL, mujoco.mjtWarning.mjWARN_BADQACC)
)
#: ... as a slice when they are adjacent (a view instead of a fancy-indexed copy per step).
_BAD_WARNINGS: slice | list[int] = slice(_BAD[0], _BAD[-1] + 1) if _BAD == list(range(_BAD[0], _BAD[-1] + 1)) else _BAD

#: MjData attribute name of each ``Physics`` field.
_FIELDS = ("qpos", "qvel", "cfrc_ext", "cinert", "cvel", "qfrc_actuator", "xpos", "xipos")
#: The fields that are parts of the state vector too (read from it instead of being copied out of the MjData).
_STATE_FIELDS = ("qpos", "qvel")

#: The state that fully determines the next step (time, qpos, qvel, act, solver warm-start, ctrl, applied forces,
#: mocap, userdata, plugin state): swapping it through one MjData reproduces per-env MjData bit for bit (tested).
_STATE_SPEC = int(mujoco.mjtState.mjSTATE_INTEGRATION)

#: How often an idle worker wakes up to check that its env still exists (it is normally woken by ``send``).
_IDLE_WAKE_S = 1.0


def _state_slices(model: mujoco.MjModel) -> dict[str, slice]:
    """Where each ``mjtState`` element lies in an ``mjSTATE_INTEGRATION`` vector (elements in bit order)."""
    out, start = {}, 0
    for e in mujoco.mjtState.__members__.values():
        v = int(e)
        if v & (v - 1) or not v & _STATE_SPEC:  # composite specs (FULLPHYSICS, ...) and parts not in the spec
            continue
        size = mujoco.mj_stateSize(model, v)
        out[e.name.removeprefix("mjSTATE_").lower()] = slice(start, start + size)
        start += size
    return out


class _StateSnapshots:
    """``MujocoEnv.datas``: ``[i]`` loads env i's state into one spare MjData and runs ``mj_forward``."""

    def __init__(self, env: MujocoEnv) -> None:
        self._env = env

    def __len__(self) -> int:
        return self._env.num_envs

    def __getitem__(self, env_idx: int) -> mujoco.MjData:
        env = self._env
        if not -env.num_envs <= env_idx < env.num_envs:
            raise IndexError(f"env index {env_idx} out of range for {env.num_envs} envs")
        if env._snapshot is None:
            env._snapshot = mujoco.MjData(env.model)
        m = env._models[env_idx]
        mujoco.mj_setState(m, env._snapshot, env._state[env_idx], _STATE_SPEC)
        mujoco.mj_forward(m, env._snapshot)
        return env._snapshot


class _Shared:
    """What the worker threads and the env share: the per-step work list, the env states, the batch arrays the
    workers gather physics into, and the per-env reset cache. Holds no reference to the env, so an env dropped
    without ``close()`` is still garbage collected (and ``__del__`` stops the threads)."""

    def __init__(self, env: MujocoEnv) -> None:
        self.num_envs = env.num_envs
        self.models = env._models  # the shared MjModel, or each env's own (model_params)
        self.state = env._state  # [N, nstate] mjSTATE_INTEGRATION rows, ctrl written by send() before the wake-up
        self.bufs = env._bufs  # {field: [N, ...]} gathered after each step
        self.warn = env._warn  # [N, num_warnings] MuJoCo's warning counters of each env's last step
        self.frame_skip = env.frame_skip
        self.need_rne = env._need_rne
        self.compiled = env.opts["kernel"] == "compiled"
        # The compiled kernel's env runs: ``claim`` hands out run numbers, run k is envs [k * run, (k + 1) * run).
        self.run = max(1, -(-env.num_envs // (_RUNS_PER_THREAD * env.num_threads)))
        self.env_idx = np.arange(env.num_envs, dtype=np.int64)
        self.model_addrs = np.array([m._address for m in env._models], dtype=np.int64)  # kept alive by ``models``
        # INVARIANT: after every physics phase, env i's next reset is prepared: reset_state[i] and reset_bufs[f][i]
        # hold the state (and gathered fields) that reset draw number k+1 of env i's generator gives, where k draws
        # were consumed by the resets it has done. recv() copies them in for the envs that are done and marks them
        # stale; whichever worker steps env i next prepares its following reset right after stepping it.
        self.reset_state = np.zeros_like(env._state)
        self.gathered = env._gathered  # the fields copied out of the MjData (qpos and qvel are state views)
        self.reset_bufs = {
            f: self.reset_state[:, env._state_slices[f]] if f in _STATE_FIELDS else np.zeros_like(b)
            for f, b in env._bufs.items()
        }
        self.stale = np.ones(env.num_envs, dtype=bool)
        self.rngs: list[np.random.Generator] = []  # per env, set by MujocoEnv._seed_rngs
        self.noise_scale = float(env.opts["reset_noise_scale"])
        self.uniform_qvel = env.task.reset_noise == "uniform"
        self.init_qpos, self.init_qvel = env.model.qpos0.copy(), np.zeros(env.model.nv)
        self.task, self.opts, self.consts = env.task, env.opts, env.consts
        self.reset_obs = np.zeros((env.num_envs, *env.observation_spec.shape), dtype=np.float32)
        self.reset_position = np.zeros((env.num_envs, env._position_size))
        self.claim: Any = iter(())  # this step's env indices; each thread takes the next one (see _Worker)


class _Worker:
    """One stepping thread's ``MjData`` and its prebuilt views into it."""

    def __init__(self, shared: _Shared, name: str) -> None:
        self.shared = shared
        self.name = name
        self.data = d = mujoco.MjData(shared.models[0])  # every env this thread steps goes through this one
        fields = shared.gathered
        self.copies = [(shared.bufs[f], getattr(d, f)) for f in fields]  # (batch array, view into self.data)
        self.reset_copies = [(shared.reset_bufs[f], getattr(d, f)) for f in fields]
        self.qpos, self.qvel = d.qpos, d.qvel
        self.warn_view = d.warning.number
        self.num_stepped = 0  # envs stepped by this thread in the last step (for tests and load statistics)
        self.start = threading.Event()
        self.done = threading.Event()
        self.stop = False
        self.error: str | None = None
        if shared.compiled:
            from .mujoco_kernel import field_table, step_kernel  # numba: imported only when it is used

            self.kernel = step_kernel()
            # (the batch arrays and this MjData are never reallocated, so their addresses hold for the env's life)
            self.fields = field_table([b for b, _ in self.copies], [v for _, v in self.copies])
            self.warn_addr = int(self.warn_view.ctypes.data)

    def step_slice(self) -> None:
        if self.shared.compiled:
            self.step_runs()
        else:
            self.step_each()

    def step_runs(self) -> None:
        """``step_each`` with the compiled kernel: claims runs of envs instead of single envs and steps each run in
        one call that holds no GIL (envs.mujoco_kernel); same C calls in the same order, so the same bits."""
        sh = self.shared
        run, n, idx, stale, kernel = sh.run, sh.num_envs, sh.env_idx, sh.stale, self.kernel
        args = (sh.frame_skip, sh.need_rne, _STATE_SPEC, *self.fields, self.warn_addr, sh.warn)
        models, data, state = sh.model_addrs, self.data._address, sh.state
        num_stepped = 0
        for k in sh.claim:
            lo = k * run
            if lo >= n:
                break
            envs = idx[lo : lo + run]
            kernel(envs, models, data, state, *args)
            for i in envs[stale[envs]]:  # rare (an env that was reset last step): Python, as in step_each
                self.prepare_reset(int(i))
            num_stepped += len(envs)
        self.num_stepped = num_stepped

    def step_each(self) -> None:
        """Step envs until this step's work list is empty; each thread takes the next unclaimed env, so a thread
        that started late or was descheduled simply steps fewer envs (all threads finish within one env step)."""
        # PERF: beside ~200 µs of C physics per Ant env step, the per-env Python here (claim, state in/out, row
        # copies) costs ~3.5 µs. The envs are claimed one at a time from a shared iterator (``next`` on an
        # ``itertools.count`` is atomic under the GIL); against fixed slices this removed the ~1.5% of wall time
        # lost to one thread finishing its slice before the other, and it keeps both cores busy when a thread
        # wakes up late or another process takes a core for a while.
        sh = self.shared
        d, nstep, rne, spec, n = self.data, sh.frame_skip, sh.need_rne, _STATE_SPEC, sh.num_envs
        models, state, warn_buf, stale = sh.models, sh.state, sh.warn, sh.stale
        copies, warn_view = self.copies, self.warn_view
        num_stepped = 0
        for i in sh.claim:
            if i >= n:
                break
            m, row = models[i], state[i]
            mujoco.mj_setState(m, d, row, spec)
            mujoco.mj_step(m, d, nstep)
            if rne:  # cfrc_ext is only computed by this pass (gymnasium calls it after every step too)
                mujoco.mj_rnePostConstraint(m, d)
            mujoco.mj_getState(m, d, row, spec)
            for buf, view in copies:
                buf[i] = view
            warn_buf[i] = warn_view
            warn_view.fill(0)  # the counters belong to this env's step only (fill is cheaper than testing first)
            if stale[i]:
                self.prepare_reset(i)
            num_stepped += 1
        self.num_stepped = num_stepped

    def prepare_reset(self, i: int) -> None:
        """Draw env i's next reset noise and compute its reset state (gymnasium's reset: ``mj_resetData``, set
        qpos/qvel, ``mj_forward``) into the reset cache. Runs on the threads during the physics phase, so an
        auto-reset costs recv() only a row copy (an ``mj_forward`` and two draws were ~80 µs on its thread)."""
        sh, d = self.shared, self.data
        m, rng, scale = sh.models[i], sh.rngs[i], sh.noise_scale
        qpos = sh.init_qpos + rng.uniform(-scale, scale, m.nq)
        if sh.uniform_qvel:
            qvel = sh.init_qvel + rng.uniform(-scale, scale, m.nv)
        else:
            qvel = sh.init_qvel + scale * rng.standard_normal(m.nv)
        _reset_into(m, d, qpos, qvel, self.qpos, self.qvel)
        mujoco.mj_getState(m, d, sh.reset_state[i], _STATE_SPEC)
        for buf, view in self.reset_copies:
            buf[i] = view
        self.warn_view.fill(0)
        # The first observation and position too (~15 µs of numpy for one row, off the critical path here).
        phys = Physics(**{f: buf[i : i + 1] for f, buf in sh.reset_bufs.items()})
        sh.reset_obs[i] = sh.task.observation(np, phys, sh.opts, sh.consts)[0]  # float32, as astype would round
        sh.reset_position[i] = sh.task.position(np, phys, sh.opts, sh.consts)[0]
        sh.stale[i] = False


def _reset_into(m: mujoco.MjModel, d: mujoco.MjData, qpos: np.ndarray, qvel: np.ndarray, qpos_view, qvel_view) -> None:
    """gymnasium's ``MujocoEnv.reset`` + ``set_state``: ``mj_resetData``, write qpos/qvel, ``mj_forward``."""
    mujoco.mj_resetData(m, d)
    qpos_view[:] = qpos
    qvel_view[:] = qvel
    mujoco.mj_forward(m, d)


def _unpack(packed: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The 10 step outputs from the 4 packed tensors (see ``MujocoEnv._new_outputs``): final_obs, obs, reward,
    x_position, x_velocity, episode_return, terminated, truncated, physics_reset, episode_length."""
    obs2, f32, flags, episode_length = packed
    return (*obs2.unbind(0), *f32.unbind(0), *flags.unbind(0), episode_length)


def _worker_loop(w: _Worker, nice: int = 0, cpu: int | None = None) -> None:
    if nice:  # Linux: a thread's own nice value (PRIO_PROCESS with its thread id); raising it needs no privilege
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)
    if cpu is not None:  # Linux: sched_setaffinity(0) pins the calling thread only, not its process
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as e:  # reported by the first recv() (a cgroup may forbid it): set pin_workers=false
            w.error = f"pin_workers: could not pin {w.name} to CPU {cpu} ({e}); set pin_workers=false"
    while True:
        # Woken by send() or close(); the timeout only bounds the wait, as every wait in the project is.
        if not w.start.wait(timeout=_IDLE_WAKE_S):
            if w.stop:
                return
            continue
        w.start.clear()
        if w.stop:
            w.done.set()
            return
        try:
            w.step_slice()
        except BaseException:  # reported by recv() in the caller's thread
            w.error = traceback.format_exc()
        w.done.set()


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's and this backend's options resolved and checked, without building a model; raises ``EnvError``.

    ``MujocoEnv`` calls it first, and so does the trainer's config check (``sample_fast.envs.check_options``), so a
    config is rejected for exactly what this backend would reject. (``model_params`` needs the model: checked later.)
    """
    if name not in TASKS:
        raise EnvError(f"unknown task {name!r} for backend 'mujoco'; known tasks: {', '.join(sorted(TASKS))}")
    opts = resolve_options(TASKS[name], options, BACKEND_OPTIONS)
    num_threads = opts["num_threads"]
    positive_int = isinstance(num_threads, int) and not isinstance(num_threads, bool) and num_threads >= 1
    if num_threads is not None and not positive_int:
        raise EnvError(f"num_threads must be a positive int (or None for os.cpu_count()), got {num_threads!r}")
    timeout = opts["step_timeout_s"]
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
        raise EnvError(f"step_timeout_s must be a positive number of seconds, got {timeout!r}")
    if not isinstance(opts["caller_steps"], bool):
        raise EnvError(f"caller_steps must be true or false, got {opts['caller_steps']!r}")
    nice = opts["worker_nice"]
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise EnvError(f"worker_nice must be an int from 0 to 19, got {nice!r}")
    if opts["kernel"] not in ("compiled", "python"):
        raise EnvError(f"kernel must be 'compiled' or 'python', got {opts['kernel']!r}")
    if not isinstance(opts["pin_workers"], bool):
        raise EnvError(f"pin_workers must be true or false, got {opts['pin_workers']!r}")
    if opts["pin_workers"] and not hasattr(os, "sched_setaffinity"):
        raise EnvError("pin_workers=true needs os.sched_setaffinity (Linux); leave it false on this platform")
    return opts


class MujocoEnv(BatchedEnv):
    """``num_envs`` copies of a MuJoCo task stepped by ``num_threads`` worker threads.

    Args:
        name: a task in ``envs.tasks.TASKS``.
        num_envs: number of envs (>= 1).
        device: where returned tensors live (physics always runs on the CPU; CUDA gets one copy per step).
        seed: seeds the per-env reset generators (``numpy.random.SeedSequence(seed).spawn(num_envs)``).
        task_options: the task's options (``envs.tasks``), plus ``num_threads`` (default ``os.cpu_count()``) and
            ``step_timeout_s`` (default 60). Unknown names raise ``EnvError``.

    Returned tensors are fresh every step: the caller may keep them. ``set_state`` puts one env in a given state
    (tests and debugging); ``state_view(name)`` exposes a part (``qpos``, ``qvel``, ``ctrl``, ...) of every env's
    state as a writable ``[num_envs, k]`` array.
    """

    backend = "mujoco"

    def __init__(
        self, name: str, num_envs: int, device: str | torch.device = "cpu", seed: int = 0, **task_options: Any
    ) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
        self._threads: list[threading.Thread] = []
        self._workers: list[_Worker] = []
        self.opts = opts = check_options(name, task_options)
        self.task = TASKS[name]
        num_threads = opts["num_threads"] if opts["num_threads"] is not None else (os.cpu_count() or 1)
        frame_skip, max_steps = opts["frame_skip"], opts["max_episode_steps"]

        self.name, self.num_envs, self.device = name, num_envs, torch.device(device)
        self.num_threads = min(num_threads, num_envs)
        self.step_timeout_s = float(opts["step_timeout_s"])
        self.frame_skip, self.max_episode_steps = frame_skip, max_steps
        self.model = model = build_model(self.task, opts)
        self.consts = model_consts(model)
        self.dt = float(model.opt.timestep) * frame_skip
        from .custom import check_model_params, per_env_models

        params = check_model_params(model, opts["model_params"], num_envs)
        # One MjModel per env only when randomized (all have the same sizes, so any MjData steps any of them).
        self._models = per_env_models(model, params, num_envs) if params else [model] * num_envs
        self._data = mujoco.MjData(model)  # resets and set_state happen through this one (caller's thread)
        self._state = np.zeros((num_envs, mujoco.mj_stateSize(model, _STATE_SPEC)))
        self._state_slices = _state_slices(model)

        obs_size = int(self.task.obs_size(self.consts, opts))
        self.observation_spec = Spec(shape=(obs_size,), dtype=torch.float32)
        lo, hi = model.actuator_ctrlrange[:, 0].copy(), model.actuator_ctrlrange[:, 1].copy()
        limited = model.actuator_ctrllimited.astype(bool)  # unlimited actuators accept any value
        lo[~limited], hi[~limited] = -np.inf, np.inf
        self._ctrl_lo, self._ctrl_hi = lo, hi
        self._action_shape = torch.Size((num_envs, model.nu))
        self._obs_size = obs_size
        self.action_spec = Spec(
            shape=(model.nu,),
            dtype=torch.float32,
            low=torch.as_tensor(lo, dtype=torch.float32),
            high=torch.as_tensor(hi, dtype=torch.float32),
        )

        # Batch arrays the workers fill (each its own rows) and recv() reads.
        self._fields = tuple(f for f in _FIELDS if f in self.task.fields)
        # qpos and qvel are read straight from the state rows (mj_getState stores them there anyway); the other
        # fields are copied out of the MjData after each step (PERF: two row copies fewer per env step).
        self._gathered = tuple(f for f in self._fields if f not in _STATE_FIELDS)
        self._bufs = {
            f: self._state[:, self._state_slices[f]]
            if f in _STATE_FIELDS
            else np.zeros((num_envs, *getattr(self._data, f).shape))
            for f in self._fields
        }
        self._warn = np.zeros((num_envs, len(self._data.warning)), dtype=np.int32)
        self._ctrl = self._state[:, self._state_slices["ctrl"]]  # this step's clipped actions, as the envs got them
        self._need_rne = "cfrc_ext" in self._fields
        self._phys = self._physics()  # views of the whole batch arrays (they are never reallocated)
        self._position_size = int(np.shape(self.task.position(np, self._phys, opts, self.consts))[-1])
        self._position = np.zeros((num_envs, self._position_size))  # position() of each env after its last step
        self._elapsed = np.zeros(num_envs, dtype=np.int64)
        # Episode statistics in numpy (EpisodeTracker's semantics): ~10 small torch ops per step cost ~75 µs on
        # the critical path right after the physics, the numpy equivalents a fraction of that.
        self._returns = np.zeros(num_envs, dtype=np.float32)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._last_obs = np.zeros((num_envs, obs_size), dtype=np.float32)  # what the last step/reset returned as obs
        self._needs_reset = True

        self._shared = _Shared(self)
        self._seed_rngs(seed)
        cores = sorted(os.sched_getaffinity(0)) if opts["pin_workers"] else []
        for k in range(self.num_threads):
            w = _Worker(self._shared, f"mujoco-env-{k}")
            cpu = cores[k % len(cores)] if cores else None
            t = threading.Thread(target=_worker_loop, args=(w, opts["worker_nice"], cpu), name=w.name, daemon=True)
            t.start()
            self._workers.append(w)
            self._threads.append(t)
        # The thread that calls recv() (no thread of its own: an MjData and the same claim loop), see _recv.
        self._caller = _Worker(self._shared, "mujoco-env-caller") if opts["caller_steps"] else None

    # ----- reset ------------------------------------------------------------------------------------------
    def _seed_rngs(self, seed: int) -> None:
        sh = self._shared
        sh.rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(self.num_envs)]
        sh.stale[:] = True  # prepared resets drew from the old generators

    def _set_data(self, i: int, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Put env i in state ``qpos``/``qvel`` like gymnasium's ``reset`` + ``set_state`` (``mj_resetData``, set,
        ``mj_forward``) and gather its fields."""
        m, d = self._models[i], self._data
        _reset_into(m, d, qpos, qvel, d.qpos, d.qvel)
        mujoco.mj_getState(m, d, self._state[i], _STATE_SPEC)
        for f in self._gathered:
            self._bufs[f][i] = getattr(d, f)
        self._warn[i] = 0

    def _apply_resets(self, rows: Any) -> None:
        """Auto-reset envs ``rows`` (indices or a slice) from their prepared resets and mark those stale."""
        sh = self._shared
        self._state[rows] = sh.reset_state[rows]
        for f in self._gathered:
            self._bufs[f][rows] = sh.reset_bufs[f][rows]
        self._warn[rows] = 0
        sh.stale[rows] = True

    def _physics(self, rows: Any = slice(None)) -> Physics:
        return Physics(**{f: buf[rows] for f, buf in self._bufs.items()})

    def _observe(self, phys: Physics) -> np.ndarray:
        return self.task.observation(np, phys, self.opts, self.consts).astype(np.float32)

    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if self._broken:
            raise EnvError(self._broken)
        if self._in_flight:  # a step sent but never received may still be running on the MjData we reset
            self._wait_workers()
        if seed is not None:
            self._seed_rngs(seed)
        sh, helper = self._shared, self._workers[-1]  # its thread is idle: prepare missing resets through its MjData
        for i in np.flatnonzero(sh.stale):
            helper.prepare_reset(int(i))
        self._apply_resets(slice(None))  # the next step's workers prepare each env's following reset
        self._position = sh.reset_position.copy()
        self._elapsed[:] = 0
        self._returns[:] = 0
        self._lengths[:] = 0
        self._needs_reset = False
        self._last_obs[...] = sh.reset_obs
        return self._to_device(sh.reset_obs.copy()), {}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset the chosen envs from their prepared resets (each env's own generator, so the others' states and
        random streams are untouched) and restart their time limits and episode statistics."""
        if self._broken:
            raise EnvError(self._broken)
        if self._in_flight:
            self._wait_workers()
        idx = np.flatnonzero(env_mask.cpu().numpy())  # SYNC: the mask to the host (a partial reset is rare)
        sh, helper = self._shared, self._workers[-1]
        for i in idx[sh.stale[idx]]:
            helper.prepare_reset(int(i))
        if idx.size:
            self._apply_resets(idx)
            self._position[idx] = sh.reset_position[idx]
            self._last_obs[idx] = sh.reset_obs[idx]
            self._elapsed[idx] = 0
            self._returns[idx] = 0.0
            self._lengths[idx] = 0
        return self._to_device(self._last_obs.copy()), {}

    def set_state(self, env_idx: int, qpos: np.ndarray, qvel: np.ndarray) -> torch.Tensor:
        """Put env ``env_idx`` in state (``qpos`` [nq], ``qvel`` [nv]) exactly as gymnasium's ``reset`` followed by
        ``set_state`` does (``mj_resetData``, set, ``mj_forward``); returns its observation ``[obs_size]``.
        The episode's step count and return are kept. For tests and debugging."""
        self._check_open()
        if self._needs_reset:
            raise EnvError("call reset() before set_state()")
        if self._pending is not None:
            raise EnvError("set_state() called between send() and recv(); call recv() first")
        qpos, qvel = np.asarray(qpos, dtype=np.float64), np.asarray(qvel, dtype=np.float64)
        if qpos.shape != (self.model.nq,) or qvel.shape != (self.model.nv,):
            raise EnvError(
                f"set_state needs qpos [{self.model.nq}] and qvel [{self.model.nv}]; got {qpos.shape}, {qvel.shape}"
            )
        self._set_data(env_idx, qpos, qvel)
        phys = self._physics(slice(env_idx, env_idx + 1))
        self._position[env_idx] = self.task.position(np, phys, self.opts, self.consts)[0]
        return torch.from_numpy(self._observe(phys)[0])

    def state_view(self, name: str) -> np.ndarray:
        """Writable ``[num_envs, k]`` view of one part of every env's physics state: ``qpos``, ``qvel``, ``act``,
        ``warmstart``, ``ctrl``, ``qfrc_applied``, ``xfrc_applied``, ... (MuJoCo's ``mjtState`` names). Writes take
        effect at the next step. For tests and debugging."""
        if name not in self._state_slices:
            raise EnvError(f"unknown state part {name!r}; choose one of {', '.join(self._state_slices)}")
        return self._state[:, self._state_slices[name]]

    @property
    def datas(self) -> _StateSnapshots:
        """``env.datas[i]``: an ``MjData`` holding env i's current state with ``mj_forward`` applied, for rendering
        (``mujoco.Renderer.update_scene``) and inspection. A snapshot: writes to it do not reach the env (use
        ``state_view`` or ``set_state``), and the next ``datas[j]`` reuses the same ``MjData``."""
        return _StateSnapshots(self)

    # ----- step -------------------------------------------------------------------------------------------
    def step(self, actions: torch.Tensor) -> StepResult:
        """``send`` + ``recv``, with the caller's thread stepping the last slice itself instead of idling.

        Same result as ``send``/``recv`` (tested); one thread wake-up fewer on the critical path per step, which
        counts most when other processes load the cores (a learner beside the sampler).
        """
        self._inline = True
        try:
            return super().step(actions)
        finally:
            self._inline = False

    _inline = False

    def validate_actions(self, actions: torch.Tensor) -> None:
        """``BatchedEnv.validate_actions`` with a fast path for valid CPU actions: same checks, same errors."""
        # PERF: on the critical path before the wake-up. The base check (torch isfinite, all, a host read) measured
        # ~84 µs per step at 64 Ant envs in situ (cold caches), this one ~28 µs. A float64 sum of float32 values cannot
        # overflow, so it is finite exactly when every action is. Anything unusual goes to the base check, which
        # raises the documented error (or accepts).
        if (
            type(actions) is torch.Tensor
            and actions.dtype == torch.float32
            and actions.device.type == "cpu" == self.device.type
            and not actions.requires_grad
            and actions.shape == self._action_shape
            and np.isfinite(actions.numpy().sum(dtype=np.float64))
        ):
            return
        super().validate_actions(actions)

    def _send(self, actions: torch.Tensor) -> None:
        if self._needs_reset:
            self._pending = None
            raise EnvError("call reset() before the first step")
        if self._broken:
            self._pending = None
            raise EnvError(self._broken)
        # Out-of-range actions are clipped here (MuJoCo would clamp ctrl anyway), so the control cost sees what
        # the actuators received.
        # PERF: clipped in numpy straight into the ctrl part of the state rows (float32 -> float64 is exact, so
        # this equals converting first): the part of send() before the wake-up went from ~49 to ~26 µs in situ.
        a = actions if self.device.type == "cpu" and not actions.requires_grad else actions.detach().cpu()
        np.clip(a.numpy(), self._ctrl_lo, self._ctrl_hi, out=self._ctrl)
        self._shared.claim = itertools.count()  # this step's work list (read by the threads after the wake-up)
        inline = self._workers[-1] if self._inline else None
        for w in self._workers:
            w.done.clear()
            if w is not inline:
                w.start.set()
        self._in_flight = True
        # PERF: whatever does not depend on this step's physics is done here, while the workers already step (with
        # the envs claimed dynamically, the caller's thread just steps fewer of them), instead of on the serial
        # tail in recv(): the fresh output arrays, the torch tensors viewing them (the first torch call after the
        # physics cost ~30 µs) and the time limit.
        self._outputs = self._new_outputs()
        self._elapsed += 1
        if inline is not None:
            try:
                inline.step_slice()
            except Exception:  # reported by recv(), as a worker thread's error is
                inline.error = traceback.format_exc()
            finally:
                inline.done.set()

    def _new_outputs(self) -> tuple[tuple[np.ndarray, ...], tuple[torch.Tensor, ...] | None]:
        """Fresh output arrays for one step (the caller may keep what we return), packed so that 4 tensors are made
        instead of 10: [final_obs, obs], [reward, x_position, x_velocity, episode_return], [terminated, truncated,
        physics_reset], episode_length. On the CPU the 10 returned tensors view them already (made here, while the
        workers step: the three ``unbind`` calls cost ~30 µs on recv()'s serial tail); elsewhere recv() copies."""
        n = self.num_envs
        arrays = (
            np.empty((2, n, self._obs_size), dtype=np.float32),
            np.zeros((4, n), dtype=np.float32),
            np.empty((3, n), dtype=bool),
            np.zeros(n, dtype=np.int64),
        )
        if self.device.type != "cpu":
            return arrays, None
        return arrays, _unpack(tuple(torch.from_numpy(a) for a in arrays))

    def _wait_workers(self) -> None:
        deadline = time.monotonic() + self.step_timeout_s
        for k, w in enumerate(self._workers):
            # SYNC: waits for the physics of this worker's slice.
            if not w.done.wait(timeout=max(0.0, deadline - time.monotonic())):
                self._broken = (
                    f"mujoco step did not finish within step_timeout_s={self.step_timeout_s} s (worker {k} of "
                    f"{self.num_threads}); a very stiff model or an overloaded machine? Raise step_timeout_s, or "
                    "make a new env"
                )
                raise EnvError(self._broken)
        workers = self._workers if self._caller is None else [*self._workers, self._caller]
        errors = [w.error for w in workers if w.error]
        if errors:
            self._broken = f"a mujoco worker thread failed; make a new env. Worker traceback:\n{errors[0]}"
            raise EnvError(self._broken)
        self._in_flight = False

    _snapshot: mujoco.MjData | None = None  # the MjData behind ``datas[i]``, made on first use
    _in_flight = False  # a step was sent to the workers and not yet waited for
    _outputs: Any = None  # the output arrays (and tensors) send() prepared for recv()
    _broken: str | None = None  # why this env can no longer step (a timeout or a worker error)

    def _recv(self, actions: torch.Tensor) -> StepResult:
        if self._caller is not None and self._in_flight:
            # PERF: between send() and recv() the caller did other work (the sampler: the other env group's step
            # and policy forward); the envs the workers have not claimed yet it steps itself through its own MjData
            # instead of blocking (results do not depend on which thread steps an env). On 2 cores this measured
            # 1.01x in the FPS suite, within the noise (benchmarks/results/levers_caller_steps_cpu.md), so it is off
            # by default.
            try:
                self._caller.step_slice()
            except Exception:  # reported by _wait_workers, as a worker thread's error is
                self._caller.error = traceback.format_exc()
        self._wait_workers()
        task, opts, consts, sh = self.task, self.opts, self.consts, self._shared
        phys = self._phys
        (obs2, f32, flags, episode_length), tensors = self._outputs
        self._outputs = None  # each step's arrays are fresh
        final_obs, obs = obs2
        reward, x_position, x_velocity, episode_return = f32
        terminated, truncated, bad = flags
        # PERF: this runs on the caller's thread while the other cores idle, right after the physics (cold caches:
        # each numpy call costs ~3x its warm timeit figure). So it is vectorised over the batch with as few calls as
        # possible, writes into the arrays send() prepared, and the resets were prepared by the workers.
        with np.errstate(invalid="ignore", over="ignore"):  # rows of blown-up envs are replaced below
            position = np.array(task.position(np, phys, opts, consts), dtype=np.float64)  # a copy: may view _bufs
            velocity = position - self._position
            velocity /= self.dt
            reward64, healthy = task.reward(np, phys, opts, consts, self._ctrl, velocity)
            final_obs[...] = task.observation(np, phys, opts, consts)  # rounded to float32 as astype() would
            reward[...] = reward64
            # A blown-up env: MuJoCo's bad-state warnings (it has already reset that MjData), or anything non-finite
            # in what we return (the reward covers the positions the observation excludes). A float64 sum of float32
            # values cannot overflow, so it is non-finite exactly when one of them is.
            np.any(self._warn[:, _BAD_WARNINGS], axis=1, out=bad)
            bad |= ~np.isfinite(final_obs.sum(axis=1, dtype=np.float64) + reward)
        np.logical_or(is_terminated(np, healthy, opts), bad, out=terminated)
        if bad.any():
            final_obs[bad] = 0.0
            reward[bad] = 0.0
            velocity[bad] = 0.0
        if self.max_episode_steps is not None:  # (send() counted this step)
            np.greater_equal(self._elapsed, self.max_episode_steps, out=truncated)
        else:
            truncated[...] = False
        done = terminated | truncated
        done_idx = np.flatnonzero(done)
        obs[...] = final_obs
        x_position[...] = position[:, 0]
        x_velocity[...] = velocity[:, 0]
        self._returns += reward
        self._lengths += 1
        np.copyto(episode_return, self._returns, where=done)
        np.copyto(episode_length, self._lengths, where=done)
        if done_idx.size:
            self._apply_resets(done_idx)
            obs[done_idx] = sh.reset_obs[done_idx]
            position[done_idx] = sh.reset_position[done_idx]
            self._elapsed[done_idx] = 0
            self._returns[done_idx] = 0.0
            self._lengths[done_idx] = 0
        self._position = position
        np.copyto(self._last_obs, obs)  # for reset(env_mask=...): the rows of the envs that are not reset
        if tensors is None:  # another device: one copy per packed array
            tensors = _unpack(tuple(torch.from_numpy(a).to(self.device) for a in (obs2, f32, flags, episode_length)))
        (final_obs_t, obs_t, reward_t, x_position_t, x_velocity_t, episode_return_t, terminated_t, truncated_t, bad_t,
         episode_length_t) = tensors  # fmt: skip
        info: dict[str, Any] = {
            "final_obs": final_obs_t,
            "physics_reset": bad_t,
            "x_position": x_position_t,
            "x_velocity": x_velocity_t,
            "episode_return": episode_return_t,
            "episode_length": episode_length_t,
        }
        return StepResult(obs_t, reward_t, terminated_t, truncated_t, info)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t if self.device.type == "cpu" else t.to(self.device)

    # ----- close ------------------------------------------------------------------------------------------
    def _close(self) -> None:
        for w in self._workers:
            w.stop = True
            w.start.set()
        for t in self._threads:
            t.join(timeout=max(self.step_timeout_s, 5.0))  # a worker mid-step finishes its slice first
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads, self._workers = [], []
        if alive:
            raise EnvError(f"mujoco worker threads {alive} did not stop within {self.step_timeout_s} s")
