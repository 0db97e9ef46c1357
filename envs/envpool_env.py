"""``envpool`` backend: our MuJoCo tasks (ant, halfcheetah, hopper, walker2d, humanoid) on EnvPool's C++ thread pool.

It owns one ``envpool`` pool (``TaskDef.envpool_id``, gymnasium API) and converts its results to our convention:
EnvPool resets an env on the step *after* ``done`` and discards that step's action; here, right after a step in
which some envs ended, those envs are reset with ``pool.reset(env_ids)`` in the same call, so ``obs`` is already the
new episode's first observation, ``info["final_obs"]`` the true last one, and every action is simulated.
``send`` hands the actions to EnvPool's threads and returns; ``recv`` waits for them (EnvPool sync mode).
"""

from __future__ import annotations

import math
import os
from typing import Any

import envpool
import numpy as np
import torch

from .base import BatchedEnv, EnvError, EpisodeTracker, OptionError, Spec, StepResult
from .sim_options import ENVPOOL_OPTIONS
from .tasks import COMMON_OPTIONS, TASKS, TaskDef, resolve_options

#: Backend settings accepted besides the task options (envs/sim_options.py: plain data, importable without envpool).
BACKEND_OPTIONS = ENVPOOL_OPTIONS

#: Task options whose envpool kwarg has the same name.
_SAME_NAME = (
    "max_episode_steps",
    "frame_skip",
    "forward_reward_weight",
    "ctrl_cost_weight",
    "contact_cost_weight",
    "healthy_reward",
    "terminate_when_unhealthy",
    "reset_noise_scale",
    "exclude_current_positions_from_observation",
)


def envpool_kwargs(task: TaskDef, opts: dict[str, Any], config_keys: set[str]) -> dict[str, Any]:
    """Translate resolved task options to ``envpool.make`` kwargs.

    ``(lo, hi)`` range options become ``*_min``/``*_max``; an option EnvPool has no kwarg for is accepted only at
    its default value, anything else raises ``OptionError`` naming the option.
    """
    defaults = {**COMMON_OPTIONS, **task.options}
    out: dict[str, Any] = {}

    def unsupported(key: str, why: str) -> OptionError:
        default = task.frame_skip if key == "frame_skip" else defaults[key]
        return OptionError(
            key,
            opts[key],
            f"is not supported by the envpool backend for {task.name!r} ({why})",
            backends=("mujoco",),
            hint=f"leave {key} at its default {default!r}",
        )

    for key in defaults:
        value = opts[key]
        if key in _SAME_NAME and key in config_keys:
            out[key] = value
        elif key.endswith("_range") and isinstance(value, (tuple, list)) and len(value) == 2:
            base = key[: -len("_range")]
            for side, bound, infinite in (("min", value[0], -math.inf), ("max", value[1], math.inf)):
                if f"{base}_{side}" in config_keys:
                    out[f"{base}_{side}"] = bound
                elif bound != infinite:
                    raise unsupported(key, f"EnvPool has no {base}_{side}")
        elif key == "include_cfrc_ext_in_observation" and task.name == "ant" and "use_contact_force" in config_keys:
            # EnvPool's use_contact_force=False drops both the contact forces from the observation and the contact
            # cost; gymnasium's include_cfrc_ext_in_observation=False drops only the former.
            if not value and opts["contact_cost_weight"] != 0.0:
                raise unsupported(key, "unless contact_cost_weight=0: EnvPool drops the contact cost with the forces")
            out["use_contact_force"] = bool(value)
        elif value != defaults[key] and not (key == "frame_skip" and value == task.frame_skip):
            raise unsupported(key, f"EnvPool's {task.envpool_id} has no setting for it")
    return out


def check_options(name: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's and this backend's options resolved and checked, and the ``envpool.make`` kwargs they map to
    (``(options, kwargs)``), without building a pool; raises ``EnvError``.

    ``EnvPoolEnv`` calls it first, and so does the trainer's config check (``sample_fast.envs.check_options``), so a
    config is rejected for exactly what this backend would reject.
    """
    if name not in TASKS or not TASKS[name].envpool_id:
        envpool_tasks = ", ".join(sorted(n for n, t in TASKS.items() if t.envpool_id))
        raise EnvError(f"envpool backend runs the tasks {envpool_tasks}; got {name!r} (use backend='mujoco' for it)")
    task = TASKS[name]
    opts = resolve_options(task, options, BACKEND_OPTIONS)
    num_threads = opts["num_threads"]
    positive_int = isinstance(num_threads, int) and not isinstance(num_threads, bool) and num_threads >= 1
    if num_threads is not None and not positive_int:
        raise EnvError(f"num_threads must be a positive int or None, got {num_threads!r}")
    offset = opts["thread_affinity_offset"]
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise EnvError(f"thread_affinity_offset must be an int (-1: no pinning), got {offset!r}")
    if opts["max_episode_steps"] is None:
        raise OptionError("max_episode_steps", None, "is not supported by the envpool backend (EnvPool needs a time "
                          "limit)", backends=("mujoco",), hint="set a positive int")  # fmt: skip
    config_keys = set(envpool.make_spec(task.envpool_id).config._fields)
    return opts, envpool_kwargs(task, opts, config_keys)


class EnvPoolEnv(BatchedEnv):
    """``num_envs`` copies of a task on an EnvPool pool (``make("ant", 64, backend="envpool")``).

    Args:
        name: a task in ``TASKS``.
        num_envs: number of envs (EnvPool's ``num_envs`` and ``batch_size``).
        device: where returned tensors live (simulation runs on EnvPool's CPU threads).
        seed: EnvPool seeds env i with ``seed + i``.
        options: task options (mapped to EnvPool's kwargs, see ``envpool_kwargs``), ``num_threads``,
            ``thread_affinity_offset``.
    """

    backend = "envpool"

    def __init__(self, name: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0, **options: Any):
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
        self.options, self._kwargs = check_options(name, options)
        self.task = TASKS[name]
        self.name = name
        self.num_envs = num_envs
        self.device = torch.device(device)
        num_threads = self.options["num_threads"]
        self.num_threads = min(num_envs, os.cpu_count() or 1) if num_threads is None else num_threads
        self._pool: Any = None
        self._pool_seed: int | None = None
        self._build_pool(seed)

        space = self._pool.action_space
        self.action_spec = Spec(
            shape=tuple(space.shape),
            dtype=torch.float32,
            low=torch.as_tensor(space.low, dtype=torch.float32),
            high=torch.as_tensor(space.high, dtype=torch.float32),
        )
        self.observation_spec = Spec(shape=tuple(self._pool.observation_space.shape), dtype=torch.float32)
        self.max_episode_steps = int(self.options["max_episode_steps"])
        self.frame_skip = int(self.options["frame_skip"])
        self.dt = None  # EnvPool does not expose the model timestep
        self._action_dtype = space.dtype
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._tracker = EpisodeTracker(num_envs, self.device)
        self._no_physics_reset = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def _build_pool(self, seed: int) -> None:
        if self._pool is not None:
            self._pool.close()
        self._pool = envpool.make(
            self.task.envpool_id,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.num_envs,  # == num_envs: EnvPool's sync mode, rows always in env-id order
            num_threads=self.num_threads,
            thread_affinity_offset=self.options["thread_affinity_offset"],
            seed=seed,
            **self._kwargs,
        )
        self._pool_seed = seed

    def _to_torch(self, x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # Always a copy: EnvPool may reuse the arrays it returns.
        return torch.tensor(x, dtype=dtype, device=self.device)

    # ----- backend hooks --------------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is not None and seed != self._pool_seed:
            self._build_pool(seed)  # EnvPool seeds only at construction
        obs, _ = self._pool.reset(self._all_ids)
        self._tracker.reset()
        self._last_obs = np.array(obs, dtype=np.float32)  # a copy: for reset(env_mask=...)
        return self._to_torch(obs, torch.float32), {}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        # EnvPool resets envs by id; each env has its own seed and state, so the others are untouched.
        ids = np.flatnonzero(env_mask.cpu().numpy()).astype(np.int32)
        if ids.size:
            reset_obs, reset_info = self._pool.reset(ids)  # SYNC
            self._last_obs[reset_info["env_id"]] = reset_obs
            self._tracker.reset(env_mask)
        return self._to_torch(self._last_obs, torch.float32), {}

    def _send(self, actions: torch.Tensor) -> None:
        # PERF: returns once EnvPool has queued the actions; its threads simulate while the caller works.
        host = actions.detach().cpu().numpy().astype(self._action_dtype, copy=False)  # SYNC: device -> host
        self._pool.send(host, self._all_ids)

    def _recv(self, actions: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, info = self._pool.recv()  # SYNC: waits for EnvPool's threads
        if not np.array_equal(info["env_id"], self._all_ids):
            raise EnvError(f"envpool returned rows for envs {info['env_id'][:8]}...; expected env-id order")
        # A non-finite state (MuJoCo usually resets itself first) is reported per the contract: terminated,
        # physics_reset, zero final_obs row, reward 0.
        bad = ~np.isfinite(obs).all(axis=1)  # PERF: one pass over [N, obs_dim]
        physics_reset = bool(bad.any())
        if physics_reset:
            terminated = terminated | bad
            reward = np.where(bad, 0.0, reward)
            obs = np.where(bad[:, None], 0.0, obs)
        # Converted (copied) before the reset below, whose recv may reuse EnvPool's arrays.
        reward_t = self._to_torch(reward, torch.float32)
        terminated_t = self._to_torch(terminated, torch.bool)
        truncated_t = self._to_torch(truncated, torch.bool)
        done = terminated | truncated
        final_obs = obs
        if done.any():
            # Same-step reset: reset the finished envs now, so no later action is discarded by EnvPool's
            # reset-on-next-step, and report the true last observation separately.
            final_obs = np.array(obs, copy=True)
            done_ids = np.flatnonzero(done).astype(np.int32)
            reset_obs, reset_info = self._pool.reset(done_ids)  # SYNC: one extra round trip on steps with a done
            obs = final_obs.copy()
            obs[reset_info["env_id"]] = reset_obs
        obs_t = self._to_torch(obs, torch.float32)
        self._last_obs = np.array(obs, dtype=np.float32)
        info_out: dict[str, Any] = {
            "final_obs": obs_t.clone() if final_obs is obs else self._to_torch(final_obs, torch.float32),
            "physics_reset": self._to_torch(bad, torch.bool) if physics_reset else self._no_physics_reset.clone(),
        }
        self._tracker.update(reward_t, terminated_t | truncated_t, info_out)
        return StepResult(obs_t, reward_t, terminated_t, truncated_t, info_out)

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
