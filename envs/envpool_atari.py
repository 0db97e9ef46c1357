"""``envpool`` backend for Atari games (``make("Pong-v5", 16, backend="envpool")``) on EnvPool's C++ threads.

It owns one EnvPool Atari pool (sync mode) and converts it to the shared Atari semantics of ``envs.atari``:
EnvPool resets an env on the step *after* ``done`` (discarding that step's action); here the ended envs are reset
with ``pool.reset(env_ids)`` in the same call, as ``envpool_env.py`` does for MuJoCo. Life losses are detected from
``info["lives"]`` (EnvPool's own ``episodic_life`` resets differently from ale-py's). It does not touch MuJoCo tasks.
"""

from __future__ import annotations

from typing import Any

import envpool
import numpy as np
import torch

from .atari import FRAME_SHAPE, STACK_NUM, AtariEnvBase, check_options, game_name  # noqa: F401 (check_options: the config check looks it up here)
from .base import EnvError, StepResult


class EnvPoolAtariEnv(AtariEnvBase):
    """``num_envs`` copies of an Atari game on EnvPool (sync: ``batch_size == num_envs``).

    Args:
        name: ``"<Game>-v5"`` (see ``envs.atari``); EnvPool lacks 4 of ale-py's games (use ``backend="ale"``).
        num_envs: number of envs.
        device: where returned tensors live (emulation runs on EnvPool's CPU threads).
        seed: EnvPool seeds env i with ``seed + i`` (no-op starts and sticky actions).
        options: ``envs.atari.ATARI_OPTIONS`` and ``BACKEND_OPTIONS``.
    """

    backend = "envpool"

    def __init__(self, name: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0, **options: Any):
        self._pool: Any = None
        self._init_task(name, num_envs, device, options)
        task_id = game_name(self.rom)
        if task_id not in envpool.list_all_envs():
            raise EnvError(f"EnvPool {envpool.__version__} has no Atari game {task_id!r}; use backend='ale' for it")
        o = self.options
        self._task_id = task_id
        self._kwargs = {
            "max_episode_steps": o["max_episode_steps"],
            "frame_skip": o["frame_skip"],
            # EnvPool draws U{0..noop_max-1} + 1 no-op frames (noop_max=0 is undefined there); with FIRE reset
            # the last of them is the FIRE press, so noop_max=1 means "FIRE only" in FIRE games, as ale-py's 0.
            "noop_max": max(o["noop_max"], 1),
            "repeat_action_probability": float(o["repeat_action_probability"]),
            "full_action_space": o["full_action_space"],
            "use_fire_reset": o["fire_reset"],
            # Life losses are detected here instead: EnvPool's own episodic_life does no-ops + FIRE after a lost
            # life and its explicit reset restarts the whole game, neither of which ale-py does.
            "episodic_life": False,
            "reward_clip": False,  # the env reports the raw game score; clipping is a learner option
            "stack_num": STACK_NUM,
            "img_height": FRAME_SHAPE[0],
            "img_width": FRAME_SHAPE[1],
            "gray_scale": True,
            "use_inter_area_resize": True,  # cv::INTER_AREA, as ale-py
        }
        self._pool_seed: int | None = None
        self._fresh = False
        self._build_pool(seed)
        self._set_num_actions(self._pool.action_space.n)
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._needs_reset = True

    def _build_pool(self, seed: int) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._pool = envpool.make(
            self._task_id,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.num_envs,  # sync mode: rows always in env-id order (async does not fit send/recv)
            num_threads=self.num_threads,
            thread_affinity_offset=self.options["thread_affinity_offset"],
            seed=seed,
            **self._kwargs,
        )
        self._pool_seed = seed
        self._fresh = True

    # ----- backend hooks --------------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is not None and not (self._fresh and seed == self._pool_seed):
            self._build_pool(seed)  # EnvPool seeds only at construction
        self._fresh = False
        obs, info = self._pool.reset(self._all_ids)  # SYNC: waits for EnvPool's threads
        self._lives[:] = info["lives"]
        self._tracker.reset()
        self._needs_reset = False
        self._last_obs_t = self._to_torch(obs, torch.uint8)
        return self._last_obs_t.clone(), {"lives": self._to_torch(self._lives, torch.int64)}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        # EnvPool resets envs by id (each has its own seed and emulator); the others are untouched.
        ids = np.flatnonzero(env_mask.cpu().numpy()).astype(np.int32)
        fresh = np.zeros((0, *self.observation_spec.shape), dtype=np.uint8)
        if ids.size:
            self._fresh = False
            reset_obs, info = self._pool.reset(ids)  # SYNC
            order = np.asarray(info["env_id"], dtype=np.int64)
            fresh = np.array(reset_obs, copy=True)
            ids = order
            self._lives[order] = info["lives"]
        return self._partial_output(env_mask, ids, fresh, self._lives)

    def _send(self, actions: torch.Tensor) -> None:
        host = self._send_actions(actions, np.int32)
        self._fresh = False
        # PERF: returns once EnvPool has queued the actions; its threads emulate while the caller works.
        self._pool.send(host, self._all_ids)

    def _recv(self, actions: torch.Tensor) -> StepResult:
        obs, reward, term, trunc, info = self._pool.recv()  # SYNC: waits for EnvPool's threads (it has no timeout)
        if not np.array_equal(info["env_id"], self._all_ids):
            raise EnvError(f"envpool returned rows for envs {info['env_id'][:8]}...; expected env-id order")
        lives = np.asarray(info["lives"], dtype=np.int64)
        # EnvPool marks a game over that coincides with the time limit as truncated only; info["terminated"] is
        # the game-over flag itself. Terminated wins (the contract), and then the step is not also truncated.
        terminated = term | info["terminated"].astype(bool)
        if self.episodic_life:
            terminated |= (lives < self._lives) & (lives > 0)  # ale-py's life-loss test, per agent step
        truncated = trunc & ~terminated
        reset_rows = term | trunc  # EnvPool's own done: game over or time limit (never a mere lost life)
        reward = np.array(reward, dtype=np.float32)  # copied: the reset below may reuse EnvPool's arrays
        final_obs = None
        if reset_rows.any():
            # Same-step reset, so EnvPool's reset-on-next-step never discards an action.
            final_obs = np.array(obs, copy=True)
            obs = final_obs.copy()
            done_ids = np.flatnonzero(reset_rows).astype(np.int32)
            reset_obs, reset_info = self._pool.reset(done_ids)  # SYNC: one extra round trip on steps with a reset
            obs[reset_info["env_id"]] = reset_obs
            lives[reset_info["env_id"]] = reset_info["lives"]
        self._lives = lives
        return self._output(obs, reward, terminated, truncated, final_obs, lives)

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
