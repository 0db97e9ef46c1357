"""The trainer's config errors from the command line (exit status 2, one line, no traceback, nothing written), and
the spec probe of an mjx run with MJX-only options (the MuJoCo C probe must not receive them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest
from hydra import compose, initialize_config_module

from sample_fast.config import resolve
from sample_fast.wiring import probe_specs

PYTHON = sys.executable


def _train_cli(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "sample_fast.train", *overrides, f"run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["env=ant", "env.backend=envpool", "+env.options.contacts=feet"],
            "config error: env.options.contacts='feet' is not supported by the envpool backend for 'ant'",
        ),
        (
            ["env=ant", "env.backend=mujoco", "+env.options.xla_opt_level=0"],
            "xla_opt_level is an option of the mjx backend: use env.backend=mjx",
        ),
    ],
)
def test_cli_backend_option_error_exits_2_before_writing(tmp_path, overrides, message):
    proc = _train_cli(tmp_path, *overrides)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("config error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
    assert list(tmp_path.iterdir()) == []  # no run dir, no hydra outputs/


def test_eval_of_an_mjx_run_with_mjx_options(tmp_path, capsys):
    """``sample_fast.eval`` runs an mjx run's policy on MuJoCo C: the MJX-only options must be left out there too."""
    from sample_fast import eval as eval_mod
    from sample_fast.checkpoint import CheckpointManager
    from sample_fast.train import write_run_files
    from sample_fast.wiring import build_policy

    rdir = tmp_path / "run"
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        raw = compose("train", overrides=["env=hopper", "env.backend=mjx", "+env.options.xla_opt_level=0",
                                          "+env.options.max_episode_steps=5", f"run.dir={rdir}"])  # fmt: skip
    cfg = resolve(raw, num_cores=2, cuda=False)
    write_run_files(cfg, str(rdir), 0)
    policy = build_policy(*probe_specs(cfg.env), cfg.policy)
    CheckpointManager(rdir).save({"policy": policy.state_dict(), "env_steps": 0}, env_steps=0, metric=0.0)
    assert eval_mod.main([str(rdir), "--episodes", "2"]) == 0
    assert "mean return over 2 deterministic episodes" in capsys.readouterr().out


def test_mjx_probe_leaves_out_mjx_only_options():
    """An mjx config with MJX options probes its specs on MuJoCo C (no JAX compile); the task option still applies.
    Reference: gymnasium's HalfCheetah-v5 with the same task option (18-dim observation with the x position)."""
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        raw = compose(
            "train",
            overrides=[
                "env=halfcheetah",
                "env.backend=mjx",
                "+env.options.xla_opt_level=0",
                "+env.options.solver=cg",
                "+env.options.precision=float32",
                "+env.options.exclude_current_positions_from_observation=false",
            ],
        )
    cfg = resolve(raw, num_cores=2, cuda=False)
    obs_spec, act_spec = probe_specs(cfg.env)
    ref = gymnasium.make("HalfCheetah-v5", exclude_current_positions_from_observation=False)
    try:
        assert tuple(obs_spec.shape) == ref.observation_space.shape == (18,)
        assert tuple(act_spec.shape) == ref.action_space.shape
    finally:
        ref.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("mjx-halfcheetah")  # on the worker that compiles test_env_mjx's cheetah program
def test_mjx_run_with_mjx_options_trains(tmp_path):
    """End to end: an mjx run with MJX-only options starts (spec probe included), trains and checkpoints.

    Its splits are test_env_mjx's ``cheetah`` env (4 envs, 25-step episodes, the same MJX-only options, among them
    the same persistent XLA cache), so a suite run compiles that program once (the probe of other MJX-only options,
    solver among them, is ``test_mjx_probe_leaves_out_mjx_only_options``)."""
    cache = Path(__file__).resolve().parent.parent / ".pytest_cache" / "mjx-xla"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "sample_fast.train",
            "env=halfcheetah",
            "env.backend=mjx",
            "env.device=cpu",
            "env.num_envs=8",
            "+env.options.xla_opt_level=0",
            "+env.options.max_episode_steps=25",
            f"+env.options.compilation_cache_dir={cache}",
            "sampler=short",
            "learner.num_minibatches=1",
            "run.mode=serial",
            "run.total_env_steps=128",  # 2 batches of 16 steps x 4 envs (one of the 2 splits)
            "logging.progress=plain",
            "logging.tensorboard=false",
            "logging.plot=false",
            f"run.dir={tmp_path / 'r'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "r" / "checkpoints").glob("ckpt_*.pt")), proc.stderr[-3000:]
