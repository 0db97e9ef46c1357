"""``python -m sample_fast.eval <run_dir>``: evaluate a trained policy and record a video of it.

Loads ``<run_dir>/config.yaml`` and the best checkpoint (the newest one when no best was recorded), runs N
deterministic episodes (one per env, in parallel, on the CPU simulator), prints their mean return, and writes an mp4
of one episode: MuJoCo envs rendered offscreen with ``mujoco.Renderer``, Atari games from the emulator's RGB screen
(the ``ale`` backend's ``render_rgb``, whichever backend trained: both play the same game). Rendering is headless:
``MUJOCO_GL=egl`` is the default here; ``MUJOCO_GL=osmesa`` needs ``apt-get install libosmesa6``. It owns no state
beyond the files it writes.
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # must be set before mujoco is imported anywhere

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from .config import TrainConfig  # noqa: E402
from .recurrent import StatefulActor  # noqa: E402

VIDEO_NAME = "eval.mp4"
#: Default cap of an Atari video, in agent steps: 5 minutes at the game's 15 agent steps per second (60 frames/s,
#: frame skip 4); a full 27,000-step episode would be half an hour.
ATARI_VIDEO_STEPS = 4500
#: Atari frames are upscaled by this (nearest neighbour) for the video: 210x160 -> 420x320.
ATARI_VIDEO_SCALE = 2


def load_run(run_dir: str, which: str = "best") -> tuple[TrainConfig, Any, dict, str]:
    """The run's config, a policy with the checkpoint's weights (eval mode, CPU), its state and checkpoint path."""
    from .checkpoint import CheckpointManager
    from .wiring import build_policy, on_cpu_simulator, probe_specs

    cfg_path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{cfg_path} not found: is {run_dir} a run directory of sample_fast.train?")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(cfg_path)))
    manager = CheckpointManager(run_dir)
    loaded = manager.load_best() if which == "best" else None
    if loaded is None:
        loaded = manager.load_latest()
    if loaded is None:
        raise FileNotFoundError(f"no readable checkpoint in {run_dir}/checkpoints; train first")
    state, path = loaded
    # evaluate on the CPU simulator: the policy is small and one episode per env needs no GPU
    cfg.env = on_cpu_simulator(cfg.env)  # an mjx run's MJX-only options are left out
    obs_spec, act_spec = probe_specs(cfg.env)
    policy = build_policy(obs_spec, act_spec, cfg.policy)
    policy.load_state_dict(state["policy"])
    policy.eval()
    return cfg, policy, state, str(path)


@torch.no_grad()
def evaluate(cfg: TrainConfig, policy, num_episodes: int, seed: int = 12345) -> list[float]:
    """Returns of ``num_episodes`` deterministic episodes, one per env (each env's first episode)."""
    from .wiring import build_env

    env = build_env(dataclasses.replace(cfg.env, num_threads=1), num_envs=num_episodes, seed=seed)
    try:
        obs, _ = env.reset(seed=seed)
        returns = torch.full((num_episodes,), math.nan)
        limit = (env.max_episode_steps or 10_000) + 1
        actor = StatefulActor(policy, num_episodes)  # carries a recurrent policy's state
        for _ in range(limit):
            actions = actor.act(obs)
            obs, reward, terminated, truncated, info = env.step(actions)
            actor.observe(reward, terminated, truncated, info)
            done = (terminated | truncated) & returns.isnan()
            returns[done] = info["episode_return"][done].float().cpu()
            if not returns.isnan().any():
                break
        return returns[~returns.isnan()].tolist()
    finally:
        env.close()


@torch.no_grad()
def record_video(
    cfg: TrainConfig,
    policy,
    path: str,
    max_steps: int | None = None,
    width: int = 480,
    height: int = 480,
    seed: int = 12345,
) -> tuple[str, int, float]:
    """Render one deterministic episode (at most ``max_steps`` steps) to an mp4. Returns (path, frames, return)."""
    import imageio.v2 as imageio

    from .envs.atari import is_atari_name

    if is_atari_name(cfg.env.name):
        return record_atari_video(cfg, policy, path, max_steps=max_steps, seed=seed)
    import mujoco

    from .wiring import build_env

    env = build_env(dataclasses.replace(cfg.env, num_threads=1), num_envs=1, seed=seed)
    if not hasattr(env, "model") or not hasattr(env, "datas"):
        env.close()
        raise ValueError(f"video needs a MuJoCo env (backend mujoco); {cfg.env.name!r} runs on {env.backend!r}")
    renderer = None
    writer = None
    try:
        renderer = mujoco.Renderer(env.model, height=height, width=width)
        camera = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(env.model, camera)
        camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING  # follow the torso
        camera.trackbodyid = 1
        camera.distance = 3.5  # metres: frames the 1-2 m robots of the MuJoCo tasks (stat.extent counts the floor)
        camera.elevation = -20.0
        fps = max(1, round(1.0 / env.dt)) if env.dt else 30
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        writer = imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=16)

        def screen():
            renderer.update_scene(env.datas[0], camera=camera)
            return renderer.render()

        frames, total = _play_recorded(env, policy, writer, screen, max_steps or env.max_episode_steps or 1000, seed)
        return path, frames, total
    finally:
        if writer is not None:
            writer.close()
        if renderer is not None:
            renderer.close()
        env.close()


def _play_recorded(env, policy, writer, screen, limit: int, seed: int) -> tuple[int, float]:
    """Play one deterministic episode of env copy 0 (at most ``limit`` steps), appending ``screen()`` to ``writer``
    before each step. Returns (frames, return). Stops at the first ``terminated`` or ``truncated``: the env has
    already reset that copy, so the next frame would belong to a new episode."""
    obs, _ = env.reset(seed=seed)
    frames, total = 0, 0.0
    actor = StatefulActor(policy, 1)
    for _ in range(limit):
        writer.append_data(screen())
        frames += 1
        obs, reward, terminated, truncated, info = env.step(actor.act(obs))
        actor.observe(reward, terminated, truncated, info)
        total += float(reward[0])
        if bool(terminated[0] | truncated[0]):
            break
    return frames, total


@torch.no_grad()
def record_atari_video(
    cfg: TrainConfig, policy, path: str, max_steps: int | None = None, seed: int = 12345
) -> tuple[str, int, float]:
    """One deterministic episode of an Atari game (at most ``max_steps`` agent steps, default
    ``ATARI_VIDEO_STEPS``) as an mp4 of the RGB screen at the game's own speed. Returns (path, frames, return):
    the return is the raw game score. The policy sees the same [4, 84, 84] frames as in training: the ``ale``
    backend, whose preprocessing EnvPool's matches bit for bit (docs/envs_backends.md)."""
    import imageio.v2 as imageio

    from .envs import make

    options = {k: v for k, v in cfg.env.options.items() if k != "num_threads"}
    env = make(cfg.env.name, 1, backend="ale", seed=seed, rgb_frames=True, num_threads=1, **options)
    writer = None
    try:
        fps = 60 / env.frame_skip  # the console runs at 60 frames/s
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # 420x320: both sides divide by 4, so ffmpeg keeps the size (macro blocks) and yuv420p gets even sides
        writer = imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=4)

        def screen():
            return env.render_rgb()[0].repeat(ATARI_VIDEO_SCALE, axis=0).repeat(ATARI_VIDEO_SCALE, axis=1)

        frames, total = _play_recorded(env, policy, writer, screen, max_steps or ATARI_VIDEO_STEPS, seed)
        return path, frames, total
    finally:
        if writer is not None:
            writer.close()
        env.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sample_fast.eval", description="Evaluate a run's best checkpoint and record an mp4."
    )
    parser.add_argument("run_dir", help="a run directory written by python -m sample_fast.train")
    parser.add_argument("--episodes", type=int, default=10, help="deterministic episodes to average (default 10)")
    parser.add_argument("--video", default=None, help=f"mp4 path (default <run_dir>/{VIDEO_NAME})")
    parser.add_argument("--no-video", action="store_true", help="skip the video")
    parser.add_argument("--video-steps", type=int, default=None,
                        help=f"cap the video at this many env steps (Atari default: {ATARI_VIDEO_STEPS})")  # fmt: skip
    parser.add_argument("--checkpoint", choices=("best", "latest"), default="best", help="which checkpoint to load")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the evaluation episodes")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    torch.set_num_threads(1)
    try:
        cfg, policy, state, ckpt_path = load_run(args.run_dir, args.checkpoint)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{ckpt_path}: trained for {int(state.get('env_steps', 0))} env steps on {cfg.env.name}")
    returns = evaluate(cfg, policy, args.episodes, seed=args.seed)
    mean = sum(returns) / len(returns) if returns else math.nan
    print(f"mean return over {len(returns)} deterministic episodes: {mean:.2f}")
    if not args.no_video:
        path = args.video or os.path.join(args.run_dir, VIDEO_NAME)
        try:
            path, frames, total = record_video(cfg, policy, path, max_steps=args.video_steps, seed=args.seed)
        except ValueError as e:
            print(f"no video: {e}", file=sys.stderr)
        else:
            print(f"video: {path} ({frames} frames, episode return {total:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
