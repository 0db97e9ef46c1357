"""Client suite: RL libraries nobody here wrote, training on our envs through the adapters (docs/wrappers.md).

    python benchmarks/clients.py                       # ~50k env steps per client on hopper
                                                       # -> benchmarks/results/clients/clients_hopper.{json,md}
    python benchmarks/clients.py --steps 4096 --clients sb3 skrl

Each client trains PPO on ``make("hopper", 8, backend="mujoco")`` the way its own docs say, through the adapter and
with the glue docs/wrappers.md prescribes (its recipe is the ``train_<client>`` function here, which the tests run
on small budgets: tests/test_clients.py):

* ``sb3``: Stable-Baselines3 PPO on ``SB3VecEnv`` (``terminal_observation``, ``TimeLimit.truncated``);
* ``skrl``: skrl 2.x PPO in the loop that hands it ``final_obs`` as the next observation (``skrl_loop``: skrl's own
  ``SequentialTrainer`` passes the auto-reset observation, so truncations would bootstrap from the next episode);
* ``rl_games``: rl_games' ``Runner`` (a2c_continuous) on ``VecTaskEnv`` registered as its vecenv;
* ``torchrl``: TorchRL's ``Collector`` + ``ClipPPOLoss`` + ``GAE`` on ``TorchRLEnv``;
* ``cleanrl``: a CleanRL-style PPO loop on ``gymnasium.make_vec("sample_fast/Hopper-v5")`` (NEXT_STEP) with
  gymnasium's vector wrappers (``NormalizeObservation``, ``NormalizeReward``, ...).

Recorded per client: the mean return of its policy (deterministic: the mean action) over one episode of each of 8
evaluation envs (seed 123) before and after training, the env steps trained, the wall time and the env steps/s of
the whole training loop (policy, learning and env together; the figure a user sees, not the env's raw speed). The
clients run one after another in this process; the machine is shared (take the lock), so compare figures of one file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sample_fast.envs import BatchedEnv, make

from sample_fast.benchmark import harness

RESULTS = Path(__file__).resolve().parent / "results" / "clients"
CLIENTS = ("sb3", "skrl", "rl_games", "torchrl", "cleanrl")
EVAL_SEED = 123

Act = Callable[[torch.Tensor], torch.Tensor]  # observations [N, obs] float32 -> deterministic actions [N, act]


def make_env(task: str, num_envs: int, seed: int, **options: Any) -> BatchedEnv:
    return make(task, num_envs, backend="mujoco", seed=seed, num_threads=1, **options)


def evaluate(act: Act, task: str = "hopper", num_envs: int = 8, max_steps: int = 1000, **options: Any) -> float:
    """Mean undiscounted return of ``act`` over the first episode of each of ``num_envs`` envs (seed 123)."""
    env = make_env(task, num_envs, EVAL_SEED, **{"max_episode_steps": max_steps, **options})
    obs, _ = env.reset(seed=EVAL_SEED)
    returns = torch.full((num_envs,), float("nan"))
    with torch.no_grad():
        while bool(returns.isnan().any()):
            res = env.step(act(obs).to(torch.float32).clamp(-1, 1))
            done = (res.terminated | res.truncated) & returns.isnan()
            returns[done] = res.info["episode_return"][done]
            obs = res.obs
    env.close()
    return float(returns.mean())


# ----- Stable-Baselines3 -----------------------------------------------------------------------------------------
def train_sb3(steps: int, task: str = "hopper", num_envs: int = 8, seed: int = 0, **options: Any) -> dict[str, Any]:
    from sample_fast.envs.adapters import SB3VecEnv
    from stable_baselines3 import PPO

    env = SB3VecEnv(make_env(task, num_envs, seed, **options))
    env.seed(seed)  # env i gets its own stream (SB3's seed + i convention)
    n_steps = max(16, min(256, steps // num_envs))
    model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=min(256, n_steps * num_envs), n_epochs=10,
                learning_rate=3e-4, gamma=0.99, seed=seed, device="cpu", verbose=0)  # fmt: skip

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(model.predict(obs.numpy(), deterministic=True)[0])

    before = evaluate(act, task, **options)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    seconds = time.perf_counter() - t0
    out = {"before": before, "after": evaluate(act, task, **options), "steps": int(model.num_timesteps)}
    env.close()
    settings = {"rollout": n_steps, "epochs": 10, "minibatch": min(256, n_steps * num_envs), "net": "64x64 tanh"}
    return {**out, "seconds": seconds, "settings": settings}


# ----- skrl 2.x --------------------------------------------------------------------------------------------------
def skrl_loop(agent: Any, env: Any, timesteps: int) -> None:
    """skrl's ``SequentialTrainer.train`` loop with one change: the transition's next observation is the
    observation each env actually reached (``info["final_obs"]`` of our SAME_STEP gymnasium adapter), not the
    auto-reset one, so skrl's ``time_limit_bootstrap`` bootstraps truncations from the right state.

    ``env`` is skrl's ``wrap_env(GymnasiumVectorEnv(...), wrapper="gymnasium")``; ``agent`` an initialised skrl agent.
    """
    agent.enable_training_mode(True)
    obs, _ = env.reset()
    for timestep in range(timesteps):
        agent.pre_interaction(timestep=timestep, timesteps=timesteps)
        with torch.no_grad():
            actions, _ = agent.act(obs, None, timestep=timestep, timesteps=timesteps)
            next_obs, rewards, terminated, truncated, infos = env.step(actions)
            reached = next_obs
            if "final_obs" in infos:  # the episodes that ended: their last observations
                reached = next_obs.clone()
                for i in np.flatnonzero(infos["_final_obs"]):
                    reached[i] = torch.as_tensor(infos["final_obs"][i], device=reached.device)
            agent.record_transition(observations=obs, states=None, actions=actions, rewards=rewards,
                                    next_observations=reached, next_states=None, terminated=terminated,
                                    truncated=truncated, infos=infos, timestep=timestep,
                                    timesteps=timesteps)  # fmt: skip
        agent.post_interaction(timestep=timestep, timesteps=timesteps)
        obs = next_obs
    agent.enable_training_mode(False)


def _skrl_agent(env: Any, rollouts: int, seed: int) -> Any:
    import torch.nn as nn
    from skrl.agents.torch import ExperimentCfg
    from skrl.agents.torch.ppo import PPO, PPO_CFG
    from skrl.memories.torch import RandomMemory
    from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
    from skrl.utils import set_seed

    set_seed(seed)

    class Policy(GaussianMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
            GaussianMixin.__init__(self, clip_actions=False, clip_log_std=True, min_log_std=-20, max_log_std=2)
            self.net = nn.Sequential(nn.Linear(self.num_observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                     nn.Linear(64, self.num_actions))  # fmt: skip
            self.log_std = nn.Parameter(torch.zeros(self.num_actions))

        def compute(self, inputs, role=""):
            return self.net(inputs["observations"]), {"log_std": self.log_std}

    class Value(DeterministicMixin, Model):
        def __init__(self, observation_space, action_space, device):
            Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
            DeterministicMixin.__init__(self, clip_actions=False)
            self.net = nn.Sequential(nn.Linear(self.num_observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                     nn.Linear(64, 1))  # fmt: skip

        def compute(self, inputs, role=""):
            return self.net(inputs["observations"]), {}

    spaces = {"observation_space": env.observation_space, "action_space": env.action_space, "device": env.device}
    models = {"policy": Policy(**spaces), "value": Value(**spaces)}
    cfg = PPO_CFG(rollouts=rollouts, learning_epochs=10, mini_batches=4, discount_factor=0.99, gae_lambda=0.95,
                  learning_rate=3e-4, time_limit_bootstrap=True,
                  # no TensorBoard files or checkpoints in the working directory
                  experiment=ExperimentCfg(write_interval=0, checkpoint_interval=0))  # fmt: skip
    memory = RandomMemory(memory_size=rollouts, num_envs=env.num_envs, device=env.device)
    agent = PPO(models=models, memory=memory, cfg=cfg, **spaces)
    agent.init()
    return agent


def train_skrl(steps: int, task: str = "hopper", num_envs: int = 8, seed: int = 0, **options: Any) -> dict[str, Any]:
    from sample_fast.envs.adapters import GymnasiumVectorEnv
    from skrl.envs.wrappers.torch import wrap_env

    env = wrap_env(GymnasiumVectorEnv(make_env(task, num_envs, seed, **options)), wrapper="gymnasium")
    rollouts = max(8, min(256, steps // num_envs))
    agent = _skrl_agent(env, rollouts, seed)

    def act(obs: torch.Tensor) -> torch.Tensor:
        return agent.models["policy"].act({"observations": obs}, role="policy")[1]["mean_actions"]

    before = evaluate(act, task, **options)
    t0 = time.perf_counter()
    skrl_loop(agent, env, steps // num_envs)
    seconds = time.perf_counter() - t0
    out = {"before": before, "after": evaluate(act, task, **options), "steps": steps // num_envs * num_envs}
    env.close()
    settings = {"rollout": rollouts, "epochs": 10, "minibatch": rollouts * num_envs // 4, "net": "64x64 tanh"}
    return {**out, "seconds": seconds, "settings": settings}


# ----- rl_games ----------------------------------------------------------------------------------------------------
def register_rl_games(name: str, creator: Callable[[], Any]) -> None:
    """rl_games' registration, as IsaacGymEnvs does it: ``creator()`` returns a ``VecTaskEnv``."""
    from rl_games.common import env_configurations, vecenv

    class RlGamesVecEnv(vecenv.IVecEnv):  # IsaacGymEnvs' RLGPUEnv: hands rl_games the VecTask's own results
        def __init__(self, config_name: str, num_actors: int, **kwargs: Any) -> None:
            self.env = env_configurations.configurations[config_name]["env_creator"](**kwargs)

        def step(self, actions):
            return self.env.step(actions)

        def reset(self):
            return self.env.reset()

        def get_number_of_agents(self):
            return self.env.get_number_of_agents()

        def get_env_info(self):
            return self.env.get_env_info()

    vecenv.register("SAMPLE_FAST", lambda config_name, num_actors, **kwargs: RlGamesVecEnv(config_name, num_actors))
    env_configurations.register(name, {"vecenv_type": "SAMPLE_FAST", "env_creator": lambda **kwargs: creator()})


def rl_games_config(name: str, num_envs: int, horizon: int, max_epochs: int, seed: int, train_dir: str,
                    minibatch: int, mini_epochs: int) -> dict:  # fmt: skip
    return {"params": {
        "seed": seed,
        "algo": {"name": "a2c_continuous"},
        "model": {"name": "continuous_a2c_logstd"},
        "network": {
            "name": "actor_critic", "separate": False,
            "space": {"continuous": {"mu_activation": "None", "sigma_activation": "None",
                                     "mu_init": {"name": "default"},
                                     "sigma_init": {"name": "const_initializer", "val": 0}, "fixed_sigma": True}},
            "mlp": {"units": [64, 64], "activation": "tanh", "initializer": {"name": "default"}},
        },
        "config": {
            "name": name, "env_name": name, "train_dir": train_dir, "device": "cpu", "ppo": True,
            "multi_gpu": False, "mixed_precision": False, "normalize_input": True, "normalize_value": True,
            "value_bootstrap": True, "num_actors": num_envs, "reward_shaper": {"scale_value": 1.0},
            "normalize_advantage": True, "gamma": 0.99, "tau": 0.95, "learning_rate": 3e-4, "lr_schedule": "adaptive",
            "kl_threshold": 0.008, "score_to_win": 1e9, "max_epochs": max_epochs, "save_best_after": 10**9,
            "save_frequency": 0, "print_stats": False, "grad_norm": 1.0, "entropy_coef": 0.0, "truncate_grads": True,
            "e_clip": 0.2, "horizon_length": horizon, "minibatch_size": minibatch,
            "mini_epochs": mini_epochs, "critic_coef": 2, "clip_value": True, "seq_length": 4,
            "bounds_loss_coef": 0.0001,
        },
    }}  # fmt: skip


def train_rl_games(steps: int, task: str = "hopper", num_envs: int = 8, seed: int = 0, **options: Any) -> dict:
    from rl_games.torch_runner import Runner
    from sample_fast.envs.adapters import VecTaskEnv

    name = f"sample_fast_{task}"
    register_rl_games(name, lambda: VecTaskEnv(make_env(task, num_envs, seed, **options), clip_actions=1.0))
    horizon = max(8, min(256, steps // num_envs))
    epochs = max(1, steps // (horizon * num_envs))
    with tempfile.TemporaryDirectory(prefix="sf-rl-games-") as train_dir:
        runner = Runner()
        # rl_games' minibatch updates dominate its wall time on this CPU: fewer, larger ones keep the suite short
        minibatch, mini_epochs = horizon * num_envs // 2, 5
        runner.load(rl_games_config(name, num_envs, horizon, epochs, seed, train_dir, minibatch, mini_epochs))
        agent = runner.algo_factory.create(runner.algo_name, base_name="run", params=runner.params)

        def act(obs: torch.Tensor) -> torch.Tensor:
            agent.model.eval()
            res = agent.model({"is_train": False, "prev_actions": None, "obs": agent.model.norm_obs(obs)})
            return res["mus"]

        with torch.no_grad():
            before = evaluate(act, task, **options)
        t0 = time.perf_counter()
        agent.train()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            after = evaluate(act, task, **options)
        frames = int(agent.frame)
        agent.vec_env.env.close()
    settings = {"rollout": horizon, "epochs": mini_epochs, "minibatch": minibatch, "net": "64x64 tanh"}
    return {"before": before, "after": after, "steps": frames, "seconds": seconds, "settings": settings}


# ----- TorchRL -----------------------------------------------------------------------------------------------------
def train_torchrl(steps: int, task: str = "hopper", num_envs: int = 8, seed: int = 0, **options: Any) -> dict:
    from sample_fast.envs.adapters import TorchRLEnv
    from tensordict.nn import NormalParamExtractor, TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    torch.manual_seed(seed)
    env = TorchRLEnv(make_env(task, num_envs, seed, **options))
    n_obs, n_act = env.env.observation_spec.shape[0], env.env.action_spec.shape[0]
    body = torch.nn.Sequential(torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 2 * n_act), NormalParamExtractor())  # fmt: skip
    actor = ProbabilisticActor(TensorDictModule(body, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True,
                               spec=env.action_spec)  # fmt: skip
    value_net = torch.nn.Sequential(torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                    torch.nn.Tanh(), torch.nn.Linear(64, 1))  # fmt: skip
    critic = ValueOperator(value_net, in_keys=["observation"])
    frames_per_batch = max(64, min(2048, steps // 4 // num_envs * num_envs))
    epochs, minibatch = 5, max(64, frames_per_batch // 2)  # as rl_games: fewer, larger minibatches
    # False: the env as given, as before torchrl 0.15 (this MLP policy needs no InitTracker or primer); the default
    # None does the same on torchrl 0.14 and warns that 0.15 will change it
    collector = Collector(
        env, actor, frames_per_batch=frames_per_batch, total_frames=steps, auto_register_policy_transforms=False
    )
    advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-4)

    def act(obs: torch.Tensor) -> torch.Tensor:
        loc = body(obs)[0]
        return torch.tanh(loc)  # TanhNormal's deterministic action is close to tanh(loc)

    with torch.no_grad():
        before = evaluate(act, task, **options)
    frames = 0
    t0 = time.perf_counter()
    for batch in collector:
        frames += batch.numel()
        with torch.no_grad():
            advantage(batch)  # bootstraps from ("next", "observation"): the true next observation at truncations
        flat = batch.reshape(-1)
        for _ in range(epochs):
            for idx in torch.randperm(flat.numel()).split(minibatch):
                losses = loss(flat[idx])
                total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                total.backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), 1.0)
                optim.step()
        collector.update_policy_weights_()
    seconds = time.perf_counter() - t0
    collector.shutdown()
    with torch.no_grad():
        after = evaluate(act, task, **options)
    env.close()
    settings = {"rollout": frames_per_batch // num_envs, "epochs": epochs, "minibatch": minibatch, "net": "64x64 tanh"}
    return {"before": before, "after": after, "steps": frames, "seconds": seconds, "settings": settings}


# ----- a CleanRL-style loop on gymnasium.make_vec -------------------------------------------------------------------
def train_cleanrl(steps: int, task: str = "hopper", num_envs: int = 8, seed: int = 0, **options: Any) -> dict:
    """CleanRL's ppo_continuous_action loop, unchanged in spirit: ``gymnasium.make_vec`` on our registered id
    (NEXT_STEP,
    its default) with CleanRL's gymnasium vector wrappers (episode statistics, action clipping, observation and
    reward normalization). Like CleanRL it treats a truncation as a termination (its own approximation)."""
    import gymnasium as gym
    import sample_fast.envs  # noqa: F401 (registers the sample_fast/* ids)
    from sample_fast.envs.tasks import TASKS

    torch.manual_seed(seed)
    w = gym.wrappers.vector
    envs = gym.make_vec(f"sample_fast/{TASKS[task].gymnasium_id}", num_envs=num_envs, backend="mujoco", seed=seed,
                        num_threads=1, **options)  # fmt: skip
    envs = w.RecordEpisodeStatistics(envs)
    envs = w.ClipAction(envs)
    norm = envs = w.NormalizeObservation(envs)
    envs = w.TransformObservation(envs, lambda o: np.clip(o, -10, 10), None)
    envs = w.NormalizeReward(envs, gamma=0.99)
    envs = w.TransformReward(envs, lambda r: np.clip(r, -10, 10))
    n_obs, n_act = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]

    def mlp(out: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(n_obs, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                   torch.nn.Tanh(), torch.nn.Linear(64, out))  # fmt: skip

    actor, critic, log_std = mlp(n_act), mlp(1), torch.nn.Parameter(torch.zeros(n_act))
    params = [*actor.parameters(), *critic.parameters(), log_std]
    optim = torch.optim.Adam(params, lr=3e-4, eps=1e-5)
    num_steps, epochs, minibatch, gamma, lam = max(8, min(256, steps // num_envs)), 10, 256, 0.99, 0.95

    def act(obs: torch.Tensor) -> torch.Tensor:  # the eval env's raw observations, normalized as in training
        rms = norm.obs_rms
        o = ((obs.numpy() - rms.mean) / np.sqrt(rms.var + 1e-8)).clip(-10, 10)
        return actor(torch.as_tensor(o, dtype=torch.float32))

    with torch.no_grad():
        before = evaluate(act, task, **options)
    t0 = time.perf_counter()
    next_obs = torch.as_tensor(envs.reset(seed=seed)[0], dtype=torch.float32)
    next_done = torch.zeros(num_envs)
    frames = 0
    for _ in range(max(1, steps // (num_steps * num_envs))):
        buf = {k: [] for k in ("obs", "act", "logp", "rew", "done", "val")}
        for _ in range(num_steps):
            with torch.no_grad():
                mean = actor(next_obs)
                dist = torch.distributions.Normal(mean, log_std.exp())
                a = dist.sample()
                buf["obs"].append(next_obs)
                buf["act"].append(a)
                buf["logp"].append(dist.log_prob(a).sum(-1))
                buf["val"].append(critic(next_obs)[:, 0])
                buf["done"].append(next_done)
            obs, reward, term, trunc, _ = envs.step(a.numpy())
            buf["rew"].append(torch.as_tensor(reward, dtype=torch.float32))
            next_obs = torch.as_tensor(obs, dtype=torch.float32)
            next_done = torch.as_tensor(term | trunc, dtype=torch.float32)
            frames += num_envs
        b = {k: torch.stack(v) for k, v in buf.items()}
        with torch.no_grad():
            adv, last = torch.zeros_like(b["rew"]), 0.0
            next_value = critic(next_obs)[:, 0]
            for t in reversed(range(num_steps)):
                nonterminal = 1.0 - (next_done if t == num_steps - 1 else b["done"][t + 1])
                value_next = next_value if t == num_steps - 1 else b["val"][t + 1]
                delta = b["rew"][t] + gamma * value_next * nonterminal - b["val"][t]
                adv[t] = last = delta + gamma * lam * nonterminal * last
            ret = adv + b["val"]
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in {**b, "adv": adv, "ret": ret}.items()}
        for _ in range(epochs):
            for idx in torch.randperm(flat["rew"].numel()).split(minibatch):
                dist = torch.distributions.Normal(actor(flat["obs"][idx]), log_std.exp())
                ratio = (dist.log_prob(flat["act"][idx]).sum(-1) - flat["logp"][idx]).exp()
                a_ = flat["adv"][idx]
                a_ = (a_ - a_.mean()) / (a_.std() + 1e-8)
                pg = torch.max(-a_ * ratio, -a_ * ratio.clamp(0.8, 1.2)).mean()
                v_loss = 0.5 * (critic(flat["obs"][idx])[:, 0] - flat["ret"][idx]).square().mean()
                optim.zero_grad()
                (pg + 0.5 * v_loss).backward()
                torch.nn.utils.clip_grad_norm_(params, 0.5)
                optim.step()
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        after = evaluate(act, task, **options)
    envs.close()
    settings = {"rollout": num_steps, "epochs": epochs, "minibatch": minibatch, "net": "64x64 tanh"}
    return {"before": before, "after": after, "steps": frames, "seconds": seconds, "settings": settings}


TRAINERS = {
    "sb3": train_sb3,
    "skrl": train_skrl,
    "rl_games": train_rl_games,
    "torchrl": train_torchrl,
    "cleanrl": train_cleanrl,
}


def _markdown(data: dict) -> str:
    lines = [
        f"# Client suite: PPO on {data['task']} through the adapters ({data['steps_per_client']} env steps each)",
        "",
        f"Written by `python benchmarks/clients.py` ({harness.quiet_line(data['quiet'])}) "
        f"{data['num_envs']} envs, backend mujoco, seed {data['seed']}; returns: mean over one episode of each of 8 "
        "eval envs (seed 123), deterministic policy. Env steps/s: the whole training loop (policy + learning + env).",
        "",
        "| client | version | return before | return after | env steps | wall s | env steps/s | CPU busy before | "
        "rollout x epochs x minibatch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in data["clients"].items():
        if "error" in r:
            lines.append(f"| {name} | {r.get('version')} | error: {r['error']} | | | | |")
            continue
        busy, cfg = r.get("quiet", {}).get("busy_fraction"), r.get("settings", {})
        busy_s = "?" if busy is None or busy != busy else f"{busy:.0%}"
        lines.append(f"| {name} | {r['version']} | {r['before']:.1f} | {r['after']:.1f} | {r['steps']} | "
                     f"{r['seconds']:.1f} | {r['steps_per_s']:.0f} | {busy_s} | {cfg.get('rollout')} x "
                     f"{cfg.get('epochs')} x {cfg.get('minibatch')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per client (default 50k)")
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--task", default="hopper")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--name", default=None, help="result file stem (default clients_<task>)")
    parser.add_argument("--merge", action="store_true", help="keep the other clients' results already in the file")
    harness.add_quiet_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps < 64 or args.num_envs < 1:
        parser.error("--steps must be >= 64 and --num-envs >= 1")
    torch.set_num_threads(1)
    quiet = harness.check_quiet_from_args(args)
    import importlib.metadata

    versions = {"sb3": "stable-baselines3", "skrl": "skrl", "rl_games": "rl_games", "torchrl": "torchrl",
                "cleanrl": "gymnasium"}  # fmt: skip
    data: dict[str, Any] = {
        "task": args.task, "steps_per_client": args.steps, "num_envs": args.num_envs, "seed": args.seed,
        "quiet": quiet, "machine": harness.machine_record(quiet), "clients": {},
    }  # fmt: skip
    stem = args.name or f"clients_{args.task}"
    path = Path(args.out) / f"{stem}.json"
    if args.merge and path.exists():
        import json

        data["clients"] = json.loads(path.read_text()).get("clients", {})
    paths: dict[str, str] = {}
    for name in args.clients:
        try:
            version = importlib.metadata.version(versions[name])
        except importlib.metadata.PackageNotFoundError:
            version = None
        print(f"{name}: training {args.steps} steps ...", flush=True)
        client_quiet = harness.check_quiet_from_args(args)  # per client: a merged file mixes runs
        try:
            r = TRAINERS[name](args.steps, args.task, args.num_envs, args.seed)
        except ImportError as e:
            data["clients"][name] = {"version": version, "error": f"{type(e).__name__}: {e}"}
            print(f"{name}: not installed ({e})", file=sys.stderr)
            continue
        r["steps_per_s"] = r["steps"] / r["seconds"] if r["seconds"] > 0 else math.nan
        data["clients"][name] = {"version": version, **r, "quiet": client_quiet, "recorded_utc": harness.now_utc()}
        print(f"{name}: return {r['before']:.1f} -> {r['after']:.1f}, {r['steps']} steps in {r['seconds']:.1f} s "
              f"({r['steps_per_s']:.0f} steps/s)", flush=True)  # fmt: skip
        # after every client, so a run cut short keeps what it measured
        paths = harness.write_results(args.out, stem, data, _markdown(data))
    print("wrote", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "egl")
    sys.exit(main())
