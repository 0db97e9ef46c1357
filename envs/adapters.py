"""Wrappers that let other RL ecosystems drive any ``BatchedEnv``: gymnasium 1.x, TorchRL and Isaac Gym/rl_games.

Owns only the conversion between our contract (``envs.base``: torch tensors, same-step auto-reset, true next
observation in ``info["final_obs"]``, ``terminated``/``truncated`` separate) and each ecosystem's own:

* ``GymnasiumVectorEnv``: a ``gymnasium.vector.VectorEnv`` (numpy in/out, ``AutoresetMode.SAME_STEP``; final
  observations in ``info["final_obs"]`` as gymnasium's ``SyncVectorEnv`` puts them). ``GymnasiumSingleEnv`` is a
  plain ``gymnasium.Env`` over a one-env batch (for ``gymnasium.utils.env_checker.check_env`` and single-env code).
* ``TorchRLEnv``: a ``torchrl.envs.EnvBase`` with ``batch_size=[N]`` (TensorDict in/out, ``"_reset"`` masks).
* ``VecTaskEnv``: Isaac Gym's ``VecTask`` interface (``obs_buf``/``rew_buf``/``reset_buf``,
  ``extras["time_outs"]``), which rl_games-style training code drives.

The adapters never step physics themselves and import TorchRL only when ``TorchRLEnv`` is first used.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from .base import BatchedEnv, EnvError, Spec

__all__ = ["GymnasiumVectorEnv", "GymnasiumSingleEnv", "TorchRLEnv", "VecTaskEnv", "gymnasium_spaces"]  # noqa: F822

_TORCH_TO_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.int32: np.int32}


def _np_dtype(dtype: torch.dtype) -> type:
    if dtype not in _TORCH_TO_NP:
        raise EnvError(f"no numpy dtype for {dtype}; adapters support {sorted(map(str, _TORCH_TO_NP))}")
    return _TORCH_TO_NP[dtype]


def _box_bounds(spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    dtype = _np_dtype(spec.dtype)
    low = np.full(spec.shape, -np.inf, dtype) if spec.low is None else spec.low.cpu().numpy().astype(dtype)
    high = np.full(spec.shape, np.inf, dtype) if spec.high is None else spec.high.cpu().numpy().astype(dtype)
    return low, high


def gymnasium_spaces(env: BatchedEnv) -> tuple[Any, Any]:
    """``(observation_space, action_space)`` of ONE env as gymnasium spaces (``Box``, or ``Discrete`` actions)."""
    from gymnasium import spaces

    low, high = _box_bounds(env.observation_spec)
    obs_space = spaces.Box(low, high, env.observation_spec.shape, _np_dtype(env.observation_spec.dtype))
    spec = env.action_spec
    if spec.is_discrete:
        if spec.shape != ():
            raise EnvError(f"discrete actions of shape {spec.shape} have no gymnasium space here; expected shape ()")
        act_space = spaces.Discrete(spec.num_actions)
    else:
        a_low, a_high = _box_bounds(spec)
        act_space = spaces.Box(a_low, a_high, spec.shape, _np_dtype(spec.dtype))
    return obs_space, act_space


def _to_numpy(x: Any) -> Any:
    # SYNC: a CUDA tensor is copied to the host here (numpy-facing adapters only).
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _actions_to_torch(env: BatchedEnv, actions: Any) -> torch.Tensor:
    """Numpy (or torch) actions ``[N, *action_shape]`` -> a tensor of the env's action dtype on its device."""
    t = torch.as_tensor(np.asarray(actions) if not isinstance(actions, torch.Tensor) else actions)
    return t.to(device=env.device, dtype=env.action_spec.dtype)


def _check_seed(seed: Any) -> int | None:
    if seed is None or isinstance(seed, (int, np.integer)):
        return None if seed is None else int(seed)
    raise EnvError(f"seed must be an int or None (the batch is seeded as a whole), got {seed!r}")


# ----- gymnasium ----------------------------------------------------------------------------------------------
class GymnasiumVectorEnv(gym.vector.VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` over a ``BatchedEnv`` (numpy in/out, same-step auto-reset).

    ``step`` returns ``(obs, reward, terminated, truncated, info)`` as numpy arrays. Where env i's episode ended,
    ``obs[i]`` is already the next episode's first observation and, exactly like gymnasium's
    ``SyncVectorEnv(autoreset_mode=SAME_STEP)``, ``info["final_obs"]`` is an object array holding the ended
    episode's last observation at i (None elsewhere) with the mask ``info["_final_obs"]``, and
    ``info["final_info"]`` holds ``episode_return``/``episode_length`` for those envs. Every other info
    entry of the ``BatchedEnv`` is passed through as an ``[N, ...]`` array with an all-True ``_<key>`` mask.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: BatchedEnv) -> None:
        if not isinstance(env, BatchedEnv):
            raise EnvError(f"GymnasiumVectorEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space, self.single_action_space = gymnasium_spaces(env)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self.action_space = batch_space(self.single_action_space, env.num_envs)
        self.render_mode = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (``seed``: one int for the whole batch). ``options`` is accepted and ignored."""
        seed = _check_seed(seed)
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed)
        return _to_numpy(obs), {k: _to_numpy(v) for k, v in info.items()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with ``actions`` ``[N, *action_shape]`` (numpy or torch); see the class docstring."""
        res = self.env.step(_actions_to_torch(self.env, actions))
        obs, reward = _to_numpy(res.obs), _to_numpy(res.reward)
        terminated, truncated = _to_numpy(res.terminated), _to_numpy(res.truncated)
        done = terminated | truncated
        info: dict[str, Any] = {}
        for key, value in res.info.items():
            if key in ("final_obs", "episode_return", "episode_length"):
                continue
            info[key], info[f"_{key}"] = _to_numpy(value), np.ones(self.num_envs, dtype=bool)
        if done.any():
            final = _to_numpy(res.info["final_obs"])
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = final[i]
            info["final_obs"], info["_final_obs"] = final_obs, done.copy()
            info["final_info"] = {
                "episode_return": _to_numpy(res.info["episode_return"]),
                "_episode_return": done.copy(),
                "episode_length": _to_numpy(res.info["episode_length"]),
                "_episode_length": done.copy(),
            }
            info["_final_info"] = done.copy()
        return obs, reward, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


class GymnasiumSingleEnv(gym.Env):
    """A plain ``gymnasium.Env`` over a ``BatchedEnv`` with ``num_envs == 1`` (gymnasium's own API: after an
    episode ends, ``step`` returns its last observation and the caller calls ``reset``)."""

    metadata = {"render_modes": []}

    def __init__(self, env: BatchedEnv) -> None:
        if not isinstance(env, BatchedEnv) or env.num_envs != 1:
            raise EnvError(f"GymnasiumSingleEnv needs a BatchedEnv with num_envs=1, got {env!r}")
        self.env = env
        self.observation_space, self.action_space = gymnasium_spaces(env)
        self.render_mode = None
        self._needs_reset = True
        self._next_obs: np.ndarray | None = None  # first obs of the next episode, already reset by the env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        seed = _check_seed(seed)
        super().reset(seed=seed)
        if seed is None and self._next_obs is not None:
            # The batched env already reset itself when the last episode ended: hand out that observation.
            obs, self._next_obs = self._next_obs, None
        else:
            obs_t, _ = self.env.reset(seed=seed)
            obs = _to_numpy(obs_t)[0]
        self._needs_reset = False
        return obs, {}

    def step(self, action: Any):
        if self._needs_reset:
            raise EnvError("step() called before reset() or after the episode ended; call reset() first")
        res = self.env.step(_actions_to_torch(self.env, np.asarray(action)[None]))
        terminated, truncated = bool(res.terminated[0]), bool(res.truncated[0])
        info = {k: _to_numpy(v)[0] for k, v in res.info.items() if k != "final_obs"}
        obs = _to_numpy(res.info["final_obs"])[0]
        if terminated or truncated:
            self._next_obs, self._needs_reset = _to_numpy(res.obs)[0], True
        return obs, float(res.reward[0]), terminated, truncated, info

    def close(self) -> None:
        self.env.close()


# ----- TorchRL ------------------------------------------------------------------------------------------------
def _make_torchrl_class() -> type:
    from tensordict import TensorDict, TensorDictBase
    from torchrl.data import Bounded, Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase

    class TorchRLEnv(EnvBase):
        """A TorchRL ``EnvBase`` with ``batch_size=[num_envs]`` over a ``BatchedEnv``.

        Keys: ``"observation"`` ``[N, *obs_shape]``, ``"action"``, ``"reward"`` ``[N, 1]``, ``"done"``,
        ``"terminated"``, ``"truncated"`` ``[N, 1]`` bool. ``step`` reports the observation each transition reached
        (our ``info["final_obs"]``), so ``("next", "observation")`` is the true next observation even at episode
        ends. The ``BatchedEnv`` has already reset those envs, so TorchRL's partial reset (a ``"_reset"`` mask on
        the envs that are done, as ``rollout`` and collectors send) just hands out the new episode's first
        observation without simulating anything. A reset of every env (no mask, or all True) resets the batch.
        """

        def __init__(self, env: BatchedEnv) -> None:
            if not isinstance(env, BatchedEnv):
                raise EnvError(f"TorchRLEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
            n = env.num_envs
            super().__init__(device=env.device, batch_size=torch.Size([n]))
            self.env = env
            ospec, aspec = env.observation_spec, env.action_spec
            self.observation_spec = Composite(
                observation=_torchrl_box(Bounded, Unbounded, ospec, n, env.device), shape=(n,), device=env.device
            )
            if aspec.is_discrete:
                self.action_spec = Categorical(aspec.num_actions, shape=(n, *aspec.shape), device=env.device)
            else:
                self.action_spec = _torchrl_box(Bounded, Unbounded, aspec, n, env.device)
            self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32, device=env.device)
            flag = Categorical(2, shape=(n, 1), dtype=torch.bool, device=env.device)
            self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,))
            self._seed: int | None = None
            self._obs: torch.Tensor | None = None  # obs after the last step: next episode's first obs where done
            self._pending: torch.Tensor | None = None  # [N] bool: envs the BatchedEnv reset in the last step

        def _set_seed(self, seed: int | None) -> None:
            self._seed = seed

        def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
            n = self.env.num_envs
            mask = None
            if tensordict is not None and "_reset" in tensordict.keys():
                mask = tensordict.get("_reset").reshape(n).to(torch.bool)
            if mask is None or self._obs is None or self._pending is None or bool((mask & ~self._pending).any()):
                if mask is not None and self._obs is not None and not bool(mask.all()):
                    bad = (mask & ~self._pending).nonzero().flatten().tolist()
                    raise EnvError(
                        f"TorchRLEnv cannot reset envs {bad[:10]} alone: a BatchedEnv resets an env only when its "
                        "episode ends (or the whole batch on reset()); reset every env instead"
                    )
                obs, _ = self.env.reset(seed=self._seed)
                self._seed = None
            else:
                obs = self._obs
            self._obs, self._pending = obs, torch.zeros(n, dtype=torch.bool, device=self.env.device)
            zeros = torch.zeros(n, 1, dtype=torch.bool, device=self.env.device)
            return TensorDict(
                {"observation": obs, "done": zeros, "terminated": zeros.clone(), "truncated": zeros.clone()},
                batch_size=self.batch_size,
                device=self.env.device,
            )

        def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
            res = self.env.step(tensordict.get("action").to(self.env.action_spec.dtype))
            done = res.terminated | res.truncated
            self._obs, self._pending = res.obs, done
            return TensorDict(
                {
                    "observation": res.info["final_obs"],
                    "reward": res.reward.unsqueeze(-1),
                    "done": done.unsqueeze(-1),
                    "terminated": res.terminated.unsqueeze(-1),
                    "truncated": res.truncated.unsqueeze(-1),
                },
                batch_size=self.batch_size,
                device=self.env.device,
            )

        def close(self, *, raise_if_closed: bool = True) -> None:
            self.env.close()
            super().close(raise_if_closed=raise_if_closed)

    return TorchRLEnv


def _torchrl_box(bounded: type, unbounded: type, spec: Spec, n: int, device: torch.device) -> Any:
    shape = (n, *spec.shape)
    if (
        spec.low is None
        or spec.high is None
        or not bool(torch.isfinite(spec.low).all() & torch.isfinite(spec.high).all())
    ):
        return unbounded(shape=shape, dtype=spec.dtype, device=device)
    low = spec.low.to(device).expand(shape).clone()
    high = spec.high.to(device).expand(shape).clone()
    return bounded(low=low, high=high, shape=shape, dtype=spec.dtype, device=device)


_TORCHRL_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    """``TorchRLEnv`` is built on first access, so importing this module does not import TorchRL (seconds)."""
    global _TORCHRL_CLASS
    if name == "TorchRLEnv":
        if _TORCHRL_CLASS is None:
            _TORCHRL_CLASS = _make_torchrl_class()
        return _TORCHRL_CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----- Isaac Gym VecTask / rl_games ---------------------------------------------------------------------------
class VecTaskEnv:
    """Isaac Gym's ``VecTask`` interface over a ``BatchedEnv``, so rl_games-style training code can drive it.

    Buffers (device tensors, updated in place every step): ``obs_buf`` ``[N, num_obs]`` float32, ``rew_buf``
    ``[N]`` float32, ``reset_buf`` ``[N]`` int64 (1 where the episode ended in this step), ``progress_buf`` ``[N]``
    int64 (steps into the current episode), ``timeout_buf`` ``[N]`` int64.
    ``step(actions)`` returns ``({"obs": obs_buf}, rew_buf, reset_buf, extras)`` with ``extras["time_outs"]``
    (bool ``[N]``: the episode was cut by the time limit and not terminated, rl_games' bootstrap flag),
    ``extras["terminated"]``, ``extras["final_obs"]`` (true next observation, for exact bootstrapping) and
    ``extras["episode_return"]``/``extras["episode_length"]``.

    Reset timing differs from IsaacGymEnvs' tasks (which reset done envs at the start of the next step): here an
    env is reset in the step that ends its episode, so ``obs_buf`` rows with ``reset_buf == 1`` already hold the
    next episode's first observation. ``clip_actions`` clamps actions to ``[-clip, clip]`` like ``VecTask``.
    """

    def __init__(self, env: BatchedEnv, clip_actions: float = float("inf"), clip_obs: float = float("inf")) -> None:
        if not isinstance(env, BatchedEnv):
            raise EnvError(f"VecTaskEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
        if env.action_spec.is_discrete or len(env.action_spec.shape) != 1 or len(env.observation_spec.shape) != 1:
            raise EnvError(
                "VecTaskEnv needs flat continuous observations and actions (Isaac Gym's VecTask has no other kind); "
                f"got observation {env.observation_spec.shape}, action {env.action_spec}"
            )
        self.env = env
        self.device = env.device
        self.num_envs = env.num_envs
        self.num_obs = env.observation_spec.shape[0]
        self.num_actions = env.action_spec.shape[0]
        self.num_states = 0
        self.max_episode_length = env.max_episode_steps
        self.clip_actions, self.clip_obs = float(clip_actions), float(clip_obs)
        obs_space, act_space = gymnasium_spaces(env)
        self.observation_space = obs_space
        self.action_space = act_space
        n, dev = self.num_envs, self.device
        self.obs_buf = torch.zeros(n, self.num_obs, dtype=torch.float32, device=dev)
        self.rew_buf = torch.zeros(n, dtype=torch.float32, device=dev)
        self.reset_buf = torch.ones(n, dtype=torch.int64, device=dev)
        self.timeout_buf = torch.zeros(n, dtype=torch.int64, device=dev)
        self.progress_buf = torch.zeros(n, dtype=torch.int64, device=dev)
        self.extras: dict[str, Any] = {}
        self._act_lo = None if env.action_spec.low is None else env.action_spec.low.to(dev)
        self._act_hi = None if env.action_spec.high is None else env.action_spec.high.to(dev)

    def reset(self) -> dict[str, torch.Tensor]:
        """Reset every env; returns ``{"obs": obs_buf}``."""
        obs, _ = self.env.reset()
        self.obs_buf.copy_(obs.clamp(-self.clip_obs, self.clip_obs))
        self.reset_buf.zero_()
        self.progress_buf.zero_()
        return {"obs": self.obs_buf}

    def step(self, actions: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, dict]:
        """Step every env with ``actions`` ``[N, num_actions]`` (clamped to ``clip_actions`` and the action box)."""
        a = actions.to(device=self.device, dtype=torch.float32).clamp(-self.clip_actions, self.clip_actions)
        if self._act_lo is not None and self._act_hi is not None:
            a = torch.maximum(torch.minimum(a, self._act_hi), self._act_lo)
        res = self.env.step(a)
        done = res.terminated | res.truncated
        self.obs_buf.copy_(res.obs.clamp(-self.clip_obs, self.clip_obs))
        self.rew_buf.copy_(res.reward)
        self.reset_buf.copy_(done)
        self.timeout_buf.copy_(res.truncated & ~res.terminated)
        self.progress_buf.add_(1).masked_fill_(done, 0)
        self.extras = {
            "time_outs": self.timeout_buf.to(torch.bool),
            "terminated": res.terminated,
            "final_obs": res.info["final_obs"],
            "episode_return": res.info["episode_return"],
            "episode_length": res.info["episode_length"],
        }
        return {"obs": self.obs_buf}, self.rew_buf, self.reset_buf, self.extras

    def get_env_info(self) -> dict[str, Any]:
        """What rl_games' ``vecenv`` asks an env for."""
        return {
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "agents": 1,
            "value_size": 1,
        }

    def get_number_of_agents(self) -> int:
        return 1

    def close(self) -> None:
        self.env.close()
