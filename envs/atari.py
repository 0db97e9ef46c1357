"""The Atari task shared by the ``envpool`` and ``ale`` backends: names, options and one set of episode semantics.

It owns the game-name scheme (``"Pong-v5"``: a ROM of ale-py in CamelCase plus ``-v5``), the task options with
their defaults, and ``AtariEnvBase``, which turns either backend's numpy results into the ``BatchedEnv`` tensors
(uint8 frames, episode statistics, life-loss terminations). It imports neither EnvPool nor ale-py at module level
and owns no emulator: each backend module (``envpool_atari.py``, ``ale_env.py``) owns its pool.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any

import numpy as np
import torch

from .base import BatchedEnv, EnvError, EpisodeTracker, Spec, StepResult

#: Every Atari task option with its default (docs/envs_backends.md, "Atari", explains each).
ATARI_OPTIONS: dict[str, Any] = {
    # 27,000 agent steps = 108,000 frames at frame_skip 4: the cap of Machado et al. 2018 (30 min of play).
    "max_episode_steps": 27_000,
    "frame_skip": 4,
    "noop_max": 30,  # up to this many no-op frames after each game reset (Mnih et al. 2015); 0 disables them
    # Sticky actions with the probability Machado et al. 2018 recommend (and ale-py's own v5 envs use): the
    # emulator repeats the previous action with this probability each frame, so open-loop action sequences
    # can't memorise a game. EnvPool's default is 0; both backends get this value unless it is given.
    "repeat_action_probability": 0.25,
    "episodic_life": False,  # True: a lost life is `terminated` (the game itself goes on, see the docs)
    "full_action_space": False,  # False: the game's minimal action set; True: all 18 joystick actions
    "fire_reset": True,  # press FIRE once after each game reset in games that have it (both backends' default)
}

#: Settings of the thread pool, accepted besides the task options.
BACKEND_OPTIONS: dict[str, Any] = {
    "num_threads": None,  # None: min(num_envs, os.cpu_count())
    "thread_affinity_offset": -1,  # >= 0 pins the pool's threads to cores offset, offset + 1, ...
}

#: Fixed preprocessing (not options): 84x84 grayscale frames, the last 4 stacked, max-pooled over 2 frames.
FRAME_SHAPE = (84, 84)
STACK_NUM = 4

_NAME = re.compile(r"^([A-Z][A-Za-z0-9]*)-v5$")
#: Effectively no time limit (max_episode_steps=None); small enough that frames (x frame_skip) fit in an int32.
_NO_LIMIT = 10**8


def is_atari_name(name: str) -> bool:
    """True for names of the Atari form ``<Game>-v5`` (whether or not the game exists; see ``rom_id``)."""
    return _NAME.match(name) is not None


def game_name(rom: str) -> str:
    """``"space_invaders"`` -> ``"SpaceInvaders-v5"`` (EnvPool's and ale-py's own naming)."""
    return "".join(part.capitalize() for part in rom.split("_")) + "-v5"


def rom_ids() -> list[str]:
    """ROM ids (snake_case) of every game ale-py ships, or EnvPool's list where ale-py is not installed."""
    try:
        from ale_py import roms

        return sorted(roms.get_all_rom_ids())
    except ImportError:
        from envpool.atari.registration import atari_game_list

        return sorted(atari_game_list)


def rom_id(name: str) -> str:
    """The ROM id of ``name`` (``"Pong-v5"`` -> ``"pong"``); an unknown game raises ``EnvError`` with the closest."""
    by_name = {game_name(rom): rom for rom in rom_ids()}
    if name in by_name:
        return by_name[name]
    close = difflib.get_close_matches(name, list(by_name), n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}; " if close else ""
    from .tasks import TASKS

    base = name[: -len("-v5")].lower()
    mujoco = f" (the MuJoCo task is named {base!r})" if base in TASKS else ""
    raise EnvError(f"unknown Atari game {name!r}{mujoco}; {hint}all {len(by_name)} games: {', '.join(sorted(by_name))}")


def resolve_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """Merge ``given`` over the Atari defaults and check each value; unknown names raise ``EnvError``."""
    defaults = {**ATARI_OPTIONS, **BACKEND_OPTIONS}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise EnvError(f"unknown option(s) {unknown} for Atari game {name!r}; valid options: {', '.join(defaults)}")
    opts = {**defaults, **given}

    def positive_int(key: str, allow_zero: bool = False) -> None:
        v = opts[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
            kind = "non-negative" if allow_zero else "positive"
            raise EnvError(f"Atari option {key} must be a {kind} int, got {v!r}")

    if opts["max_episode_steps"] is None:
        opts["max_episode_steps"] = _NO_LIMIT
    positive_int("max_episode_steps")
    positive_int("frame_skip")
    positive_int("noop_max", allow_zero=True)
    if opts["max_episode_steps"] * opts["frame_skip"] > 2**31 - 2:
        raise EnvError(f"max_episode_steps * frame_skip must fit in an int32; use max_episode_steps <= {_NO_LIMIT}")
    p = opts["repeat_action_probability"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise EnvError(f"Atari option repeat_action_probability must be a number in [0, 1], got {p!r}")
    for key in ("episodic_life", "full_action_space", "fire_reset"):
        if not isinstance(opts[key], bool):
            raise EnvError(f"Atari option {key} must be True or False, got {opts[key]!r}")
    if opts["num_threads"] is not None:
        positive_int("num_threads")
    if not isinstance(opts["thread_affinity_offset"], int) or opts["thread_affinity_offset"] < -1:
        raise EnvError(f"thread_affinity_offset must be an int >= -1, got {opts['thread_affinity_offset']!r}")
    return opts


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The game exists and ``options`` are valid for it (defaults filled in); raises ``EnvError``. Both Atari
    backends take the same options, so ``sample_fast.envs.check_options`` (the trainer's config check) calls this
    for either of them without building a pool."""
    rom_id(name)
    return resolve_options(name, options)


class AtariEnvBase(BatchedEnv):
    """What the two Atari backends share: option handling, specs, and the numpy -> torch step output.

    Subclasses build their pool in ``__init__`` after calling ``_init_task`` and call ``_output`` from ``_recv``.
    """

    def _init_task(self, name: str, num_envs: int, device: str | torch.device, options: dict[str, Any]) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise EnvError(f"num_envs must be a positive int, got {num_envs!r}")
        self.name = name
        self.rom = rom_id(name)
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.options = resolve_options(name, options)
        self.num_threads = self.options["num_threads"] or min(num_envs, os.cpu_count() or 1)
        self.max_episode_steps = self.options["max_episode_steps"]
        self.frame_skip = self.options["frame_skip"]
        self.dt = None
        self.episodic_life = self.options["episodic_life"]
        shape = (STACK_NUM, *FRAME_SHAPE)
        self.observation_spec = Spec(
            shape=shape,
            dtype=torch.uint8,
            low=torch.zeros(shape, dtype=torch.uint8),
            high=torch.full(shape, 255, dtype=torch.uint8),
        )
        self._tracker = EpisodeTracker(num_envs, self.device)
        self._no_physics_reset = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def _set_num_actions(self, num_actions: int) -> None:
        self.action_spec = Spec(shape=(), dtype=torch.int64, num_actions=int(num_actions))

    def _send_actions(self, actions: torch.Tensor, dtype: type) -> np.ndarray:
        """The checked host copy of ``actions`` for a backend's ``_send``; a rejected send leaves nothing pending."""
        try:
            if self._needs_reset:
                raise EnvError(f"call reset() before the first step of {self!r}")
            return self._host_actions(actions, dtype)
        except EnvError:
            self._pending = None
            raise

    def _host_actions(self, actions: torch.Tensor, dtype: type) -> np.ndarray:
        host = actions.detach().cpu().numpy().astype(dtype, copy=False)  # SYNC: device -> host
        # Checked even with check_actions off: EnvPool indexes its action table with it unchecked (a C++ vector
        # read out of bounds); [N] ints, so a few µs.
        if host.size and (host.min() < 0 or host.max() >= self.action_spec.num_actions):
            raise EnvError(
                f"discrete actions must be in [0, {self.action_spec.num_actions}); got values in "
                f"[{int(host.min())}, {int(host.max())}] (expected "
                f"{self.action_spec.describe(self.num_envs, self.device)})"
            )
        return host

    def _to_torch(self, x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        # Always a copy: both pools reuse the arrays they return. PERF: torch.tensor(ndarray) took 1.3 ms for one
        # [8, 4, 84, 84] uint8 batch (it was 60% of an EnvPool Pong step); from_numpy + one copy takes 6 us.
        # The copy is numpy's (one thread), not Tensor.clone: torch parallelises a copy this large (3.6M uint8 at
        # 32 envs) over its intra-op pool, and with 2 torch threads on 2 cores, beside the emulator's threads, the
        # clone took 280-490 us instead of 50 (numpy: 44-56 us; ad-hoc timings under load).
        t = torch.from_numpy(np.ascontiguousarray(x))
        if t.dtype == dtype and t.device == self.device:
            return torch.from_numpy(np.array(x, order="C", copy=True))
        return t.to(device=self.device, dtype=dtype)  # a new tensor whenever dtype or device differ

    def _output(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_obs: np.ndarray | None,
        lives: np.ndarray,
    ) -> StepResult:
        """Build the ``StepResult``. ``final_obs`` is None when no env ended (then it is ``obs`` itself)."""
        obs_t = self._to_torch(obs, torch.uint8)
        reward_t = self._to_torch(reward, torch.float32)
        terminated_t = self._to_torch(terminated, torch.bool)
        truncated_t = self._to_torch(truncated, torch.bool)
        info: dict[str, Any] = {
            # PERF: where no env ended, final_obs is obs itself (the same tensor), not a second 28 KB-per-env copy.
            "final_obs": obs_t if final_obs is None else self._to_torch(final_obs, torch.uint8),
            "physics_reset": self._no_physics_reset.clone(),
            "lives": self._to_torch(lives, torch.int64),
        }
        self._tracker.update(reward_t, terminated_t | truncated_t, info)
        # For reset(env_mask=...): the rows of the envs it does not reset. A reference, not a 28 KB-per-env copy per
        # step (the caller owns this fresh tensor; frames are not modified in place by any client we know of).
        self._last_obs_t = obs_t
        return StepResult(obs_t, reward_t, terminated_t, truncated_t, info)

    _last_obs_t: torch.Tensor | None = None

    def _partial_output(
        self, env_mask: torch.Tensor, ids: np.ndarray, reset_obs: np.ndarray, lives: np.ndarray
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The result of ``reset(env_mask=...)``: the last obs with rows ``ids`` replaced by ``reset_obs``."""
        obs = self._last_obs_t.clone()
        if ids.size:
            obs[torch.as_tensor(ids, dtype=torch.int64, device=self.device)] = self._to_torch(reset_obs, torch.uint8)
            self._tracker.reset(env_mask)
        self._last_obs_t = obs
        return obs.clone(), {"lives": self._to_torch(lives, torch.int64)}
