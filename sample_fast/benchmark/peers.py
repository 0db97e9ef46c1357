"""Peers measured in the same run as sample_fast, so every figure can be read as a ratio on the same machine.

* ``mujoco_rollout``: raw ``mujoco.rollout.Rollout(nthread=cores)``, one call of ``frame_skip`` physics steps per
  env step, no observation or reward: the physical limit of the CPU for this model.
* ``envpool_raw``: EnvPool's own sync API with numpy actions.
* ``gymnasium_sync`` / ``gymnasium_async``: ``gymnasium.make_vec`` with Sync/AsyncVectorEnv.
* ``torchrl_collector``: torchrl's ``Collector`` over ``GymEnv`` with a 2x256 actor and critic (inference stage).
* ``sample_factory``: Sample Factory's APPO in its own virtualenv (train stage), see ``sample_factory_peer``.

Owns the peers' set-up and stepping loops only. A peer whose package is missing raises ``Skip`` with the command
that installs it; the suite turns that into one line of the report.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sample_fast.envs import TASKS

from .config import BenchmarkConfig, num_threads
from .measure import CaseResult, Skip, Timing, timed_windows


@dataclass(frozen=True)
class PeerInfo:
    """A peer: the stage it compares with, whether it sweeps num_envs, what it needs and how to install it."""

    name: str
    stage: str
    sweeps: bool  # False: measured once per env at a fixed size (``fixed_num_envs``)
    modules: tuple[str, ...]
    install: str
    description: str


PEERS: dict[str, PeerInfo] = {
    p.name: p
    for p in (
        PeerInfo(
            "mujoco_rollout",
            "env",
            True,
            ("mujoco",),
            "pip install mujoco",
            "raw mujoco.rollout, frame_skip physics steps per call, no obs/reward (the physical limit)",
        ),
        PeerInfo(
            "envpool_raw",
            "env",
            True,
            ("envpool",),
            "pip install envpool  (Linux x86_64 wheels only)",
            "EnvPool sync API, numpy actions",
        ),
        PeerInfo(
            "gymnasium_sync",
            "env",
            True,
            ("gymnasium", "mujoco"),
            'pip install "gymnasium[mujoco]"',
            "gymnasium SyncVectorEnv",
        ),
        PeerInfo(
            "gymnasium_async",
            "env",
            True,
            ("gymnasium", "mujoco"),
            'pip install "gymnasium[mujoco]"',
            "gymnasium AsyncVectorEnv (one process per env)",
        ),
        PeerInfo(
            "torchrl_collector",
            "inference",
            False,
            ("torchrl", "tensordict", "gymnasium"),
            "pip install torchrl tensordict",
            "torchrl Collector over GymEnv, 2x256 actor + critic, 1 env",
        ),
        PeerInfo(
            "sample_factory",
            "train",
            False,
            (),
            "bash benchmarks/sample_factory/setup_venv.sh  (builds .venv-sf)",
            "Sample Factory 2.x APPO on its mujoco env, own virtualenv",
        ),
    )
}


def missing_modules(info: PeerInfo) -> list[str]:
    return [m for m in info.modules if importlib.util.find_spec(m) is None]


def check_available(info: PeerInfo) -> None:
    """Raise Skip with the install command when a module the peer needs does not import."""
    missing = missing_modules(info)
    if missing:
        raise Skip(f"{', '.join(missing)} not installed; install with: {info.install}")


def _timing(cfg: BenchmarkConfig) -> Timing:
    return Timing(cfg.warmup_s, cfg.repeats, cfg.seconds_per_repeat, cfg.measure_timeout_s)


def _task(env: str) -> Any:
    if env not in TASKS:
        raise Skip(f"peers run the MuJoCo tasks only ({', '.join(sorted(TASKS))}), not {env!r}")
    return TASKS[env]


def _action_bank(low: np.ndarray, high: np.ndarray, num_envs: int, seed: int, k: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(low, high, size=(num_envs, *low.shape)) for _ in range(k)]


# ----- mujoco_rollout: the physical limit ---------------------------------------------------------------------------
def measure_mujoco_rollout(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    t0 = time.perf_counter()
    import mujoco
    from mujoco import rollout

    from sample_fast.envs.physics import build_model

    task = _task(env)
    opts = {k: v for k, v in cfg.env_options.items() if k in ("solver_iterations", "ls_iterations", "contacts")}
    model = build_model(task, opts)
    frame_skip = int(cfg.env_options.get("frame_skip") or task.frame_skip)
    nthread = num_threads(cfg)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    init = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, init, spec)
    state = np.tile(init, (num_envs, 1))
    out = np.empty((num_envs, frame_skip, init.size))
    lo, hi = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    bank = [c[:, None, :] for c in _action_bank(lo, hi, num_envs, cfg.seed)]
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    episode_steps = int(cfg.env_options.get("max_episode_steps") or 1000)
    counter = {"i": 0}

    with rollout.Rollout(nthread=nthread) as runner:

        def step() -> int:
            i = counter["i"]
            # PERF: one call steps all envs frame_skip times on nthread threads; the GIL is released inside.
            runner.rollout(model, datas, state, bank[i % len(bank)], nstep=frame_skip, state=out)
            state[:] = out[:, -1]
            counter["i"] = i + 1
            if counter["i"] % episode_steps == 0:  # keep the states in the regime of real episodes
                state[:] = init
            return num_envs

        rates = timed_windows(step, lambda: None, _timing(cfg), started_s=t0)
    return CaseResult(rates, frame_skip, "cpu", extra={"nthread": nthread})


# ----- envpool_raw ------------------------------------------------------------------------------------------------
def measure_envpool_raw(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    t0 = time.perf_counter()
    import envpool

    task = _task(env)
    nthread = min(num_threads(cfg), num_envs)
    pool = envpool.make(task.envpool_id, env_type="gymnasium", num_envs=num_envs, num_threads=nthread, seed=cfg.seed)
    try:
        pool.reset()
        space = pool.action_space
        bank = _action_bank(space.low, space.high, num_envs, cfg.seed)
        counter = {"i": 0}

        def step() -> int:
            pool.step(bank[counter["i"] % len(bank)])
            counter["i"] += 1
            return num_envs

        rates = timed_windows(step, lambda: None, _timing(cfg), started_s=t0)
    finally:
        pool.close()
    return CaseResult(rates, task.frame_skip, "cpu", extra={"num_threads": nthread})


# ----- gymnasium vector envs --------------------------------------------------------------------------------------
def _measure_gymnasium(env: str, num_envs: int, cfg: BenchmarkConfig, mode: str) -> CaseResult:
    t0 = time.perf_counter()
    import gymnasium

    task = _task(env)
    if mode == "async" and num_envs > cfg.gymnasium_async_max_envs:
        raise Skip(
            f"AsyncVectorEnv starts one process per env; num_envs {num_envs} > gymnasium_async_max_envs "
            f"{cfg.gymnasium_async_max_envs}"
        )
    vec = gymnasium.make_vec(task.gymnasium_id, num_envs=num_envs, vectorization_mode=mode)
    try:
        vec.reset(seed=cfg.seed)
        space = vec.single_action_space
        bank = _action_bank(space.low, space.high, num_envs, cfg.seed)
        counter = {"i": 0}

        def step() -> int:
            vec.step(bank[counter["i"] % len(bank)])
            counter["i"] += 1
            return num_envs

        rates = timed_windows(step, lambda: None, _timing(cfg), started_s=t0)
    finally:
        vec.close()
    return CaseResult(rates, task.frame_skip, "cpu")


def measure_gymnasium_sync(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    return _measure_gymnasium(env, num_envs, cfg, "sync")


def measure_gymnasium_async(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    return _measure_gymnasium(env, num_envs, cfg, "async")


# ----- torchrl_collector ------------------------------------------------------------------------------------------
def _torchrl_collector_cls() -> Any:
    """torchrl 0.14 renamed ``SyncDataCollector`` to ``Collector``; accept either."""
    import torchrl.collectors as collectors

    for name in ("Collector", "SyncDataCollector"):
        if hasattr(collectors, name):
            return getattr(collectors, name)
    version = getattr(__import__("torchrl"), "__version__", "?")
    raise Skip(f"torchrl {version} has neither Collector nor SyncDataCollector")


def measure_torchrl_collector(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    """torchrl's single-process collector on one GymEnv, a 2x256 tanh actor and critic (the same work as
    ``ActorCritic.act`` minus the Gaussian sample), torch threads as for our inference stage."""
    t0 = time.perf_counter()
    import warnings

    import torch
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.envs import DoubleToFloat, GymEnv, TransformedEnv
    from torchrl.modules import MLP

    task = _task(env)
    collector_cls = _torchrl_collector_cls()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    collector = None
    try:
        tenv = TransformedEnv(GymEnv(task.gymnasium_id), DoubleToFloat())
        obs_dim = tenv.observation_spec["observation"].shape[-1]
        act_dim = tenv.action_spec.shape[-1]
        hidden = list(cfg.policy_hidden_sizes)
        actor = torch.nn.Sequential(
            MLP(in_features=obs_dim, out_features=act_dim, num_cells=hidden, activation_class=torch.nn.Tanh),
            torch.nn.Tanh(),
        )
        critic = MLP(in_features=obs_dim, out_features=1, num_cells=hidden, activation_class=torch.nn.Tanh)
        policy = TensorDictSequential(
            TensorDictModule(actor, in_keys=["observation"], out_keys=["action"]),
            TensorDictModule(critic, in_keys=["observation"], out_keys=["state_value"]),
        )
        frames = max(cfg.rollout_len, 64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            collector = collector_cls(tenv, policy, frames_per_batch=frames, total_frames=-1)
        batches = iter(collector)

        def step() -> int:
            return int(next(batches).numel())

        rates = timed_windows(step, lambda: None, _timing(cfg), started_s=t0)
    finally:
        torch.set_num_threads(old_threads)
        if collector is not None:
            collector.shutdown()
    return CaseResult(rates, task.frame_skip, "cpu", extra={"frames_per_batch": frames})


def measure_sample_factory(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    from .sample_factory_peer import run_sample_factory

    return run_sample_factory(env, cfg)


MEASURE: dict[str, Callable[[str, int, BenchmarkConfig], CaseResult]] = {
    "mujoco_rollout": measure_mujoco_rollout,
    "envpool_raw": measure_envpool_raw,
    "gymnasium_sync": measure_gymnasium_sync,
    "gymnasium_async": measure_gymnasium_async,
    "torchrl_collector": measure_torchrl_collector,
    "sample_factory": measure_sample_factory,
}


def fixed_num_envs(name: str, cfg: BenchmarkConfig) -> int:
    """The size a non-sweeping peer runs at."""
    if name == "sample_factory":
        workers = cfg.sample_factory.num_workers or num_threads(cfg)
        return workers * cfg.sample_factory.num_envs_per_worker
    return 1
