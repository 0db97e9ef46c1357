"""The one place components are built and connected.

Every entry point (``sample_fast.train``, ``sample_fast.eval``, the FPS suite's stages in
``sample_fast.benchmark.stages`` and the scripts under ``benchmarks/``) builds its envs, policy, trajectory store,
sampler, learner and replay memory through these functions, and the ``Runner`` builds its store through
``build_store``. Each builder takes the component's own config dataclass (``EnvConfig``, ``PolicyConfig``,
``SamplerConfig``, ``LearnerConfig``, ``ReplayConfig``), never the root config, so a component can be built alone in
a test or a benchmark exactly as the trainer builds it.

The builders are module-level functions so ``functools.partial`` of them pickles into the async sampler process.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the config module imports the components; importing it here at run time would be circular
    from .config import EnvConfig
    from .learner import Learner, LearnerConfig
    from .policy import PolicyConfig
    from .replay import TrajectoryReplay
    from .replay_config import ReplayConfig
    from .sampler import Sampler, SamplerConfig
    from .trajectory_store import TrajectoryStore

__all__ = [
    "build_env",
    "on_cpu_simulator",
    "probe_specs",
    "SlotShape",
    "probe_slot_shape",
    "build_policy",
    "build_replay",
    "build_learner",
    "build_store",
    "build_sampler",
]


# ----- envs -----------------------------------------------------------------------------------------------------
def build_env(env_cfg: EnvConfig, num_envs: int, seed: int = 0):
    """``num_envs`` copies of the configured env (the runner calls it once per split, with num_envs / num_splits;
    each split is then reset with its own seed). ``env_cfg.num_threads`` becomes the mujoco backend's
    ``num_threads`` option unless the options set it; ``device="auto"`` (an unresolved config) is make's own
    choice."""
    from .envs import make

    options = dict(env_cfg.options)
    if env_cfg.backend == "mujoco" and env_cfg.num_threads:
        options.setdefault("num_threads", env_cfg.num_threads)
    device = None if env_cfg.device == "auto" else env_cfg.device
    return make(env_cfg.name, num_envs, backend=env_cfg.backend, device=device, seed=seed, **options)


def on_cpu_simulator(env_cfg: EnvConfig) -> EnvConfig:
    """The same env on the CPU: an mjx or warp config becomes the MuJoCo C one (same task definition, model options
    and specs), without the options only that backend takes (precision, solver, xla_opt_level, nconmax, ...), which
    the mujoco backend rejects. The split of options comes from the backends' own option tables
    (``sample_fast.envs.backend_options``).
    """
    from .envs import backend_options

    cfg = dataclasses.replace(env_cfg, device="cpu", options=dict(env_cfg.options))
    if env_cfg.backend in ("mjx", "warp"):
        takes = backend_options(env_cfg.name, "mujoco")
        cfg.backend = "mujoco"
        cfg.options = {k: v for k, v in env_cfg.options.items() if k in takes}
    return cfg


def probe_specs(env_cfg: EnvConfig) -> tuple[Any, Any]:
    """Observation and action specs, from a 1-env copy on the CPU simulator (``on_cpu_simulator``: MJX shares the
    task definition, so its specs are the same without paying for a JAX compile here). The trainer probes once and
    hands the specs to every builder."""
    shape = probe_slot_shape(env_cfg, num_envs=1)
    return shape.observation_spec, shape.action_spec


@dataclasses.dataclass(frozen=True)
class SlotShape:
    """What sizes a split's trajectory slots (``build_store`` reads these attributes, which an env also has): the
    specs, the split's env count, the truncation limit (the side table's worst case) and the env's device."""

    observation_spec: Any
    action_spec: Any
    num_envs: int
    truncation_limit: int | None
    device: torch.device


def probe_slot_shape(env_cfg: EnvConfig, num_envs: int) -> SlotShape:
    """The slot shape of a split of ``num_envs`` envs of ``env_cfg``, from the same 1-env CPU probe as
    ``probe_specs`` (specs and truncation limit do not depend on the env count or the backend's device), so the
    async runner sizes its shared store without building a split's envs (an MJX compile) in the main process."""
    probe_cfg = dataclasses.replace(on_cpu_simulator(env_cfg), num_threads=1)
    env = build_env(probe_cfg, num_envs=1)
    try:
        device = torch.device("cpu") if env_cfg.device in ("auto", "") else torch.device(env_cfg.device)
        return SlotShape(env.observation_spec, env.action_spec, int(num_envs), env.truncation_limit, device)
    finally:
        env.close()


# ----- policy and learner -----------------------------------------------------------------------------------------
def build_policy(observation_spec, action_spec, policy_cfg: PolicyConfig, device: str | torch.device | None = None):
    """An ``ActorCritic`` for these specs (on ``device`` when given). Its initial weights come from the caller's
    torch RNG; the async sampler's copy is overwritten from the ParamStore before it acts."""
    from .policy import ActorCritic

    policy = ActorCritic(observation_spec, action_spec, policy_cfg)
    return policy if device is None else policy.to(device)


def build_replay(replay_cfg: ReplayConfig | None, device: str | torch.device, seed: int = 0) -> TrajectoryReplay | None:
    """The prioritized replay memory of the ``replay:`` section, on the learner's device; None when it is off
    (``replay.ratio == 0``: torchrl is then never imported)."""
    if replay_cfg is None or not replay_cfg.ratio:
        return None
    from .replay import TrajectoryReplay

    return TrajectoryReplay(replay_cfg, torch.device(device), seed=seed)


def build_learner(
    policy,
    learner_cfg: LearnerConfig,
    device: str | torch.device,
    total_env_steps: int | float | None = None,
    resume_state: dict | None = None,
    replay_cfg: ReplayConfig | None = None,
) -> Learner:
    """The learner (with its replay memory when ``replay_cfg`` turns it on: ``build_replay``), with policy weights,
    normaliser, optimizer, counters and RNG restored from ``resume_state`` (a checkpoint's dict).
    ``total_env_steps`` drives the learning-rate schedule (None: a constant rate)."""
    from .learner import Learner

    policy = policy.to(device)
    if resume_state is not None:
        policy.load_state_dict(resume_state["policy"])
    replay = build_replay(replay_cfg, device, seed=learner_cfg.seed)
    learner = Learner(policy, learner_cfg, torch.device(device), total_env_steps=total_env_steps, replay=replay)
    if resume_state is not None:
        from .checkpoint import set_rng_state

        learner.load_state_dict(resume_state["learner"])
        set_rng_state(resume_state["rng"])  # continue the random streams where the checkpoint left them
    return learner


# ----- trajectory store and sampler ------------------------------------------------------------------------------
def build_store(
    env, sampler_cfg: SamplerConfig, *, shared: bool = False, ctx: Any = None, policy: Any = None
) -> TrajectoryStore:
    """The trajectory slots for one split of envs like ``env`` (an env or a ``SlotShape``: its specs, per-split env
    count, device and
    ``truncation_limit``, which sizes the final-observation side table for the worst case: None, a gymnasium env
    that may truncate at any step, gives a table with room for every step). A recurrent ``policy`` adds the keys
    its state needs (``rnn_layout``)."""
    from .trajectory_store import TrajectoryStore

    return TrajectoryStore(
        *_store_shape(env, sampler_cfg),
        sampler_cfg.num_slots,
        **_store_layout(env, sampler_cfg, policy),
        device=env.device if not shared else "cpu",
        shared=shared,
        ctx=ctx,
    )


def check_store_fits(env, sampler_cfg: SamplerConfig, policy: Any = None) -> None:
    """Raise ``trajectory_store.SharedMemoryTooSmall`` (naming the fix) if the shared store ``build_store`` would
    allocate for the async runner does not fit in /dev/shm: the trainer asks before it builds a component or starts
    a process (``trajectory_store.check_shared_memory``)."""
    from .trajectory_store import check_shared_memory, store_bytes, trajectory_spec

    spec = trajectory_spec(*_store_shape(env, sampler_cfg), **_store_layout(env, sampler_cfg, policy))
    check_shared_memory(store_bytes(spec, env.observation_spec, sampler_cfg.num_slots))


def _store_shape(env, sampler_cfg: SamplerConfig) -> tuple[Any, Any, int, int]:
    """``(observation_spec, action_spec, rollout_len, num_envs)`` of one split's slots."""
    return env.observation_spec, env.action_spec, sampler_cfg.rollout_len, env.num_envs


def _store_layout(env, sampler_cfg: SamplerConfig, policy: Any) -> dict[str, Any]:
    """The slot-layout keywords of ``TrajectoryStore`` / ``trajectory_spec`` (side table, values, recurrent keys)."""
    return {"max_episode_steps": env.truncation_limit, "store_values": sampler_cfg.store_values, **rnn_layout(policy)}


def rnn_layout(policy: Any) -> dict[str, Any]:
    """The TrajectoryStore arguments a recurrent policy's slots need (the state at the slot start, resets, RL²
    inputs; docs/recurrent.md); none for a feed-forward policy (or None)."""
    shape = getattr(policy, "rnn_state_shape", None)
    return {} if shape is None else {"rnn_state_shape": shape, "rl2": bool(getattr(policy, "rl2", False))}


def build_sampler(envs: list, policy, sampler_cfg: SamplerConfig, **kwargs: Any) -> tuple[TrajectoryStore, Sampler]:
    """A local (serial-mode) store and ``Sampler`` over the split ``envs``; ``kwargs`` go to ``Sampler``
    (version_fn, episodes, split_seeds, ...). On an error the envs are closed."""
    from .sampler import Sampler

    try:
        store = build_store(envs[0], sampler_cfg, policy=policy)
        return store, Sampler(envs, policy, store, sampler_cfg, **kwargs)
    except BaseException:
        for env in envs:
            env.close()
        raise
