"""Wrappers that let other RL ecosystems drive any ``BatchedEnv``: gymnasium 1.x, TorchRL, Stable-Baselines3 and
Isaac Gym/rl_games.

Owns only the conversion between our contract (``envs.base``: torch tensors, same-step auto-reset, true next
observation in ``info["final_obs"]``, ``terminated``/``truncated`` separate, per-env reset on demand) and each
ecosystem's own:

* ``GymnasiumVectorEnv``: a ``gymnasium.vector.VectorEnv`` (numpy in/out; ``AutoresetMode.SAME_STEP`` or
  ``NEXT_STEP``; ``info`` laid out as gymnasium's ``SyncVectorEnv`` lays it out in that mode; ``reset_mask``).
  ``GymnasiumSingleEnv`` is a plain ``gymnasium.Env`` over a one-env batch (for ``check_env`` and single-env code).
  Both are registered with gymnasium as ``sample_fast/<Task>`` ids (``envs.registration``).
* ``TorchRLEnv``: a ``torchrl.envs.EnvBase`` with ``batch_size=[N]`` (TensorDict in/out, ``"_reset"`` masks, also on
  running envs: ``StepCounter``, ``max_frames_per_traj``).
* ``SB3VecEnv``: a Stable-Baselines3 ``VecEnv`` (``terminal_observation``, ``TimeLimit.truncated``).
* ``VecTaskEnv``: Isaac Gym's ``VecTask`` interface (``obs_buf``/``rew_buf``/``reset_buf``,
  ``extras["time_outs"]``, fresh tensors each step), which rl_games-style training code drives.

The adapters never step physics themselves and import TorchRL and Stable-Baselines3 only when ``TorchRLEnv`` /
``SB3VecEnv`` is first used.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from .base import BatchedEnv, EnvError, Spec

__all__ = [  # noqa: F822 (TorchRLEnv and SB3VecEnv are built on first access)
    "GymnasiumVectorEnv",
    "GymnasiumSingleEnv",
    "TorchRLEnv",
    "SB3VecEnv",
    "VecTaskEnv",
    "gymnasium_spaces",
    "check_autoreset_mode",
]

_TORCH_TO_NP = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.uint8: np.uint8,
}


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
_AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}


def check_autoreset_mode(mode: Any) -> AutoresetMode:
    """``AutoresetMode.SAME_STEP``/``NEXT_STEP`` (or their names, ``"same_step"``/``"next_step"``); else EnvError."""
    if isinstance(mode, AutoresetMode) and mode in _AUTORESET_MODES.values():
        return mode
    if isinstance(mode, str) and mode.lower() in _AUTORESET_MODES:
        return _AUTORESET_MODES[mode.lower()]
    raise EnvError(
        f"autoreset_mode={mode!r} is not supported; use AutoresetMode.SAME_STEP or AutoresetMode.NEXT_STEP "
        "(or 'same_step' / 'next_step')"
    )


def _masked(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` where ``mask``, zeros elsewhere: the layout of gymnasium's ``VectorEnv._add_info`` arrays."""
    out = np.zeros_like(values)
    out[mask] = values[mask]
    return out


class GymnasiumVectorEnv(gym.vector.VectorEnv):
    """A ``gymnasium.vector.VectorEnv`` over a ``BatchedEnv`` (numpy in/out), in either of gymnasium's auto-reset
    modes; ``info`` is laid out exactly as gymnasium's ``SyncVectorEnv`` lays it out in that mode (tested side by side).

    ``autoreset_mode=AutoresetMode.SAME_STEP`` (the default; our own convention, no extra cost): where env i's episode
    ended, ``obs[i]`` is already the next episode's first observation, ``info["final_obs"]`` is an object array holding
    the ended episode's last observation at i (None elsewhere) with the mask ``info["_final_obs"]``, and
    ``info["final_info"]`` holds that step's info of those envs (``episode_return``, ``episode_length``,
    ``physics_reset``, ``x_position``, ...; each ``[N]`` with a ``_<key>`` mask True where done). The top-level info
    entries are the step's info of the envs that did not end (mask ``~done``), as SyncVectorEnv's are.

    ``autoreset_mode=AutoresetMode.NEXT_STEP`` (gymnasium's default, which its vector observation wrappers such as
    ``NormalizeObservation`` require): where env i's episode ended, ``obs[i]`` is the episode's last observation; the
    next ``step`` ignores env i's action and returns its new episode's first observation with reward 0 and both flags
    False. The ``BatchedEnv`` resets an env in the step that ends its episode and steps every env in every call, so
    here env i is stepped with the ignored action and then reset again on demand (``reset(env_mask=...)``): one extra
    reset and one wasted env step per ended episode, and the ``BatchedEnv`` must support partial resets.

    ``reset(options={"reset_mask": mask})`` resets only the envs where the numpy bool ``mask`` is True, as gymnasium's
    vector envs do (the others continue bit for bit; ``BatchedEnv.reset(env_mask=...)``).
    """

    def __init__(self, env: BatchedEnv, autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP) -> None:
        if not isinstance(env, BatchedEnv):
            raise EnvError(f"GymnasiumVectorEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
        mode = check_autoreset_mode(autoreset_mode)
        if mode == AutoresetMode.NEXT_STEP and type(env)._reset_envs is BatchedEnv._reset_envs:
            raise EnvError(
                f"autoreset_mode=NEXT_STEP needs per-env resets, which backend {env.backend!r} cannot do; "
                "use autoreset_mode=AutoresetMode.SAME_STEP"
            )
        self.env = env
        self.autoreset_mode = mode
        self.metadata = {"autoreset_mode": mode, "render_modes": []}
        self.num_envs = env.num_envs
        self.single_observation_space, self.single_action_space = gymnasium_spaces(env)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self.action_space = batch_space(self.single_action_space, env.num_envs)
        self.render_mode = None
        self._autoreset = np.zeros(env.num_envs, dtype=bool)  # NEXT_STEP: envs to restart at the next step

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (``seed``: one int for the whole batch), or with ``options={"reset_mask": mask}`` (numpy
        bool ``[N]``, at least one True, as gymnasium requires) only the chosen ones. Other options are rejected."""
        seed = _check_seed(seed)
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise EnvError(f"reset options {sorted(options)} are not supported; the only option is 'reset_mask'")
        if mask is None:
            super().reset(seed=seed)
            obs, info = self.env.reset(seed=seed)
            self._autoreset[:] = False
            return _to_numpy(obs), {k: _to_numpy(v) for k, v in info.items()}
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            raise EnvError(
                f"options['reset_mask'] must be a numpy bool array of shape ({self.num_envs},), got "
                f"{type(mask).__name__} {getattr(mask, 'dtype', '')} {getattr(mask, 'shape', '')}"
            )
        if not mask.any():
            raise EnvError("options['reset_mask'] must contain at least one True value (gymnasium's rule)")
        if seed is not None:
            raise EnvError("reset(seed=..., options={'reset_mask': ...}): the seed reseeds the whole batch; drop one")
        obs, info = self.env.reset(env_mask=torch.from_numpy(mask.copy()))
        self._autoreset[mask] = False
        return _to_numpy(obs), {k: _to_numpy(v) for k, v in info.items()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with ``actions`` ``[N, *action_shape]`` (numpy or torch); see the class docstring."""
        res = self.env.step(_actions_to_torch(self.env, actions))
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            return self._next_step(res)
        obs, reward = _to_numpy(res.obs), _to_numpy(res.reward)
        terminated, truncated = _to_numpy(res.terminated), _to_numpy(res.truncated)
        done = terminated | truncated
        step_info = {k: _to_numpy(v) for k, v in res.info.items() if k != "final_obs"}
        info: dict[str, Any] = {}
        if done.any():  # SyncVectorEnv adds final_obs and final_info first, then the (reset) info of each env
            final = _to_numpy(res.info["final_obs"])
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = final[i]
            info["final_obs"], info["_final_obs"] = final_obs, done.copy()
            final_info: dict[str, Any] = {}
            for key, value in step_info.items():
                final_info[key], final_info[f"_{key}"] = _masked(value, done), done.copy()
            info["final_info"], info["_final_info"] = final_info, done.copy()
        running = ~done
        if running.any():
            for key, value in step_info.items():
                info[key], info[f"_{key}"] = _masked(value, running), running.copy()
        return obs, reward, terminated, truncated, info

    def _next_step(self, res: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        restart = self._autoreset.copy()  # ended at the last step: their action now is ignored
        obs = _to_numpy(res.info["final_obs"]).copy()  # the observation each transition reached
        reward = _to_numpy(res.reward).copy()
        terminated, truncated = _to_numpy(res.terminated).copy(), _to_numpy(res.truncated).copy()
        stepped = ~restart
        info: dict[str, Any] = {}
        if stepped.any():
            for key, value in res.info.items():
                if key != "final_obs":
                    info[key], info[f"_{key}"] = _masked(_to_numpy(value), stepped), stepped.copy()
        if restart.any():
            # The BatchedEnv reset these envs when their episode ended and has now stepped them once more: start
            # them over, so what they return is a first observation, as gymnasium's NEXT_STEP reset would.
            first, _ = self.env.reset(env_mask=torch.from_numpy(restart).to(self.env.device))
            obs[restart] = _to_numpy(first)[restart]
            reward[restart] = 0.0
            terminated[restart] = False
            truncated[restart] = False
        self._autoreset = terminated | truncated
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
    from torchrl.envs import EnvBase

    class TorchRLEnv(EnvBase):
        """A TorchRL ``EnvBase`` with ``batch_size=[num_envs]`` over a ``BatchedEnv``.

        Keys: ``"observation"`` ``[N, *obs_shape]``, ``"action"``, ``"reward"`` ``[N, 1]``, ``"done"``,
        ``"terminated"``, ``"truncated"`` ``[N, 1]`` bool. ``step`` reports the observation each transition reached
        (our ``info["final_obs"]``), so ``("next", "observation")`` is the true next observation even at episode
        ends. The ``BatchedEnv`` has already reset those envs, so TorchRL's partial reset (a ``"_reset"`` mask on
        the envs that are done, as ``rollout`` and collectors send) just hands out the new episode's first
        observation without simulating anything. Envs in the mask whose episode is still running (TorchRL's
        ``StepCounter(max_steps)``, a collector's ``max_frames_per_traj``) are reset on demand
        (``BatchedEnv.reset(env_mask=...)``). A reset of every env (no mask) resets the batch.
        """

        def __init__(self, env: BatchedEnv) -> None:
            if not isinstance(env, BatchedEnv):
                raise EnvError(f"TorchRLEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
            n = env.num_envs
            super().__init__(device=env.device, batch_size=torch.Size([n]))
            self.env = env
            self.observation_spec, self.action_spec, self.reward_spec, self.done_spec = _torchrl_specs(env)
            self._seed: int | None = None
            self._obs: torch.Tensor | None = None  # obs after the last step: next episode's first obs where done
            self._pending: torch.Tensor | None = None  # [N] bool: envs the BatchedEnv reset in the last step

        def _set_seed(self, seed: int | None) -> None:
            self._seed = seed

        def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
            n = self.env.num_envs
            mask = None
            if tensordict is not None and "_reset" in tensordict.keys():
                mask = tensordict.get("_reset").reshape(n).to(device=self.env.device, dtype=torch.bool)
            if mask is None or self._obs is None or self._pending is None:
                obs, _ = self.env.reset(seed=self._seed)
                self._seed = None
                pending = torch.zeros(n, dtype=torch.bool, device=self.env.device)
            else:
                running = mask & ~self._pending  # envs whose episode goes on: reset them on demand
                if bool(running.all()):  # every env: a plain reset of the batch
                    obs, _ = self.env.reset(seed=self._seed)
                    self._seed = None
                elif bool(running.any()):  # e.g. StepCounter(max_steps), a collector's max_frames_per_traj
                    obs, _ = self.env.reset(env_mask=running)
                else:  # only envs the BatchedEnv already reset when their episode ended
                    obs = self._obs
                pending = self._pending & ~mask
            self._obs, self._pending = obs, pending
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


def _torchrl_specs(env: BatchedEnv) -> tuple[Any, Any, Any, Any]:
    """TorchRL's observation, action, reward and done specs of ``env``, batched ``[num_envs]``."""
    from torchrl.data import Bounded, Categorical, Composite, Unbounded

    n, device = env.num_envs, env.device
    ospec, aspec = env.observation_spec, env.action_spec
    observation = Composite(observation=_torchrl_box(Bounded, Unbounded, ospec, n, device), shape=(n,), device=device)
    if aspec.is_discrete:
        action = Categorical(aspec.num_actions, shape=(n, *aspec.shape), device=device)
    else:
        action = _torchrl_box(Bounded, Unbounded, aspec, n, device)
    reward = Unbounded(shape=(n, 1), dtype=torch.float32, device=device)
    flag = Categorical(2, shape=(n, 1), dtype=torch.bool, device=device)
    done = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,))
    return observation, action, reward, done


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


# ----- Stable-Baselines3 --------------------------------------------------------------------------------------
def _make_sb3_class() -> type:
    try:
        from stable_baselines3.common.vec_env import VecEnv
    except ImportError as e:
        raise EnvError(
            f"SB3VecEnv needs stable-baselines3, which did not import ({e}); install with: "
            "pip install stable-baselines3 (keep your torch: add --no-deps if pip wants another one)"
        ) from None

    class SB3VecEnv(VecEnv):
        """A Stable-Baselines3 ``VecEnv`` over a ``BatchedEnv`` (numpy in/out), so ``PPO("MlpPolicy", SB3VecEnv(env))``
        trains on our envs without ``DummyVecEnv`` or a hand-written wrapper.

        ``step_wait`` returns ``(obs, rewards, dones, infos)`` as SB3's ``DummyVecEnv`` does: ``dones = terminated or
        truncated``; where env i's episode ended, ``obs[i]`` is already the next episode's first observation,
        ``infos[i]["terminal_observation"]`` the ended episode's last one and ``infos[i]["TimeLimit.truncated"]``
        True when the episode was cut by the time limit and not terminated (SB3 then bootstraps from the terminal
        observation; without the flag it would treat a truncation as a termination). ``infos[i]["episode"]``
        (``{"r", "l", "t"}``, Monitor's layout, so ``rollout/ep_rew_mean`` is logged without ``VecMonitor``) comes
        where an episode ended. Every other info entry of the ``BatchedEnv`` is passed through per env.

        Seeding: ``seed(s)`` (SB3 gives env i the seed ``s + i``) seeds the batch at the next ``reset()`` with ``s``;
        the batch gives each env its own stream (``seed + i`` on envpool/gymnasium/ale, ``SeedSequence(seed).spawn``
        on mujoco, per-env keys on mjx), so no two envs are clones. Per-env seeds other than ``s + i`` cannot be
        honoured (the batch is seeded as a whole) and raise ``EnvError``.
        """

        def __init__(self, env: BatchedEnv) -> None:
            if not isinstance(env, BatchedEnv):
                raise EnvError(f"SB3VecEnv wraps a BatchedEnv (from sample_fast.envs.make), got {env!r}")
            self.env = env
            self.render_mode = None
            obs_space, act_space = gymnasium_spaces(env)
            super().__init__(env.num_envs, obs_space, act_space)
            self._actions: torch.Tensor | None = None
            self._t0 = time.monotonic()

        def reset(self) -> np.ndarray:
            obs, _ = self.env.reset(seed=_batch_seed(self._seeds))
            self._reset_seeds()
            self._reset_options()
            self.reset_infos = [{} for _ in range(self.num_envs)]
            return _to_numpy(obs)

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = _actions_to_torch(self.env, actions)

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
            if self._actions is None:
                raise EnvError("step_wait() called without step_async(actions)")
            res, self._actions = self.env.step(self._actions), None
            return _sb3_step_result(res, self.num_envs, round(time.monotonic() - self._t0, 6))

        def close(self) -> None:
            self.env.close()

        def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
            return [getattr(self, attr_name) for _ in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
            raise EnvError(f"set_attr({attr_name!r}): the envs of a batch share their attributes; none can be set")

        def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
            raise EnvError(f"env_method({method_name!r}): a BatchedEnv has no per-env methods to call")

        def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
            return [False for _ in self._get_indices(indices)]

    return SB3VecEnv


def _batch_seed(seeds: list[int | None]) -> int | None:
    """The batch's seed from SB3's per-env seeds (``seed(s)`` gives env i ``s + i``): ``s``, or None when unseeded;
    ``EnvError`` for per-env seeds the batch cannot honour."""
    if all(s is None for s in seeds):
        return None
    if seeds[0] is None or list(seeds) != [seeds[0] + i for i in range(len(seeds))]:
        raise EnvError(
            f"per-env seeds {list(seeds)[:4]}...: the batch is seeded as a whole; use seed(s), which gives env i the "
            "seed s + i"
        )
    return int(seeds[0])


def _sb3_step_result(res: Any, num_envs: int, elapsed_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """A ``BatchedEnv`` step as SB3's ``(obs, rewards, dones, infos)`` (``SB3VecEnv`` says what each holds)."""
    obs, rewards = _to_numpy(res.obs), _to_numpy(res.reward)
    terminated, truncated = _to_numpy(res.terminated), _to_numpy(res.truncated)
    dones = terminated | truncated
    time_outs = truncated & ~terminated
    per_key = {k: _to_numpy(v) for k, v in res.info.items() if k != "final_obs"}
    infos: list[dict[str, Any]] = [
        {**{k: v[i] for k, v in per_key.items()}, "TimeLimit.truncated": bool(time_outs[i])} for i in range(num_envs)
    ]
    if dones.any():
        final = _to_numpy(res.info["final_obs"])
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = final[i].copy()
            infos[i]["episode"] = {
                "r": float(per_key["episode_return"][i]),
                "l": int(per_key["episode_length"][i]),
                "t": elapsed_s,
            }
    return obs, rewards.copy(), dones, infos


_LAZY_CLASSES: dict[str, type] = {}
_LAZY_BUILDERS = {"TorchRLEnv": _make_torchrl_class, "SB3VecEnv": _make_sb3_class}


def __getattr__(name: str) -> Any:
    """``TorchRLEnv`` and ``SB3VecEnv`` are built on first access, so importing this module does not import TorchRL
    (seconds) or Stable-Baselines3 (an optional dependency)."""
    if name in _LAZY_BUILDERS:
        if name not in _LAZY_CLASSES:
            _LAZY_CLASSES[name] = _LAZY_BUILDERS[name]()
        return _LAZY_CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----- Isaac Gym VecTask / rl_games ---------------------------------------------------------------------------
class VecTaskEnv:
    """Isaac Gym's ``VecTask`` interface over a ``BatchedEnv``, so rl_games-style training code can drive it.

    Buffers (device tensors, updated in place every step, as IsaacGymEnvs keeps them): ``obs_buf``
    ``[N, num_obs]`` float32, ``rew_buf`` ``[N]`` float32, ``reset_buf`` ``[N]`` int64 (1 where the episode ended in
    this step), ``progress_buf`` ``[N]`` int64 (steps into the current episode), ``timeout_buf`` ``[N]`` int64.
    ``step(actions)`` returns ``({"obs": obs}, rewards, dones, extras)``: FRESH tensors that later steps never
    overwrite (IsaacGymEnvs hands out ``torch.clamp(obs_buf, ...)``, a new tensor, each step; libraries such as skrl
    store the returned tensors as the transition's state), equal to the buffers at return time. ``extras`` holds
    ``time_outs`` (bool ``[N]``: the episode was cut by the time limit and not terminated, rl_games' bootstrap
    flag), ``terminated``, ``final_obs`` (true next observation, for exact bootstrapping) and
    ``episode_return``/``episode_length``.

    Reset timing differs from IsaacGymEnvs' tasks (which reset done envs at the start of the next step): here an
    env is reset in the step that ends its episode, so returned rows with ``dones == 1`` already hold the next
    episode's first observation. ``clip_actions`` clamps actions to ``[-clip, clip]`` like ``VecTask``.
    ``reset_idx(env_ids)`` resets chosen envs on demand (``BatchedEnv.reset(env_mask=...)``).
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

    def _clip_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.clamp(-self.clip_obs, self.clip_obs)  # a new tensor, as IsaacGymEnvs' torch.clamp

    def reset(self) -> dict[str, torch.Tensor]:
        """Reset every env; returns ``{"obs": obs}`` (a fresh tensor equal to ``obs_buf``)."""
        obs, _ = self.env.reset()
        obs = self._clip_obs(obs)
        self.obs_buf.copy_(obs)
        self.reset_buf.zero_()
        self.progress_buf.zero_()
        return {"obs": obs}

    def reset_idx(self, env_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Reset the envs ``env_ids`` (int tensor) on demand, the others continue; returns ``{"obs": obs}``."""
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        mask[torch.as_tensor(env_ids, device=self.device).long()] = True
        obs, _ = self.env.reset(env_mask=mask)
        obs = self._clip_obs(obs)
        self.obs_buf.copy_(obs)
        self.progress_buf.masked_fill_(mask, 0)
        return {"obs": obs}

    def step(self, actions: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, dict]:
        """Step every env with ``actions`` ``[N, num_actions]`` (clamped to ``clip_actions`` and the action box).
        Every returned tensor is fresh (see the class docstring)."""
        a = actions.to(device=self.device, dtype=torch.float32).clamp(-self.clip_actions, self.clip_actions)
        if self._act_lo is not None and self._act_hi is not None:
            a = torch.maximum(torch.minimum(a, self._act_hi), self._act_lo)
        res = self.env.step(a)
        done = res.terminated | res.truncated
        obs = self._clip_obs(res.obs)
        time_outs = res.truncated & ~res.terminated
        self.obs_buf.copy_(obs)
        self.rew_buf.copy_(res.reward)
        self.reset_buf.copy_(done)
        self.timeout_buf.copy_(time_outs)
        self.progress_buf.add_(1).masked_fill_(done, 0)
        self.extras = {
            "time_outs": time_outs,
            "terminated": res.terminated.clone(),
            "final_obs": res.info["final_obs"].clone(),
            "episode_return": res.info["episode_return"].clone(),
            "episode_length": res.info["episode_length"].clone(),
        }
        return {"obs": obs}, self.rew_buf.clone(), self.reset_buf.clone(), self.extras

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
