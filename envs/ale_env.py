"""``ale`` backend: Atari games on ale-py's ``AtariVectorEnv`` (C++ threads), ``make("Pong-v5", 16, backend="ale")``.

It owns one ``AtariVectorEnv`` in sync mode (one ``send`` of all N actions, then one ``recv``: ale-py's documented
protocol) with ale-py's same-step autoreset (its PR #614, May 2025; tested with 0.12.1), whose ``final_obs`` is our
convention. Two details are aligned with EnvPool (docs/envs_backends.md): a game's first stack repeats its first
frame instead of zero padding, and a lost life is reported through ``life_loss_info``. It owns no task definition.
For videos, ``rgb_frames=True`` steps a twin pool with the same seeds and actions that returns the full RGB screen
(``render_rgb``): ale-py's vector interface exposes no emulator screen of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode

from .atari import FRAME_SHAPE, STACK_NUM, AtariEnvBase, check_options  # noqa: F401 (the config check looks it up here)
from .base import EnvError, StepResult

#: The Atari screen, rows x columns.
_SCREEN = (210, 160)


def _pad_stack(frames: np.ndarray, rows: np.ndarray, steps: np.ndarray) -> None:
    """In place: rows ``rows`` of ``frames`` ``[N, STACK, H, W]``, ``steps[k]`` agent steps into their game, get
    their zero-padded oldest frames replaced by the oldest real one (EnvPool's and gymnasium's FrameStack padding).

    ale-py clears its stack to zeros at each game reset, so after ``s < STACK - 1`` steps the first
    ``STACK - 1 - s`` frames are black; EnvPool fills the stack with the first frame instead.
    """
    for row, s in zip(rows.tolist(), steps.tolist(), strict=True):
        first = STACK_NUM - 1 - s
        frames[row, :first] = frames[row, first]


class AleEnv(AtariEnvBase):
    """``num_envs`` copies of an Atari game on ``ale_py.vector_env.AtariVectorEnv``.

    Args:
        name: ``"<Game>-v5"`` (see ``envs.atari``).
        num_envs: number of envs.
        device: where returned tensors live (emulation runs on ale-py's CPU threads).
        seed: the first ``reset()`` seeds env i with ``seed + i`` (ROM reload, no-op starts and sticky actions).
        rgb_frames: also keep the RGB screen of every env's newest frame for ``render_rgb`` (eval's videos): a twin
            pool, seeded and stepped like the first, emulates each game a second time (about doubling the cost).
        options: ``envs.atari.ATARI_OPTIONS`` and ``BACKEND_OPTIONS``.
    """

    backend = "ale"

    def __init__(
        self,
        name: str,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        rgb_frames: bool = False,
        **options: Any,
    ):
        self._pool: Any = None
        self._rgb_pool: Any = None
        self._rgb: np.ndarray | None = None
        self._init_task(name, num_envs, device, options)
        o = self.options
        pool_kwargs = dict(
            game=self.rom,
            num_envs=num_envs,
            batch_size=0,  # == num_envs: sync mode, results in env-id order
            num_threads=self.num_threads,
            thread_affinity_offset=o["thread_affinity_offset"],
            # ale-py caps frames, EnvPool agent steps; the same cap in agent steps on both.
            max_num_frames_per_episode=o["max_episode_steps"] * o["frame_skip"],
            repeat_action_probability=float(o["repeat_action_probability"]),
            full_action_space=o["full_action_space"],
            autoreset_mode=AutoresetMode.SAME_STEP,
            img_height=FRAME_SHAPE[0],
            img_width=FRAME_SHAPE[1],
            grayscale=True,
            stack_num=STACK_NUM,
            frameskip=o["frame_skip"],
            maxpool=True,
            noop_max=o["noop_max"],
            # ale-py's episodic_life restarts the whole game after a lost life; life_loss_info reports the loss
            # as terminated and lets the game go on, which is what EnvPool-style episodic life means.
            episodic_life=False,
            life_loss_info=o["episodic_life"],
            reward_clipping=False,  # the env reports the raw game score; clipping is a learner option
            use_fire_reset=o["fire_reset"],
        )
        self._pool = AtariVectorEnv(**pool_kwargs)
        if rgb_frames:
            # The same emulation (seeds, sticky actions, no-ops and frame skip are the pool's own, so the twin
            # follows the first frame for frame); only its observation differs: the last frame of each step, in
            # colour, at the screen's own 210x160, unpooled and unstacked.
            screen = dict(img_height=_SCREEN[0], img_width=_SCREEN[1], grayscale=False, stack_num=1, maxpool=False)
            self._rgb_pool = AtariVectorEnv(**{**pool_kwargs, **screen})
        self._set_num_actions(self._pool.single_action_space.n)
        self._seed = seed
        self._seed_next_reset = True
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._steps = np.zeros(num_envs, dtype=np.int64)  # agent steps since each env's game reset
        self._frames = np.zeros(num_envs, dtype=np.int64)  # ale-py's episode frame number at the last step
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._needs_reset = True

    # ----- backend hooks --------------------------------------------------------------------------------------
    def _reset(self, seed: int | None) -> tuple[torch.Tensor, dict[str, Any]]:
        if seed is not None:
            self._seed, self._seed_next_reset = seed, True
        # The first reset (and reset(seed)) seeds env i with seed + i; a plain reset() continues each env's RNG.
        reset_seed = self._seed if self._seed_next_reset else None
        obs, info = self._pool.reset(seed=reset_seed)  # SYNC
        if self._rgb_pool is not None:
            self._rgb = self._rgb_pool.reset(seed=reset_seed)[0][:, 0]
        self._seed_next_reset = False
        obs = np.array(obs, copy=True)
        obs[:, : STACK_NUM - 1] = obs[:, STACK_NUM - 1 : STACK_NUM]  # every env is 0 steps into its game
        self._steps[:] = 0
        self._frames[:] = info["episode_frame_number"]
        self._lives[:] = info["lives"]
        self._tracker.reset()
        self._needs_reset = False
        self._last_obs_t = self._to_torch(obs, torch.uint8)
        return self._last_obs_t.clone(), {"lives": self._to_torch(self._lives, torch.int64)}

    def _reset_envs(self, env_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        # ale-py's own partial reset (reset_mask; each chosen env continues its RNG); the others are untouched.
        mask = env_mask.cpu().numpy()
        ids = np.flatnonzero(mask)
        if ids.size:
            obs, info = self._pool.reset(options={"reset_mask": mask})  # SYNC
            if self._rgb_pool is not None:
                rgb = self._rgb_pool.reset(options={"reset_mask": mask})[0][:, 0]
                self._rgb[ids] = rgb[ids]
            fresh = np.array(obs[ids], copy=True)
            fresh[:, : STACK_NUM - 1] = fresh[:, STACK_NUM - 1 : STACK_NUM]  # 0 steps into their games
            self._steps[ids] = 0
            self._frames[ids] = info["episode_frame_number"][ids]
            self._lives[ids] = info["lives"][ids]
        else:
            fresh = np.zeros((0, *self.observation_spec.shape), dtype=np.uint8)
        return self._partial_output(env_mask, ids, fresh, self._lives)

    def _send(self, actions: torch.Tensor) -> None:
        host = self._send_actions(actions, np.int64)
        # PERF: returns once ale-py's threads have the actions.
        self._pool.send(host)
        if self._rgb_pool is not None:
            self._rgb_pool.send(host)

    def _recv(self, actions: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, info = self._pool.recv()  # SYNC: ale-py's recv has no timeout
        if self._rgb_pool is not None:
            rgb, rgb_reward, *_, rgb_info = self._rgb_pool.recv()
            if not (np.array_equal(rgb_reward, reward) and np.array_equal(rgb_info["lives"], info["lives"])):
                raise EnvError("the RGB twin pool diverged from the game (another reward or lives count)")
            self._rgb = rgb[:, 0]
        if not np.array_equal(info["env_id"], self._all_ids):
            raise EnvError(f"ale-py returned rows for envs {info['env_id'][:8]}...; expected env-id order")
        lives = np.asarray(info["lives"], dtype=np.int64)
        frames = np.asarray(info["episode_frame_number"], dtype=np.int64)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        # Which rows did ale-py reset? Truncated and game-over rows; but with life_loss_info a lost life is also
        # `terminated` and is not reset. A lost life continues the game: exactly frame_skip more frames, fewer
        # lives but not 0; a reset row restarts the frame count and the lives (a coincidence of all three would
        # need a reset with more no-op frames than the whole previous game had and fewer starting lives).
        reset_rows = truncated | terminated
        if self.episodic_life:
            life_lost = (frames == self._frames + self.frame_skip) & (lives < self._lives) & (lives > 0)
            reset_rows &= ~life_lost
        steps = self._steps + 1
        obs = np.array(obs, copy=True)
        final_obs = None
        if reset_rows.any():
            final_obs = obs.copy()
            final_obs[reset_rows] = info["final_obs"][reset_rows]
            steps[reset_rows] = 0
        pad = np.flatnonzero(steps < STACK_NUM - 1)
        if pad.size:
            _pad_stack(obs, pad, steps[pad])
        if final_obs is not None:
            # The ended games' last stacks, padded by the steps they had reached.
            ended = np.flatnonzero(reset_rows & (self._steps + 1 < STACK_NUM - 1))
            if ended.size:
                _pad_stack(final_obs, ended, self._steps[ended] + 1)
            keep = ~reset_rows
            final_obs[keep] = obs[keep]
        self._steps, self._frames, self._lives = steps, frames, lives
        return self._output(obs, np.asarray(reward, dtype=np.float32), terminated, truncated, final_obs, lives)

    def render_rgb(self) -> np.ndarray:
        """The RGB screen ``[N, 210, 160, 3]`` uint8 of each env's newest frame (after the last step or reset; where
        a game ended that step, its next game's first frame). Needs ``rgb_frames=True``."""
        if self._rgb_pool is None:
            raise EnvError("render_rgb() needs the env built with rgb_frames=True (make(..., backend='ale', "
                           "rgb_frames=True))")  # fmt: skip
        if self._rgb is None:
            raise EnvError(f"call reset() before render_rgb() on {self!r}")
        return self._rgb.copy()  # the pool reuses its array

    def _close(self) -> None:
        if self._rgb_pool is not None:
            self._rgb_pool.close()
            self._rgb_pool = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None  # the last reference: its destructor stops and joins ale-py's threads
