"""A CleanRL-style PPO on EnvPool Atari: the single-file peer of ``env=pong`` (issue 15).

Written after CleanRL's ``ppo_atari_envpool.py`` (Huang et al. 2022, "The 37 implementation details of PPO"):
EnvPool's own Atari preprocessing (84x84 gray, 4 stacked frames, frame skip 4, up to 30 no-ops, episodic life and
reward clipping as CleanRL sets them), the Nature CNN, GAE, clipped PPO with 4 epochs of 4 minibatches, linearly
annealed Adam at 2.5e-4. Nothing here is sample_fast's: it only needs torch, numpy and envpool, so it measures what a
user would get from the well-known baseline on this machine.

It prints one line per update (``update U global_step S sps N``) and writes a CSV of finished games with their
unclipped score (``wall_s,global_step,score,length``) and one of updates (``wall_s,global_step,sps``), so the same
script serves the FPS suite's ``cleanrl_ppo`` peer (a bounded run, SPS windows) and a learning race (time to a mean
score). Stops at ``--total-timesteps`` or ``--time-limit-s``, whichever comes first, and on SIGTERM / Ctrl-C.

    .venv/bin/python benchmarks/cleanrl_ppo_atari.py --env-id Pong-v5 --total-timesteps 10000000 --out-dir runs/cleanrl
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import time
from collections import deque

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-id", default="Pong-v5")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=10_000_000, help="agent steps over all envs")
    p.add_argument("--time-limit-s", type=float, default=None)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.1)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = all cores")
    p.add_argument("--env-threads", type=int, default=0, help="EnvPool threads; 0 = all cores")
    p.add_argument("--repeat-action-probability", type=float, default=0.0,
                   help="sticky actions (EnvPool's default 0, as CleanRL runs it; env=pong uses 0.25)")  # fmt: skip
    p.add_argument("--out-dir", default=None, help="where games.csv and updates.csv go (none: not written)")
    args = p.parse_args(argv)
    if args.num_envs < 1 or args.num_steps < 1 or args.num_minibatches < 1:
        p.error("--num-envs, --num-steps and --num-minibatches must be >= 1")
    if not 0.0 <= args.repeat_action_probability <= 1.0:
        p.error("--repeat-action-probability must be in [0, 1]")
    if (args.num_envs * args.num_steps) % args.num_minibatches:
        p.error("--num-envs * --num-steps must be divisible by --num-minibatches")
    return args


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN trunk with a categorical actor and a value head (CleanRL's ``Agent``)."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


class GameStats:
    """Unclipped game scores and lengths from EnvPool's ``info``: with episodic life a lost life ends the RL
    episode, the game ends when ``lives`` reaches 0 (or the frame cap truncates it)."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, info: dict, terminated: np.ndarray, truncated: np.ndarray) -> list[tuple[float, int]]:
        self.returns += info["reward"]
        self.lengths += 1
        over = (terminated & (info["lives"] == 0)) | truncated
        done = [(float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(over)]
        self.returns[over] = 0.0
        self.lengths[over] = 0
        return done


def main(argv: list[str] | None = None) -> int:
    import envpool

    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(args.threads or cores)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    stop = {"signal": None}

    def on_signal(signum, frame):  # finish the update, write the files, exit 128 + N
        stop["signal"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    envs = envpool.make(
        args.env_id,
        env_type="gymnasium",
        num_envs=args.num_envs,
        num_threads=min(args.env_threads or cores, args.num_envs),
        episodic_life=True,
        reward_clip=True,
        repeat_action_probability=args.repeat_action_probability,
        seed=args.seed,
    )
    num_actions = envs.action_space.n
    agent = Agent(num_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    n, t = args.num_envs, args.num_steps
    batch_size = n * t
    minibatch_size = batch_size // args.num_minibatches
    num_updates = max(1, args.total_timesteps // batch_size)
    obs = torch.zeros((t, n, 4, 84, 84), dtype=torch.uint8)
    actions = torch.zeros((t, n), dtype=torch.int64)
    logprobs = torch.zeros((t, n))
    rewards = torch.zeros((t, n))
    dones = torch.zeros((t, n))
    values = torch.zeros((t, n))
    stats = GameStats(n)
    recent: deque[float] = deque(maxlen=100)
    games_f = updates_f = None
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        games_f = open(os.path.join(args.out_dir, "games.csv"), "w", newline="")
        updates_f = open(os.path.join(args.out_dir, "updates.csv"), "w", newline="")
        games = csv.writer(games_f)
        games.writerow(["wall_s", "global_step", "score", "length"])
        updates = csv.writer(updates_f)
        updates.writerow(["wall_s", "global_step", "sps", "score_mean100"])
    start = time.monotonic()
    global_step = 0
    next_obs = torch.from_numpy(envs.reset()[0])
    next_done = torch.zeros(n)
    try:
        for update in range(1, num_updates + 1):
            t_update = time.monotonic()
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (update - 1.0) / num_updates) * args.learning_rate
            for step in range(t):
                global_step += n
                obs[step] = next_obs
                dones[step] = next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs.float())
                values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob
                o, r, term, trunc, info = envs.step(action.numpy())
                rewards[step] = torch.from_numpy(r).float()
                next_obs = torch.from_numpy(o)
                next_done = torch.from_numpy(term | trunc).float()
                for score, length in stats.update(info, term, trunc):
                    recent.append(score)
                    if games_f is not None:
                        games.writerow([f"{time.monotonic() - start:.2f}", global_step, score, length])
            # GAE (CleanRL treats truncation like termination, as its envpool script does)
            with torch.no_grad():
                next_value = agent.get_value(next_obs.float()).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = 0
                for k in reversed(range(t)):
                    nextnonterminal = 1.0 - (next_done if k == t - 1 else dones[k + 1])
                    nextvalues = next_value if k == t - 1 else values[k + 1]
                    delta = rewards[k] + args.gamma * nextvalues * nextnonterminal - values[k]
                    lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                    advantages[k] = lastgaelam
                returns = advantages + values
            b_obs = obs.reshape((-1, 4, 84, 84))
            b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
            b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
            b_inds = np.arange(batch_size)
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for s in range(0, batch_size, minibatch_size):
                    mb = b_inds[s : s + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb].float(), b_actions[mb])
                    ratio = (newlogprob - b_logprobs[mb]).exp()
                    mb_adv = b_advantages[mb]
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef))
                    newvalue = newvalue.view(-1)
                    v_clipped = b_values[mb] + (newvalue - b_values[mb]).clamp(-args.clip_coef, args.clip_coef)
                    v_loss = 0.5 * torch.max((newvalue - b_returns[mb]) ** 2, (v_clipped - b_returns[mb]) ** 2).mean()
                    loss = pg_loss.mean() - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
            now = time.monotonic()
            sps = batch_size / max(now - t_update, 1e-9)
            mean100 = float(np.mean(recent)) if recent else float("nan")
            print(f"update {update} global_step {global_step} sps {sps:.1f} score_mean100 {mean100:.2f}", flush=True)
            if updates_f is not None:
                updates.writerow([f"{now - start:.2f}", global_step, f"{sps:.1f}", f"{mean100:.3f}"])
                updates_f.flush()
                games_f.flush()
            if stop["signal"] is not None or (args.time_limit_s is not None and now - start >= args.time_limit_s):
                break
    finally:
        envs.close()
        for f in (games_f, updates_f):
            if f is not None:
                f.close()
    total_s = time.monotonic() - start
    print(f"done global_step {global_step} wall_s {total_s:.1f} sps {global_step / max(total_s, 1e-9):.1f}")
    return 128 + stop["signal"] if stop["signal"] is not None else 0


if __name__ == "__main__":
    sys.exit(main())
