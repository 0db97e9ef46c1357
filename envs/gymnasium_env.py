"""``gymnasium`` backend: any registered gymnasium id as a ``BatchedEnv`` (``make("gymnasium:Pendulum-v1", 8)``), also
in gymnasium's ``module:EnvId`` form (``make("gymnasium:my_pkg.envs:MyEnv-v0", 8)`` imports ``my_pkg.envs`` first).

It owns one ``gymnasium.vector.SyncVectorEnv`` (or ``AsyncVectorEnv``, option ``vectorization="async"``) built with
gymnasium's same-step autoreset, and converts its numpy results to torch tensors on the env's device. Gymnasium's
``info["final_obs"]`` (an object array filled only where an episode ended) becomes our dense ``final_obs``.
The universal fallback: slower than the native backends, but it runs anything gymnasium can make.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from .base import BatchedEnv, EnvError, EpisodeTracker, Spec, StepResult

#: Options this adapter consumes itself; every other option is passed to ``gymnasium.make`` as a keyword argument.
ADAPTER_OPTIONS: dict[str, Any] = {
    "vectorization": "sync",  # "sync": SyncVectorEnv in this process; "async": AsyncVectorEnv, one process per env
    "step_timeout_s": 120.0,  # async only: how long recv() waits for the worker processes
}

_REGISTRY_HINT = "list the registered ids with: python -c 'import gymnasium; gymnasium.pprint_registry()'"


def find_spec(name: str) -> gymnasium.envs.registration.EnvSpec:
    """The registered spec of ``gymnasium:<id>``, following gymnasium's own ``module:EnvId`` convention (as in
    ``gymnasium.make``): ``gymnasium:my_pkg.envs:MyEnv-v0`` imports ``my_pkg.envs`` (which registers its envs on
    import) and then looks ``MyEnv-v0`` up in the registry. Raises ``EnvError`` naming the module or the id."""
    env_id = name.split(":", 1)[1] if name.startswith("gymnasium:") else name
    module, _, registered_id = env_id.rpartition(":")
    if not registered_id:
        raise EnvError(f"empty gymnasium id in {name!r}; use e.g. 'gymnasium:Pendulum-v1' ({_REGISTRY_HINT})")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:  # the module itself, or something it imports, is missing
            raise EnvError(
                f"could not import module {module!r} ({e}), which should register {registered_id!r} (gymnasium's "
                "'module:EnvId' convention); check that it is installed or on sys.path"
            ) from None
    try:
        return gymnasium.spec(registered_id)
    except gymnasium.error.Error as e:
        where = f" after importing {module!r}" if module else ""
        raise EnvError(f"gymnasium has no env {registered_id!r}{where} ({e}); {_REGISTRY_HINT}") from None


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check the id (importing its module, see ``find_spec``) and this adapter's own options; return the adapter
    options with defaults filled in. The rest go to ``gymnasium.make``, which alone can check them (when the env is
    built). ``GymnasiumEnv`` calls it first, and so does the trainer's config check
    (``sample_fast.envs.check_options``)."""
    find_spec(name)
    own = {k: options.get(k, v) for k, v in ADAPTER_OPTIONS.items()}
    if own["vectorization"] not in ("sync", "async"):
        raise EnvError(f"vectorization must be 'sync' or 'async', got {own['vectorization']!r}")
    timeout = own["step_timeout_s"]
    if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
        raise EnvError(f"step_timeout_s must be a positive number of seconds, got {timeout!r}")
    return own


def _obs_spec(space: gymnasium.Space, env_id: str) -> Spec:
    if isinstance(space, spaces.Box):
        return Spec(
            shape=tuple(space.shape),
            dtype=torch.float32,
            low=torch.as_tensor(space.low, dtype=torch.float32),
            high=torch.as_tensor(space.high, dtype=torch.float32),
        )
    if isinstance(space, spaces.Discrete):  # observed as a one-hot float vector
        return Spec(shape=(int(space.n),), dtype=torch.float32)
    raise EnvError(
        f"{env_id!r} has a {type(space).__name__} observation space; the gymnasium backend takes Box or Discrete "
        "observations: wrap the env (e.g. gymnasium.wrappers.FlattenObservation) and register the wrapped id"
    )


def _action_spec(space: gymnasium.Space, env_id: str) -> Spec:
    if isinstance(space, spaces.Box):
        return Spec(
            shape=tuple(space.shape),
            dtype=torch.float32,
            low=torch.as_tensor(space.low, dtype=torch.float32),
            high=torch.as_tensor(space.high, dtype=torch.float32),
        )
    if isinstance(space, spaces.Discrete):
        return Spec(shape=(), dtype=torch.int64, num_actions=int(space.n))
    raise EnvError(
        f"{env_id!r} has a {type(space).__name__} action space; the gymnasium backend takes Box or Discrete actions "
        "(wrap the env, e.g. with gymnasium.wrappers.FlattenObservation-style action wrappers, and register it)"
    )


class GymnasiumEnv(BatchedEnv):
    """``num_envs`` copies of a gymnasium env id, stepped by ``gymnasium.vector`` with same-step autoreset.

    Args:
        name: ``"gymnasium:<id>"``.
        num_envs: number of copies.
        device: where the returned tensors live (simulation always runs on the CPU).
        seed: the first ``reset()`` seeds env i with ``seed + i`` (gymnasium's vector seeding).
        options: ``vectorization`` ("sync" or "async"), ``step_timeout_s``; everything else goes to
            ``gymnasium.make`` (e.g. ``max_episode_steps=200``, ``g=9.81`` for Pendulum).

    Actions are passed on unclipped (MuJoCo clamps controls itself); observations become float32 (Discrete
    observations become one-hot vectors).
    """

    #: A gymnasium env may truncate for its own reasons (not only its TimeLimit), so no truncation bound is assumed.
    truncates_only_at_time_limit = False

    backend = "gymnasium"

    def __init__(self, name: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0, **options: Any):
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
        own = check_options(name, options)
        registered = find_spec(name)
        options = {k: v for k, v in options.items() if k not in ADAPTER_OPTIONS}

        self.name = name
        self.env_id = registered.id
        # what gymnasium.make gets: 'module:EnvId' stays whole, so that async workers import the module themselves
        self._make_id = name.split(":", 1)[1] if name.startswith("gymnasium:") else name
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.vectorization = own["vectorization"]
        self._step_timeout_s = float(own["step_timeout_s"])
        self.make_kwargs = dict(options)
        self._vec: SyncVectorEnv | AsyncVectorEnv | None = None

        # Build one env here first: a bad keyword fails in this process with a readable error, and it gives the
        # spaces and time limit without spawning workers.
        probe = self._make_one()
        try:
            self.observation_spec = _obs_spec(probe.observation_space, self.env_id)
            self.action_spec = _action_spec(probe.action_space, self.env_id)
            self._single_action_space = probe.action_space
            self._obs_space = probe.observation_space
            self.max_episode_steps = probe.spec.max_episode_steps if probe.spec is not None else None
            if self.max_episode_steps is None:
                self.max_episode_steps = registered.max_episode_steps
            unwrapped = probe.unwrapped
            self.dt = getattr(unwrapped, "dt", None)
            self.frame_skip = int(getattr(unwrapped, "frame_skip", 1))
        finally:
            if self.vectorization == "async":
                probe.close()
        fns = [self._make_one for _ in range(num_envs)]
        if self.vectorization == "sync":
            fns[0] = lambda: probe  # reuse the probe rather than building it twice
            self._vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        else:
            self._vec = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self._seed: int | None = seed
        self._tracker = EpisodeTracker(num_envs, self.device)
        self._no_physics_reset = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def _make_one(self) -> gymnasium.Env:
        try:
            return gymnasium.make(self._make_id, **self.make_kwargs)
        except gymnasium.error.Error as e:
            raise EnvError(f"gymnasium.make({self.env_id!r}) failed: {e}; {_REGISTRY_HINT}") from None
        except TypeError as e:
            raise EnvError(
                f"gymnasium.make({self.env_id!r}, **{self.make_kwargs}) rejected an option: {e}. Options other than "
                f"{', '.join(ADAPTER_OPTIONS)} are passed to gymnasium.make; check the env's constructor arguments"
            ) from None

    # ----- conversions ----------------------------------------------------------------------------------------
    def _obs_tensor(self, obs: np.ndarray) -> torch.Tensor:
        if isinstance(self._obs_space, spaces.Discrete):
            idx = torch.as_tensor(np.asarray(obs) - self._obs_space.start, dtype=torch.int64)
            return torch.nn.functional.one_hot(idx, int(self._obs_space.n)).to(torch.float32).to(self.device)
        return torch.as_tensor(np.asarray(obs), dtype=torch.float32).to(self.device)

    def _to_numpy_actions(self, actions: torch.Tensor) -> np.ndarray:
        host = actions.detach().cpu().numpy()  # SYNC: device -> host copy when the actions live on a GPU
        space = self._single_action_space
        if isinstance(space, spaces.Discrete):
            return (host + int(space.start)).astype(space.dtype, copy=False)
        return host.astype(space.dtype, copy=False)

    # ----- backend hooks --------------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is None:
            seed, self._seed = self._seed, None  # the constructor's seed applies to the first reset only
        obs, _ = self._vec.reset(seed=seed)
        self._tracker.reset()
        self._last_obs = self._obs_tensor(obs)  # kept for an all-False reset(env_mask=...)
        return self._last_obs.clone(), {}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        # gymnasium's own partial reset (SyncVectorEnv and AsyncVectorEnv): each chosen env continues its own random
        # stream (no seed), the others keep their state, and the returned batch holds their last observations.
        mask = env_mask.cpu().numpy()
        if not mask.any():  # gymnasium rejects an all-False reset_mask; nothing to reset
            return self._last_obs.clone(), {}
        obs, _ = self._vec.reset(options={"reset_mask": mask})
        self._tracker.reset(env_mask)
        self._last_obs = self._obs_tensor(obs)
        return self._last_obs.clone(), {}

    def _send(self, actions: torch.Tensor) -> None:
        if self.vectorization == "async":  # the worker processes step while the caller works
            self._vec.step_async(self._to_numpy_actions(actions))

    def _recv(self, actions: torch.Tensor) -> StepResult:
        if self.vectorization == "async":
            try:
                obs, reward, terminated, truncated, infos = self._vec.step_wait(timeout=self._step_timeout_s)
            except (TimeoutError, gymnasium.error.Error) as e:
                msg = f"{self.env_id}: async step failed or timed out ({e!r}); close() and make a new env"
                raise EnvError(msg) from e
        else:
            obs, reward, terminated, truncated, infos = self._vec.step(self._to_numpy_actions(actions))
        final = obs
        if "final_obs" in infos:
            done_idx = np.flatnonzero(infos["_final_obs"])
            final = np.array(obs, copy=True)
            final[done_idx] = np.stack([np.asarray(infos["final_obs"][i]) for i in done_idx])
        obs_t = self._obs_tensor(obs)
        terminated_t = torch.as_tensor(terminated, dtype=torch.bool).to(self.device)
        truncated_t = torch.as_tensor(truncated, dtype=torch.bool).to(self.device)
        reward_t = torch.as_tensor(reward, dtype=torch.float32).to(self.device)
        info: dict[str, Any] = {
            "final_obs": obs_t.clone() if final is obs else self._obs_tensor(final),
            "physics_reset": self._no_physics_reset.clone(),
        }
        self._tracker.update(reward_t, terminated_t | truncated_t, info)
        self._last_obs = obs_t.clone()
        return StepResult(obs_t, reward_t, terminated_t, truncated_t, info)

    def _close(self) -> None:
        if self._vec is not None:
            self._vec.close()
            self._vec = None
