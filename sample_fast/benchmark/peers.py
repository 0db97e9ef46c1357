"""Peers measured in the same run as sample_fast, so every figure can be read as a ratio on the same machine.

* ``mujoco_rollout``: raw ``mujoco.rollout.Rollout(nthread=cores)``, one call of ``frame_skip`` physics steps per
  env step, no observation or reward: the physical limit of the CPU for this model.
* ``envpool_raw``: EnvPool's own sync API with numpy actions (MuJoCo, and Atari with our preprocessing).
* ``envpool_raw_async``: EnvPool's async API, ``batch_size = num_envs / 2`` (``recv`` the first half ready, ``send``
  it back): the overlap EnvPool's async mode is known for.
* ``ale_vector_raw``: ale-py's own ``AtariVectorEnv`` (C++ threads) stepped with numpy actions (Atari).
* ``gymnasium_sync`` / ``gymnasium_async``: ``gymnasium.make_vec`` with Sync/AsyncVectorEnv (Atari: ale-py's
  ``ALE/<Game>-v5`` with gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation``, the pure-Python baseline).
* ``torchrl_collector``: torchrl's ``Collector`` over ``GymEnv`` with a 2x256 actor and critic (inference stage).
* ``cleanrl_ppo``: a CleanRL-style PPO on EnvPool Atari (``benchmarks/cleanrl_ppo_atari.py``), a bounded run in a
  subprocess; its per-update SPS are the windows (train stage, Atari).
* ``sample_factory``: Sample Factory's APPO in its own virtualenv (train stage, MuJoCo and Atari), see
  ``sample_factory_peer``.

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
from sample_fast.envs.atari import ATARI_OPTIONS, FRAME_SHAPE, STACK_NUM, game_name, is_atari_name, rom_id

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
            "envpool_raw_async",
            "env",
            True,
            ("envpool",),
            "pip install envpool  (Linux x86_64 wheels only)",
            "EnvPool async API, batch_size = num_envs / 2",
        ),
        PeerInfo(
            "ale_vector_raw",
            "env",
            True,
            ("ale_py",),
            "pip install ale-py",
            "ale-py AtariVectorEnv (C++ threads), numpy actions",
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
            "cleanrl_ppo",
            "train",
            False,
            ("envpool",),
            "pip install envpool  (Linux x86_64 wheels only)",
            "CleanRL-style PPO on EnvPool Atari (benchmarks/cleanrl_ppo_atari.py), 8 envs",
        ),
        PeerInfo(
            "sample_factory",
            "train",
            False,
            (),
            "bash benchmarks/sample_factory/setup_venv.sh  (builds .venv-sf)",
            "Sample Factory 2.x APPO on its mujoco / atari env, own virtualenv",
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
        raise Skip(f"this peer runs the MuJoCo tasks only ({', '.join(sorted(TASKS))}), not {env!r}")
    return TASKS[env]


def _atari(env: str) -> str:
    """The ale-py ROM id of the Atari game ``env`` (``Pong-v5`` -> ``pong``), or Skip for another env."""
    if not is_atari_name(env):
        raise Skip(f"this peer runs Atari games (<Game>-v5) only, not {env!r}")
    return rom_id(env)


#: The Atari preprocessing every Atari peer gets, with sample_fast's defaults (envs.atari.ATARI_OPTIONS).
_ATARI = dict(ATARI_OPTIONS)


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


# ----- envpool_raw / envpool_raw_async --------------------------------------------------------------------------
def _envpool_pool(env: str, num_envs: int, cfg: BenchmarkConfig, batch_size: int) -> tuple[Any, int]:
    """EnvPool's own pool for ``env`` (a MuJoCo task, or an Atari game with sample_fast's preprocessing: 84x84 gray,
    4 stacked frames, frame skip 4 with max-pooling, 30 no-ops, sticky actions 0.25), and its frame skip."""
    import envpool

    nthread = min(num_threads(cfg), num_envs)
    common = dict(env_type="gymnasium", num_envs=num_envs, batch_size=batch_size, num_threads=nthread, seed=cfg.seed)
    if is_atari_name(env):
        _atari(env)
        pool = envpool.make(
            game_name(rom_id(env)),
            **common,
            frame_skip=_ATARI["frame_skip"],
            noop_max=_ATARI["noop_max"],
            repeat_action_probability=_ATARI["repeat_action_probability"],
            reward_clip=False,
            episodic_life=False,
            stack_num=STACK_NUM,
            img_height=FRAME_SHAPE[0],
            img_width=FRAME_SHAPE[1],
            gray_scale=True,
        )
        return pool, _ATARI["frame_skip"]
    task = _task(env)
    return envpool.make(task.envpool_id, **common), task.frame_skip


def _numpy_action_bank(space: Any, num_envs: int, seed: int, k: int = 8) -> list[np.ndarray]:
    if hasattr(space, "n"):  # Discrete
        rng = np.random.default_rng(seed)
        return [rng.integers(0, space.n, size=num_envs, dtype=np.int32) for _ in range(k)]
    return _action_bank(space.low, space.high, num_envs, seed, k)


def _time_action_bank(
    step_fn: Callable[[np.ndarray], Any], bank: list[np.ndarray], steps_per_call: int, cfg: BenchmarkConfig, t0: float
) -> list[float]:
    """Timed windows of ``step_fn(actions)``, cycling through the pre-drawn ``bank``; each call counts
    ``steps_per_call`` env steps."""
    counter = {"i": 0}

    def step() -> int:
        step_fn(bank[counter["i"] % len(bank)])
        counter["i"] += 1
        return steps_per_call

    return timed_windows(step, lambda: None, _timing(cfg), started_s=t0)


def measure_envpool_raw(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    t0 = time.perf_counter()
    pool, frame_skip = _envpool_pool(env, num_envs, cfg, batch_size=num_envs)
    try:
        pool.reset()
        bank = _numpy_action_bank(pool.action_space, num_envs, cfg.seed)
        rates = _time_action_bank(pool.step, bank, num_envs, cfg, t0)
    finally:
        pool.close()
    return CaseResult(rates, frame_skip, "cpu", extra={"num_threads": min(num_threads(cfg), num_envs)})


def measure_envpool_raw_async(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    """EnvPool's async loop: ``recv`` whichever ``num_envs / 2`` envs finished first, ``send`` them new actions, so
    half the pool simulates while the caller works on the other half. Each call counts ``batch_size`` env steps."""
    if num_envs < 2 or num_envs % 2:
        raise Skip(f"the async pool takes half of num_envs per batch; {num_envs} is not even")
    t0 = time.perf_counter()
    batch = num_envs // 2
    pool, frame_skip = _envpool_pool(env, num_envs, cfg, batch_size=batch)
    try:
        pool.async_reset()
        bank = _numpy_action_bank(pool.action_space, batch, cfg.seed)

        def recv_then_send(actions: np.ndarray) -> None:  # the first half that finished gets the new actions
            pool.send(actions, pool.recv()[-1]["env_id"])

        rates = _time_action_bank(recv_then_send, bank, batch, cfg, t0)
    finally:
        pool.close()
    return CaseResult(
        rates, frame_skip, "cpu", extra={"batch_size": batch, "num_threads": min(num_threads(cfg), num_envs)}
    )


# ----- ale_vector_raw ---------------------------------------------------------------------------------------------
def measure_ale_vector_raw(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    """ale-py's ``AtariVectorEnv`` with the same preprocessing as our ``ale`` backend, stepped with numpy actions."""
    t0 = time.perf_counter()
    rom = _atari(env)
    from ale_py.vector_env import AtariVectorEnv

    nthread = min(num_threads(cfg), num_envs)
    vec = AtariVectorEnv(
        game=rom,
        num_envs=num_envs,
        num_threads=nthread,
        frameskip=_ATARI["frame_skip"],
        noop_max=_ATARI["noop_max"],
        repeat_action_probability=_ATARI["repeat_action_probability"],
        img_height=FRAME_SHAPE[0],
        img_width=FRAME_SHAPE[1],
        grayscale=True,
        stack_num=STACK_NUM,
        maxpool=True,
        reward_clipping=False,
    )
    try:
        vec.reset(seed=cfg.seed)
        bank = _numpy_action_bank(vec.single_action_space, num_envs, cfg.seed)
        rates = _time_action_bank(vec.step, bank, num_envs, cfg, t0)
    finally:
        vec.close()
    return CaseResult(rates, _ATARI["frame_skip"], "cpu", extra={"num_threads": nthread})


# ----- gymnasium vector envs --------------------------------------------------------------------------------------
def _measure_gymnasium(env: str, num_envs: int, cfg: BenchmarkConfig, mode: str) -> CaseResult:
    t0 = time.perf_counter()
    import gymnasium

    if mode == "async" and num_envs > cfg.gymnasium_async_max_envs:
        raise Skip(
            f"AsyncVectorEnv starts one process per env; num_envs {num_envs} > gymnasium_async_max_envs "
            f"{cfg.gymnasium_async_max_envs}"
        )
    if is_atari_name(env):
        vec, frame_skip = _gymnasium_atari(env, num_envs, mode), _ATARI["frame_skip"]
    else:
        task = _task(env)
        vec, frame_skip = (
            gymnasium.make_vec(task.gymnasium_id, num_envs=num_envs, vectorization_mode=mode),
            task.frame_skip,
        )
    try:
        vec.reset(seed=cfg.seed)
        bank = _numpy_action_bank(vec.single_action_space, num_envs, cfg.seed)
        rates = _time_action_bank(vec.step, bank, num_envs, cfg, t0)
    finally:
        vec.close()
    return CaseResult(rates, frame_skip, "cpu")


def _gymnasium_atari(env: str, num_envs: int, mode: str) -> Any:
    """ale-py's ``ALE/<Game>-v5`` unskipped (frameskip=1), then gymnasium's own ``AtariPreprocessing`` (frame skip 4
    with max-pooling, 30 no-ops, 84x84 gray) and ``FrameStackObservation(4)``: the pure-Python Atari pipeline."""
    import ale_py
    import gymnasium
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gymnasium.register_envs(ale_py)
    game = game_name(rom_id(env)).removesuffix("-v5")

    def wrap(e: Any) -> Any:
        e = AtariPreprocessing(e, noop_max=_ATARI["noop_max"], frame_skip=_ATARI["frame_skip"], screen_size=84)
        return FrameStackObservation(e, STACK_NUM)

    return gymnasium.make_vec(
        f"ALE/{game}-v5",
        num_envs=num_envs,
        vectorization_mode=mode,
        wrappers=[wrap],
        frameskip=1,
        repeat_action_probability=_ATARI["repeat_action_probability"],
    )


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


def measure_cleanrl_ppo(env: str, num_envs: int, cfg: BenchmarkConfig) -> CaseResult:
    from .cleanrl_peer import run_cleanrl

    _atari(env)
    return run_cleanrl(env, cfg)


MEASURE: dict[str, Callable[[str, int, BenchmarkConfig], CaseResult]] = {
    "mujoco_rollout": measure_mujoco_rollout,
    "envpool_raw": measure_envpool_raw,
    "envpool_raw_async": measure_envpool_raw_async,
    "ale_vector_raw": measure_ale_vector_raw,
    "gymnasium_sync": measure_gymnasium_sync,
    "gymnasium_async": measure_gymnasium_async,
    "torchrl_collector": measure_torchrl_collector,
    "cleanrl_ppo": measure_cleanrl_ppo,
    "sample_factory": measure_sample_factory,
}


def fixed_num_envs(name: str, cfg: BenchmarkConfig, env: str | None = None) -> int:
    """The size a non-sweeping peer runs at."""
    if name == "sample_factory":
        workers = cfg.sample_factory.num_workers or num_threads(cfg)
        if env is not None and is_atari_name(env):
            return workers * max(1, cfg.sample_factory.atari_num_envs // workers)
        return workers * cfg.sample_factory.num_envs_per_worker
    if name == "cleanrl_ppo":
        return cfg.cleanrl.num_envs
    return 1
