"""``python -m sample_fast.eval``: mean return of deterministic episodes and an mp4 of a MuJoCo episode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from sample_fast import eval as eval_mod
from sample_fast.checkpoint import CheckpointManager
from sample_fast.config import resolve
from sample_fast.train import write_run_files
from sample_fast.wiring import build_policy, probe_specs


def _fresh_run(rdir: Path, *overrides: str) -> None:
    """A run directory holding a freshly initialised policy as its best checkpoint (no training needed)."""
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        cfg = resolve(compose("train", overrides=[*overrides, f"run.dir={rdir}"]))
    write_run_files(cfg, str(rdir), 0)
    torch.manual_seed(0)
    policy = build_policy(*probe_specs(cfg.env), cfg.policy)
    CheckpointManager(rdir).save({"policy": policy.state_dict(), "env_steps": 0}, env_steps=0, metric=0.0)


def _mean_return(out: str) -> float:
    m = re.search(r"mean return over (\d+) deterministic episodes: (-?[\d.]+)", out)
    assert m, out
    return float(m.group(2))


@pytest.mark.timeout(60)
def test_eval_toy_mean_return_of_initial_policy(tmp_path, capsys):
    _fresh_run(tmp_path, "env=toy")
    assert eval_mod.main([str(tmp_path), "--episodes", "8"]) == 0
    out, err = capsys.readouterr()
    # The initial actor's output layer has gain 0.01, so the deterministic action is ~0. Reward per step is then
    # 1 - mean(target^2) with target ~ U[-1, 1]^2: E = 1 - 1/3 = 2/3, so 16 steps give 32/3 = 10.67. The sd of a
    # mean over 8 episodes is ~0.3 (var(t^2) = 1/5 - 1/9 = 4/45 per dim), so 1.5 is five sd.
    assert abs(_mean_return(out) - 32 / 3) < 1.5
    assert "no video" in err and "needs a MuJoCo env" in err  # toy has nothing to render; eval still succeeds


@pytest.mark.timeout(180)
def test_eval_hopper_writes_a_playable_mp4(tmp_path, capsys):
    import imageio.v2 as imageio

    rdir = tmp_path / "run"
    _fresh_run(rdir, "env=hopper")
    video = tmp_path / "videos" / "hopper.mp4"
    rc = eval_mod.main([str(rdir), "--episodes", "2", "--video", str(video), "--video-steps", "25"])
    assert rc == 0
    out, _ = capsys.readouterr()
    assert _mean_return(out) > 0  # hopper pays healthy_reward 1 per step while it stands
    m = re.search(r"video: .* \((\d+) frames", out)
    assert m and 1 <= int(m.group(1)) <= 25
    assert video.stat().st_size > 5_000
    reader = imageio.get_reader(str(video))
    try:
        frame = reader.get_data(0)
    finally:
        reader.close()
    assert frame.shape == (480, 480, 3) and frame.std() > 5  # a rendered scene, not a blank frame


def test_eval_without_checkpoint_says_so(tmp_path, capsys):
    assert eval_mod.main([str(tmp_path)]) == 2
    assert "config.yaml not found" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_eval_pong_plays_the_game_and_writes_an_rgb_mp4(tmp_path, capsys):
    """An Atari run: the mean return is Pong's raw score (an untrained policy loses: -21..-10 in a game to 21), and
    the video holds the RGB screen (210x160, upscaled 2x), in colour."""
    import imageio.v2 as imageio

    rdir = tmp_path / "run"
    _fresh_run(rdir, "env=pong", "env.num_envs=2")
    video = tmp_path / "pong.mp4"
    rc = eval_mod.main([str(rdir), "--episodes", "1", "--video", str(video), "--video-steps", "40"])
    assert rc == 0
    out, _ = capsys.readouterr()
    assert -21 <= _mean_return(out) <= -10
    m = re.search(r"video: .* \((\d+) frames, episode return (-?[\d.]+)\)", out)
    assert m and int(m.group(1)) == 40  # a Pong game is far longer than 40 agent steps
    reader = imageio.get_reader(str(video))
    try:
        assert reader.get_meta_data()["fps"] == 15  # 60 frames/s at frame skip 4
        frame = reader.get_data(0)
        num_frames = reader.count_frames()
    finally:
        reader.close()
    assert frame.shape == (420, 320, 3) and num_frames == 40
    # colour, not grey: Pong's brown field, its orange and green paddles (the channels differ)
    assert abs(float(frame[..., 0].mean()) - float(frame[..., 2].mean())) > 20
