"""The three measured stages of sample_fast itself, each through the public APIs a user would call.

* ``env``: ``sample_fast.envs.make`` + ``env.step`` with pre-drawn random actions (simulation and adapter only).
* ``inference``: the double-buffered ``Sampler`` acting with an ``ActorCritic`` (2x256) and writing trajectory
  slots, which are released as soon as they are READY (everything but learning).
* ``train``: the ``Runner`` with an APPO ``Learner``, end to end; rates come from its ``on_train`` hook.

Owns only the timing: every component is built by ``sample_fast.wiring``, exactly as the trainer builds it (the
module-level wrappers here only turn a case into the component configs, and pickle into the Runner's spawned sampler
process). A case whose backend package is missing raises ``Skip`` with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any

import torch

from sample_fast import wiring
from sample_fast.config import EnvConfig, cpu_cores, default_learner_threads
from sample_fast.envs import TASKS, BatchedEnv, EnvError
from sample_fast.envs.atari import is_atari_name
from sample_fast.learner import LearnerConfig
from sample_fast.policy import PolicyConfig
from sample_fast.runner import Runner, RunnerConfig
from sample_fast.sampler import SamplerConfig

from .config import BenchmarkConfig, num_threads
from .measure import CaseResult, MeasureTimeout, Skip, Timing, WindowRecorder, timed_windows


@dataclass(frozen=True)
class Case:
    """One measurement: a stage of one runner (a sample_fast backend or a peer) on one env at one size."""

    stage: str
    kind: str  # "sample_fast" or "peer"
    name: str  # backend or peer name
    env: str
    num_envs: int

    def label(self) -> str:
        return f"{self.stage} · {self.name} · {self.env} · {self.num_envs} envs"


# ----- env construction -----------------------------------------------------------------------------------------
def env_name_for(backend: str, env: str) -> str:
    """The name ``make`` takes for ``env`` on ``backend`` (the gymnasium backend takes gymnasium ids)."""
    if backend == "gymnasium":
        return f"gymnasium:{TASKS[env].gymnasium_id}"
    return env


def compatible(backend: str, env: str) -> str | None:
    """None if ``backend`` can run ``env``, else the reason it cannot."""
    if (backend == "toy") != (env == "toy"):
        return "the toy backend runs only the toy env (and the toy env only the toy backend)"
    atari = is_atari_name(env)
    if atari and backend not in ("envpool", "ale"):
        return "Atari games run on the envpool and ale backends (gymnasium's ALE pipeline is the gymnasium_sync peer)"
    if backend == "ale" and not atari:
        return "the ale backend runs Atari games (<Game>-v5) only"
    return None


def resolve_device(cfg: BenchmarkConfig, backend: str) -> str:
    """mjx, warp (and toy) run on ``cfg.device``; the CPU simulators always on the CPU."""
    if backend not in ("mjx", "warp", "toy"):
        return "cpu"
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def env_options(cfg: BenchmarkConfig, backend: str) -> dict[str, Any]:
    opts = dict(cfg.env_options) if backend != "toy" else {}
    opts.update(cfg.backend_options.get(backend, {}) or {})
    if backend == "mujoco":
        opts.setdefault("num_threads", num_threads(cfg))
    return opts


def build_env(backend: str, env: str, num_envs: int, device: str, seed: int, options: dict[str, Any]) -> BatchedEnv:
    """Module-level (picklable through functools.partial) env builder used by every stage: the trainer's
    ``wiring.build_env`` on this case's ``EnvConfig``. A backend whose package is missing is a skipped case."""
    ecfg = EnvConfig(name=env_name_for(backend, env), backend=backend, device=device, options=dict(options))
    try:
        return wiring.build_env(ecfg, num_envs, seed=seed)
    except EnvError as e:
        if "needs the package" in str(e):
            raise Skip(str(e)) from None
        raise


def _env_fn(cfg: BenchmarkConfig, case: Case, num_envs: int) -> functools.partial:
    device = resolve_device(cfg, case.name)
    return functools.partial(build_env, case.name, case.env, num_envs, device, cfg.seed, env_options(cfg, case.name))


def random_action_bank(env: BatchedEnv, k: int = 8, seed: int = 0) -> list[torch.Tensor]:
    """``k`` batches of uniform random actions within the action spec, drawn once (drawing per step would be
    part of the measurement)."""
    spec, n = env.action_spec, env.num_envs
    gen = torch.Generator().manual_seed(seed)
    bank = []
    for _ in range(k):
        if spec.is_discrete:
            a = torch.randint(0, int(spec.num_actions), (n, *spec.shape), generator=gen)
        else:
            low = spec.low if spec.low is not None else torch.full(spec.shape, -1.0)
            high = spec.high if spec.high is not None else torch.full(spec.shape, 1.0)
            u = torch.rand((n, *spec.shape), generator=gen)
            a = low.cpu() + u * (high.cpu() - low.cpu())
        bank.append(a.to(device=env.device, dtype=spec.dtype))
    return bank


def _timing(cfg: BenchmarkConfig) -> Timing:
    return Timing(cfg.warmup_s, cfg.repeats, cfg.seconds_per_repeat, cfg.measure_timeout_s)


# ----- stage: env ------------------------------------------------------------------------------------------------
def measure_env(case: Case, cfg: BenchmarkConfig) -> CaseResult:
    """env.step with random actions; ``num_envs`` env steps per call."""
    t0 = time.perf_counter()
    env = _env_fn(cfg, case, case.num_envs)()
    try:
        env.reset(seed=cfg.seed)
        bank = random_action_bank(env, seed=cfg.seed)
        state = {"i": 0, "last": None}

        def step() -> int:
            i = state["i"]
            state["last"] = env.step(bank[i % len(bank)])
            state["i"] = i + 1
            return env.num_envs

        def sync() -> None:
            if state["last"] is not None:
                float(state["last"].reward[0])  # SYNC: waits for the device (MJX dispatches asynchronously)

        rates = timed_windows(step, sync, _timing(cfg), started_s=t0)
        return CaseResult(rates, int(env.frame_skip), str(env.device), extra={**_env_extra(env), **gpu_memory(env)})
    finally:
        env.close()


def gpu_memory(env: BatchedEnv) -> dict[str, Any]:
    """GPU memory in use on the env's CUDA device, all allocators and processes together (Warp's and JAX's own pools
    are invisible to torch's counters): ``total - free`` from the driver, and torch's peak. {} on the CPU."""
    if env.device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(env.device)
    return {
        "gpu_mem_used_gib": round((total - free) / 2**30, 3),
        "gpu_mem_total_gib": round(total / 2**30, 3),
        "torch_max_allocated_gib": round(torch.cuda.max_memory_allocated(env.device) / 2**30, 3),
    }


def _env_extra(env: BatchedEnv) -> dict[str, Any]:
    """Per-case facts of the env: obs shape, threads, and for device simulators the compile (or kernel-cache load)
    time, the contact/constraint buffer sizes and whether the step is a CUDA graph."""
    extra: dict[str, Any] = {"obs_shape": list(env.observation_spec.shape)}
    for attr in ("num_threads", "compile_s", "nconmax", "njmax", "cuda_graph"):
        if hasattr(env, attr):
            extra[attr] = getattr(env, attr)
    return extra


# ----- stage: inference (the Sampler) -------------------------------------------------------------------------------
def build_policy(
    observation_spec: Any, action_spec: Any, hidden_sizes: list[int], device: str, rnn: str = "none",
    rnn_size: int = 64, cpu_bf16: str = "never",
) -> torch.nn.Module:  # fmt: skip
    """The trainer's ``wiring.build_policy`` with an MLP (or, on frames, a CNN trunk) of ``hidden_sizes``, with
    ``rnn`` a recurrent core, and a CNN trunk's ``cpu_bf16`` setting (picklable through functools.partial)."""
    cfg = PolicyConfig(hidden_sizes=list(hidden_sizes), rnn=rnn, rnn_size=rnn_size, cpu_bf16=cpu_bf16)
    return wiring.build_policy(observation_spec, action_spec, cfg, device)


def _sampler_overrides(cfg: BenchmarkConfig) -> dict[str, Any]:
    """SamplerConfig fields the suite sets only when asked (else the trainer's defaults are measured)."""
    return {} if cfg.gil_switch_interval_s is None else {"gil_switch_interval_s": cfg.gil_switch_interval_s}


def _splits(num_envs: int, num_splits: int) -> int:
    """``num_splits`` when it divides ``num_envs``, else 1 (the case is still measured, undivided)."""
    return num_splits if num_envs % num_splits == 0 and num_envs >= num_splits else 1


def measure_inference(case: Case, cfg: BenchmarkConfig) -> CaseResult:
    """The serial-mode Sampler (double-buffered env groups + policy.act + slot writes), slots released at once.
    Stage ``inference_rnn``: the same with a recurrent policy (its state kept per env, stored at every slot start)."""
    t0 = time.perf_counter()
    num_splits = _splits(case.num_envs, cfg.num_splits)
    per_split = case.num_envs // num_splits
    scfg = SamplerConfig(
        rollout_len=cfg.rollout_len,
        num_splits=num_splits,
        num_slots=2 * num_splits,
        seed=cfg.seed,
        inference_threads=cfg.torch_threads,
        **_sampler_overrides(cfg),
    )
    env_fn = _env_fn(cfg, case, per_split)
    envs: list[BatchedEnv] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    sampler = None
    try:
        envs = [env_fn() for _ in range(num_splits)]
        first = envs[0]
        rnn = cfg.policy_rnn if case.stage == "inference_rnn" else "none"
        policy = build_policy(first.observation_spec, first.action_spec, cfg.policy_hidden_sizes, str(first.device),
                              rnn, cfg.policy_rnn_size, cfg.policy_cpu_bf16)  # fmt: skip
        store, sampler = wiring.build_sampler(
            envs, policy, scfg, version_fn=lambda: 0, split_seeds=[cfg.seed + i for i in range(num_splits)]
        )
        state = {"first": True}

        def step() -> int:
            sampler.advance(wait_s=0.0)
            slot_idx = store.acquire_ready(timeout_s=0.0)
            while slot_idx is not None:  # no learner: hand READY slots straight back
                store.release(slot_idx)
                slot_idx = store.acquire_ready(timeout_s=0.0)
            if state["first"]:  # the first pass only sends; every later pass receives one step of every split
                state["first"] = False
                return 0
            return case.num_envs

        def sync() -> None:
            if first.device.type == "cuda":
                torch.cuda.synchronize(first.device)  # SYNC: charge the window for queued device work

        rates = timed_windows(step, sync, _timing(cfg), started_s=t0)
        extra = {"num_splits": num_splits, "rollout_len": cfg.rollout_len, "torch_threads": cfg.torch_threads}
        extra.update({k: v for k, v in _env_extra(first).items() if k != "obs_shape"})
        extra.update(gpu_memory(first))
        if policy.is_recurrent:
            extra.update(rnn=rnn, rnn_size=cfg.policy_rnn_size)
        return CaseResult(rates, int(first.frame_skip), str(first.device), extra=extra)
    finally:
        torch.set_num_threads(old_threads)
        if sampler is not None:
            sampler.close()
        else:
            for env in envs:
                env.close()


# ----- stage: train (the Runner) ----------------------------------------------------------------------------------
def build_learner(policy: torch.nn.Module, device: str, overrides: dict[str, Any]) -> Any:
    """The trainer's ``wiring.build_learner`` with ``LearnerConfig(**overrides)`` and a constant learning rate."""
    return wiring.build_learner(policy, LearnerConfig(**overrides), device)


class _RateHooks:
    """RunnerHooks that time windows of ``on_train`` points and stop the run when enough are collected."""

    def __init__(self, timing: Timing, device: torch.device | None = None, min_points: int = 1):
        self.recorder = WindowRecorder(timing, min_points)
        self.runner: Any = None
        self.num_trains = 0
        self.device = device  # a CUDA device: the most GPU memory in use at any on_train (env, policy, learner)
        self.gpu_mem_used_gib = 0.0

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        self.num_trains += 1
        if self.device is not None and self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            self.gpu_mem_used_gib = max(self.gpu_mem_used_gib, round((total - free) / 2**30, 3))
        self.recorder.add(time.perf_counter(), env_steps)
        if self.recorder.done and self.runner is not None:
            self.runner.request_stop()

    def on_episodes(self, env_steps: int, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        pass

    def on_stop(self, env_steps: int, reason: str) -> None:
        pass


def measure_train(case: Case, cfg: BenchmarkConfig) -> CaseResult:
    """Runner + Learner end to end; each window is env steps trained between two ``on_train`` calls."""
    tcfg = cfg.train
    num_splits = _splits(case.num_envs, tcfg.num_splits)
    env_fn = _env_fn(cfg, case, case.num_envs // num_splits)
    probe = build_env(case.name, case.env, 1, resolve_device(cfg, case.name), cfg.seed, env_options(cfg, case.name))
    try:
        obs_spec, act_spec = probe.observation_spec, probe.action_spec
        frame_skip, device = probe.frame_skip, probe.device
        slot_shape = wiring.SlotShape(obs_spec, act_spec, case.num_envs // num_splits, probe.truncation_limit, device)
    finally:
        probe.close()
    scfg = SamplerConfig(
        rollout_len=tcfg.rollout_len,
        num_splits=num_splits,
        num_slots=2 * num_splits,
        seed=cfg.seed,
        inference_threads=cfg.torch_threads,
        weights_refresh=tcfg.weights_refresh,
        **_sampler_overrides(cfg),
    )
    rcfg = RunnerConfig(
        # 0: fitted as sample_fast.config.resolve fits the trainer's (half the cores; every core for an Atari CNN
        # learner on the CPU)
        learner_threads=tcfg.learner_threads or default_learner_threads(case.env, str(device), cpu_cores()),
        learner_sched=tcfg.learner_sched,
        # The sampler's first MJX step compiles (a minute on a busy CPU), which must not read as a stall.
        heartbeat_timeout_s=max(60.0, cfg.measure_timeout_s),
        startup_timeout_s=max(300.0, cfg.measure_timeout_s),
    )
    timing = _timing(cfg)
    if tcfg.warmup_s is not None:
        timing = dataclasses.replace(timing, warmup_s=tcfg.warmup_s)
    hooks = _RateHooks(timing, torch.device(device), min_points=tcfg.window_calls)
    policy_fn = functools.partial(build_policy, obs_spec, act_spec, list(cfg.policy_hidden_sizes), str(device),
                                  cpu_bf16=cfg.policy_cpu_bf16)  # fmt: skip
    learner_fn = functools.partial(build_learner, device=str(device), overrides=dict(tcfg.learner))
    old_threads = torch.get_num_threads()
    try:
        runner = Runner(env_fn, policy_fn, learner_fn, scfg, rcfg, mode=tcfg.mode, hooks=hooks, slot_shape=slot_shape)
        hooks.runner = runner
        summary = runner.run(total_env_steps=2**62, time_limit_s=cfg.measure_timeout_s)
    finally:
        torch.set_num_threads(old_threads)
    if not hooks.recorder.done and summary.get("reason") == "stop_requested":
        raise KeyboardInterrupt  # the Runner turned our SIGINT/SIGTERM into a stop request: end the suite too
    if not hooks.recorder.done:
        got = len(hooks.recorder.rates)
        raise MeasureTimeout(
            f"collected {got}/{cfg.repeats} windows in {cfg.measure_timeout_s:g} s ({hooks.num_trains} train calls, "
            f"{summary.get('env_steps', 0)} env steps); raise measure_timeout_s or lower seconds_per_repeat"
        )
    extra = {
        "mode": tcfg.mode,
        "num_splits": num_splits,
        "rollout_len": tcfg.rollout_len,
        "train_calls": hooks.num_trains,
        "learner": dict(tcfg.learner),
    }
    if hooks.gpu_mem_used_gib:
        extra["gpu_mem_used_gib"] = hooks.gpu_mem_used_gib
    return CaseResult(hooks.recorder.rates, int(frame_skip), str(device), extra=extra)


STAGE_FUNCTIONS = {"env": measure_env, "inference": measure_inference, "train": measure_train,
                   "inference_rnn": measure_inference}  # fmt: skip
