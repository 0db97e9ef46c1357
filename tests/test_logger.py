"""Tests of ``sample_fast.logger``: the terminal progress line shows the metrics the learner actually emits."""

from __future__ import annotations

import torch
from sample_fast.envs import Spec

from sample_fast.config import LogConfig
from sample_fast.learner import Learner, LearnerConfig
from sample_fast.logger import ProgressLogger
from sample_fast.policy import ActorCritic, PolicyConfig

OBS = Spec(shape=(3,), dtype=torch.float32)
ACT = Spec(shape=(2,), dtype=torch.float32, low=-torch.ones(2), high=torch.ones(2))


def _learner_metrics() -> dict[str, float]:
    """The metrics of one real ``Learner.train`` call on a random on-policy batch (T=4, N=3)."""
    torch.manual_seed(0)
    policy = ActorCritic(OBS, ACT, PolicyConfig(hidden_sizes=[8]))
    learner = Learner(policy, LearnerConfig(num_epochs=1, num_minibatches=1))
    obs = torch.randn(5, 3, 3)  # [T + 1, B, 3]: row T is the bootstrap observation (the slot layout)
    actions, behavior_logp, _ = policy.act(obs[:-1].reshape(-1, 3))
    batch = {
        "obs": obs,
        "actions": actions.reshape(4, 3, 2),
        "behavior_logp": behavior_logp.reshape(4, 3),
        "rewards": torch.randn(4, 3),
        "terminated": torch.zeros(4, 3, dtype=torch.bool),
        "truncated": torch.zeros(4, 3, dtype=torch.bool),
        "policy_version": torch.zeros(4, 3, dtype=torch.int64),
        # the side table of truncated steps' final observations: empty (nothing truncated)
        "final_obs": torch.zeros(0, 3),
        "final_step_idx": torch.zeros(0, dtype=torch.int64),
        "final_env_idx": torch.zeros(0, dtype=torch.int64),
        "final_count": torch.tensor(0),
    }
    return learner.train(batch)


def test_terminal_line_shows_the_learners_kl(tmp_path, capsys):
    metrics = _learner_metrics()
    assert "kl" in metrics  # the name the learner emits (Learner.train), not losses.approx_kl's
    metrics["kl"] = 0.0123  # a value whose formatting is known: _fmt gives 3 significant digits
    metrics["entropy"] = 2.5
    cfg = LogConfig(progress="plain", tensorboard=False, csv=False, plot=False)
    logger = ProgressLogger(str(tmp_path), cfg, total_env_steps=100)
    logger.add_train(12, metrics)
    logger.write_row(12)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    parts = line.split("  ")
    assert "kl 0.0123" in parts and "entropy 2.5" in parts, line
    assert any(p.startswith("policy_loss ") for p in parts) and any(p.startswith("value_loss ") for p in parts)
    logger.close(None)
