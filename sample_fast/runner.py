"""Runner: builds and wires the sampler, the TrajectoryStore, the ParamStore and the learner, and owns their lifetime.

``serial``: one process, one loop (sample until a slot is READY, train on it). ``async``: the sampler (its envs and a
policy copy) runs in a child process started with ``spawn``; the learner, hooks, logging and checkpoints stay here.
The runner owns the child process, heartbeats, stall detection (with stack dumps), error propagation and shutdown:
every wait is bounded, and normal exit, an exception, Ctrl-C or SIGTERM leave no process and no shared memory.

Elastic sampler (async): a sampler process that dies (kill -9, a crash in native code, an exception) or stops sending
heartbeats is replaced. The runner kills and joins it, gives the TrajectoryStore a fresh lock and puts the dead
process's partial (FILLING) slots back to FREE, re-poisoned (READY slots are complete and still trained on), and
starts a new process, which rebuilds its envs and resets them with fresh seeds; the learner keeps its weights,
optimizer and counters throughout. Each restart is logged with its cause and reported to ``hooks.on_sampler_restart``.
More than ``RunnerConfig.max_sampler_restarts`` restarts within ``restart_window_s`` raise SamplerRestartLimit. A
first process that fails with an exception before it was ever ready is not restarted (a broken env or policy would
fail again): that is a SamplerError at once. Serial mode has no sampler process, hence no restarts.

Learner scheduling (async, Linux; ``RunnerConfig.learner_sched``): ``batch`` or ``idle`` moves every thread of this
process to SCHED_BATCH or SCHED_IDLE once the first sampler process is started, so a sampler that keeps the cores busy
is not preempted by the learner, which trains on the CPU time left over (the sampler blocks when no slot is FREE, so
the learner always gets its turn). Every sampler process, replacements included, is started from a helper thread
that keeps SCHED_OTHER (``procs.KeptPolicyThread``): a child inherits its forking thread's policy. At shutdown the
threads go back to SCHED_OTHER where the OS allows it: always from batch, from idle only with CAP_SYS_NICE (root) or
RLIMIT_NICE >= 20; otherwise the calling process's threads stay idle after ``run`` returns (the trainer exits then).
"""

from __future__ import annotations

import collections
import concurrent.futures
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from sample_fast.param_store import ParamStore
from sample_fast.procs import (
    CTRL_LEARNER_HEARTBEAT,
    CTRL_SAMPLER_HEARTBEAT,
    CTRL_SAMPLER_READY,
    CTRL_SAMPLER_SLOTS,
    CTRL_SAMPLER_STEPS,
    CTRL_SAMPLER_WAIT_S,
    CTRL_STOP,
    SCHED_POLICIES,
    KeptPolicyThread,
    SharedRngState,
    StackDumpFile,
    ignore_stop_signals,
    keep_freed_memory,
    new_control,
    pid_alive,
    register_stack_dump,
    sched_policy,
    set_parent_death_signal,
    set_threads_sched,
    start_resource_tracker,
    stop_signals_blocked,
)
from sample_fast.sampler import EpisodeRing, Sampler, SamplerConfig, acting_device, build_split_envs
from sample_fast.trajectory_store import StoreLockTimeout, TrajectoryStore
from sample_fast.wiring import build_sampler, build_store

MODES = ("serial", "async")
log = logging.getLogger(__name__)


@dataclass
class RunnerConfig:
    """The runner's process and timeout settings (``runner.*``): how the sampler process is started, watched and
    stopped, and the learner process's threads. What the sampler collects is ``SamplerConfig``."""

    poll_s: float = 0.2  #: granularity of every wait: stop requests and liveness are checked this often
    heartbeat_timeout_s: float = 60.0  #: no sampler heartbeat for this long -> stack dump + error
    startup_timeout_s: float = 300.0  #: the sampler process must build its envs and policy within this
    shutdown_timeout_s: float = 10.0  #: graceful join before kill
    learner_stall_dump_s: float = 600.0  #: dump the main process's stacks if one train() step takes longer
    mp_start_method: str = "spawn"  #: spawn or forkserver (never fork: torch/JAX threads exist before it)
    learner_threads: int = 0  #: torch intra-op threads of the learner process; 0 = leave as the caller set it
    episode_capacity: int = 65536  #: finished-episode ring size (sampler -> main); overflow is counted, not fatal
    #: async: a sampler process that dies or stalls is replaced, at most this many times within restart_window_s;
    #: one failure more stops the run (SamplerRestartLimit). 0: the first failure stops it
    max_sampler_restarts: int = 3
    restart_window_s: float = 600.0  #: the sliding window max_sampler_restarts counts restarts in
    #: async, Linux: the scheduling policy of the learner process's threads once its sampler runs: normal
    #: (SCHED_OTHER), batch (SCHED_BATCH) or idle (SCHED_IDLE: the learner gets only the CPU time no sampler thread
    #: wants, so a sampler that saturates the cores is never preempted by it). Sampler processes, replacements
    #: included, are started from a thread that keeps normal. One-way for idle without CAP_SYS_NICE: see Runner.
    learner_sched: str = "normal"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        ec = self.episode_capacity
        if not isinstance(ec, int) or isinstance(ec, bool) or ec < 1:
            raise ValueError(f"runner.episode_capacity must be a positive int, got {ec!r}")
        if not isinstance(self.learner_threads, int) or self.learner_threads < 0:
            raise ValueError(f"runner.learner_threads must be an int >= 0, got {self.learner_threads!r}")
        m = self.max_sampler_restarts
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"runner.max_sampler_restarts must be an int >= 0 (0: never restart), got {m!r}")
        if self.learner_sched not in SCHED_POLICIES:
            raise ValueError(
                f"runner.learner_sched must be one of {', '.join(SCHED_POLICIES)}, got {self.learner_sched!r}"
            )
        sched_policy(self.learner_sched)  # ValueError naming the fix where the OS has no such policy
        if self.mp_start_method not in ("spawn", "forkserver"):
            raise ValueError(f"runner.mp_start_method must be spawn or forkserver, got {self.mp_start_method!r}")
        for name in (
            "poll_s",
            "heartbeat_timeout_s",
            "startup_timeout_s",
            "shutdown_timeout_s",
            "learner_stall_dump_s",
            "restart_window_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"runner.{name} must be > 0, got {getattr(self, name)!r}")


class SamplerError(RuntimeError):
    """The sampler process failed, died or stalled. The message carries its traceback or stack dump.

    ``kind``: ``exception`` (it raised; its traceback follows), ``died`` (a signal: killed, or crashed in native
    code), ``exited`` (a non-zero exit status without a traceback), ``stalled`` (no heartbeat, or the store's lock
    held too long) or ``startup`` (not ready within the timeout)."""

    def __init__(self, message: str, kind: str = "died") -> None:
        super().__init__(message)
        self.kind = kind


class SamplerRestartLimit(SamplerError):
    """More sampler failures within ``runner.restart_window_s`` than ``runner.max_sampler_restarts`` allows."""


class RunnerHooks:
    """Callbacks from the runner's loop, all optional and all called in the main (learner) process."""

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        """After each ``learner.train``; ``metrics`` adds policy_lag_min/mean/max, fps and wait times."""

    def on_episodes(self, env_steps: int, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        """Finished episodes since the last call: ``returns [n]`` float32, ``lengths [n]`` int64."""

    def on_stop(self, env_steps: int, reason: str) -> None:
        """Before shutdown (the sampler is still alive): save a final checkpoint here."""

    def on_sampler_restart(self, env_steps: int, cause: str, restarts: int) -> None:
        """A new sampler process replaces one that failed (``cause``: one line); ``restarts`` in this run so far."""


#: split seeds of the n-th replacement sampler process: seed + i + n * RESTART_SEED_STRIDE (fresh initial states)
RESTART_SEED_STRIDE = 1_000_003


def _split_seeds(cfg: SamplerConfig, generation: int = 0) -> list[int]:
    if cfg.seed is not None:
        return [cfg.seed + i + generation * RESTART_SEED_STRIDE for i in range(cfg.num_splits)]
    return [int(s) for s in torch.randint(0, 2**31 - 1, (cfg.num_splits,))]


def _sampler_main(
    env_fn: Callable,
    policy_fn: Callable,
    store: TrajectoryStore,
    param_store: ParamStore,
    episodes: EpisodeRing,
    control: torch.Tensor,
    cfg: SamplerConfig,
    poll_s: float,
    split_seeds: list[int],
    torch_seed: int,
    rng_state: torch.Tensor | None,
    rng_shared: SharedRngState,
    err_conn: Any,
    dump_fd: int,
    parent_pid: int,
    slot_hook: Callable[[int], None] | None = None,
) -> None:
    """Entry point of the async sampler process. Its torch RNG (the policy's action noise) starts from ``rng_state``
    (a resumed run's checkpoint, or the state the process it replaces last published) or ``torch_seed``, and is
    published to ``rng_shared`` after every pass of the loop that finished a slot, for the runner's checkpoints.
    ``slot_hook(n)`` runs after each READY slot, n counting the slots of every sampler process of this run."""
    dump_handle = _enter_sampler_process(dump_fd, cfg.inference_threads, torch_seed, rng_state)
    envs, sampler = [], None
    try:
        if not pid_alive(parent_pid) or control[CTRL_STOP] != 0:
            return  # the runner died before the death signal was armed, or stopped during our start-up
        envs = build_split_envs(env_fn, cfg.num_splits)
        sampler = _start_sampler(envs, policy_fn, store, param_store, episodes, control, cfg, split_seeds)
        rng_shared.write(torch.get_rng_state())
        # INVARIANT: a fresh heartbeat before READY: the runner checks heartbeats from READY on, and the last one was
        # the runner's own at spawn time -- a start-up longer than heartbeat_timeout_s read as a stall at once
        control[CTRL_SAMPLER_HEARTBEAT] = time.time()
        control[CTRL_SAMPLER_READY] = 1.0
        _sampler_loop(sampler, control, poll_s, rng_shared, parent_pid, slot_hook)
    except BaseException:
        try:
            err_conn.send(traceback.format_exc()[-30000:])
        except Exception:
            pass
        raise
    finally:
        try:
            if sampler is not None:
                sampler.close()
            else:
                for env in envs:
                    env.close()
        finally:
            err_conn.close()
            if dump_handle is not None:
                faulthandler.unregister(signal.SIGUSR1)
                os.close(dump_handle)


def _enter_sampler_process(
    dump_fd: int, threads: int, torch_seed: int, rng_state: torch.Tensor | None
) -> int | None:  # fmt: skip
    """The sampler process's signals, parent-death signal, stack-dump handler (its handle, for the caller to close),
    torch threads and RNG."""
    # SIGINT/SIGTERM/SIGHUP (Ctrl-C, `kill -- -PGID`, a closed terminal reach the whole group) go to the runner,
    # which saves a final checkpoint and then stops us through ``control``. We were started with them blocked
    # (Runner._start), so one that arrived while this process was still importing is discarded here.
    ignore_stop_signals()
    # Our OS parent's death (runner, or forkserver) takes us down too; SIGKILL, since SIGTERM is ignored now.
    set_parent_death_signal(signal.SIGKILL)
    dump_handle = register_stack_dump(dump_fd)  # the runner sends SIGUSR1 when our heartbeat stops
    torch.set_num_threads(threads)
    torch.manual_seed(torch_seed)
    if rng_state is not None:
        torch.set_rng_state(rng_state)
    return dump_handle


def _start_sampler(
    envs: list, policy_fn: Callable, store: TrajectoryStore, param_store: ParamStore, episodes: EpisodeRing,
    control: torch.Tensor, cfg: SamplerConfig, split_seeds: list[int],
) -> Sampler:  # fmt: skip
    """The process's Sampler on ``envs``, its policy on the acting device, its counters continued from ``control``."""
    policy = policy_fn().to(acting_device(cfg.device))  # sampler.device: e.g. a CNN acts on the learner's GPU
    sampler = Sampler(
        envs, policy, store, cfg, param_store=param_store, episodes=episodes, control=control, split_seeds=split_seeds
    )
    # a replacement process continues the counters of the one before it
    sampler.env_steps, sampler.wait_s = int(control[CTRL_SAMPLER_STEPS]), float(control[CTRL_SAMPLER_WAIT_S])
    return sampler


def _sampler_loop(
    sampler: Sampler, control: torch.Tensor, poll_s: float, rng_shared: SharedRngState, parent_pid: int,
    slot_hook: Callable[[int], None] | None,
) -> None:  # fmt: skip
    """Advance until the runner sets CTRL_STOP or is gone; at each READY slot publish the RNG state, count the slot
    in ``control`` and call ``slot_hook``."""
    next_parent_check_s = 0.0
    while control[CTRL_STOP] == 0:
        num_ready = sampler.advance(wait_s=poll_s)
        if num_ready:  # a slot became READY: publish the RNG state at this boundary
            rng_shared.write(torch.get_rng_state())  # PERF: a 5 KB copy per slot, never a wait
            for _ in range(num_ready):  # the splits of one pass may finish together: one call per slot
                control[CTRL_SAMPLER_SLOTS] += 1
                if slot_hook is not None:
                    slot_hook(int(control[CTRL_SAMPLER_SLOTS]))
        now = time.monotonic()
        if now >= next_parent_check_s:  # the runner (not necessarily our OS parent: forkserver) still there?
            if not pid_alive(parent_pid):
                break
            next_parent_check_s = now + 0.5


class Runner:
    """Wires env, sampler, stores and learner; runs the training loop. See the module docstring.

    Args:
        env_fn: builds ONE split's env group: called ``sampler_cfg.num_splits`` times (so it returns
            ``num_envs / num_splits`` envs); each split is then reset with its own seed. Picklable.
        policy_fn: builds an ActorCritic (the learner's here; the sampler's acting copy in the child). Picklable.
        learner_fn: ``learner_fn(policy) -> Learner``. Called here only.
        sampler_cfg: SamplerConfig (what the sampler collects).
        runner_cfg: RunnerConfig (process start, liveness, timeouts, learner threads); None: its defaults.
        mode: ``"serial"`` or ``"async"``.
        hooks: RunnerHooks (or any object with some of its methods).
        sampler_rng_state: the sampler's torch RNG state to start from (``sampler_rng_state()`` of the run being
            resumed); None: async draws a fresh seed for the sampler process, serial leaves the process RNG as is.
        sampler_hook: async only: ``sampler_hook(n)`` is called in the sampler process after its n-th READY slot
            (n counts the slots of every sampler process of this run). Picklable. For fault injection
            (``debug.inject=sampler_crash@slot:<n>``); None: nothing.
        slot_shape: async only: a ``wiring.SlotShape`` of one split (``wiring.probe_slot_shape``), which sizes the
            shared store; None: one split's envs are built here to size it (and closed again), which for MJX or Warp
            means a compile in this process as well as in the sampler's. Serial mode builds its envs here anyway.
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policy_fn: Callable[[], torch.nn.Module],
        learner_fn: Callable[[torch.nn.Module], Any],
        sampler_cfg: SamplerConfig,
        runner_cfg: RunnerConfig | None = None,
        mode: str = "async",
        hooks: RunnerHooks | None = None,
        sampler_rng_state: torch.Tensor | None = None,
        sampler_hook: Callable[[int], None] | None = None,
        slot_shape: Any = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        sampler_cfg.validate()
        runner_cfg = runner_cfg if runner_cfg is not None else RunnerConfig()
        runner_cfg.validate()
        self.env_fn, self.policy_fn, self.cfg, self.mode = env_fn, policy_fn, sampler_cfg, mode
        self.rcfg = runner_cfg
        self.hooks = hooks if hooks is not None else RunnerHooks()
        if runner_cfg.learner_threads:
            torch.set_num_threads(runner_cfg.learner_threads)
        self.policy = policy_fn()
        self.learner = learner_fn(self.policy)
        if mode == "serial" and runner_cfg.learner_sched != "normal":
            raise ValueError(
                f"runner.learner_sched={runner_cfg.learner_sched} needs mode=async: in serial mode the sampler runs in "
                "the learner's threads (use runner.learner_sched=normal)"
            )
        if mode == "serial" and sampler_cfg.device != "auto":
            first = next(iter(self.policy.parameters()), None)
            learner_device = first.device if first is not None else torch.device("cpu")
            want = acting_device(sampler_cfg.device)
            if want.type != learner_device.type or want.index not in (None, learner_device.index):
                raise ValueError(
                    f"sampler.device={sampler_cfg.device!r}, but serial mode acts with the learner's policy on "
                    f"{learner_device}: use sampler.device=auto (or run.mode=async for a separate acting copy)"
                )
        self.env_steps = 0
        self.store: TrajectoryStore | None = None
        self.param_store: ParamStore | None = None
        self.sampler: Sampler | None = None
        self.process: Any = None
        self._stop_requested = False
        self._num_trains = 0
        self._published_version = -1
        self._err_conn: Any = None
        self._dump: StackDumpFile | None = None
        self._learner_wait_s = 0.0
        self._initial_sampler_rng = None if sampler_rng_state is None else sampler_rng_state.clone()
        self._rng_shared: SharedRngState | None = None
        self._sampler_hook = sampler_hook
        self._slot_shape = slot_shape  # async: sizes the shared store instead of a probe split built here
        self.sampler_restarts = 0  #: sampler processes replaced in this run
        self._failures: collections.deque[float] = collections.deque()  # monotonic times, within restart_window_s
        self._generation = 0  # 0: the first sampler process; n: its n-th replacement
        self._spawner: KeptPolicyThread | None = None  # learner_sched != normal: starts the sampler processes

    # ----- public ---------------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the loop to stop after the current step. Safe from a signal handler (it only sets a flag)."""
        self._stop_requested = True

    def sampler_rng_state(self) -> torch.Tensor | None:
        """The torch RNG state the sampler's action noise continues from, for a checkpoint (CPU generator).

        Serial: the sampler acts in this process, so this is this process's RNG now. Async: the state the sampler
        process published at its last slot boundary (the draws since then are of slots not yet READY, which a stop
        discards), or its starting state before the first; None before the process started."""
        if self.mode == "serial":
            return torch.get_rng_state()
        return None if self._rng_shared is None else self._rng_shared.read()

    def run(self, total_env_steps: int, time_limit_s: float | None = None, start_env_steps: int = 0) -> dict:
        """Train until ``total_env_steps`` (counted from 0, starting at ``start_env_steps``), ``time_limit_s`` or a
        stop request. Returns ``{env_steps, wall_s, fps, reason, ...}``. Raises SamplerError if the sampler fails."""
        if self.store is not None:
            raise RuntimeError("Runner.run() can be called once; build a new Runner to train again")
        self.env_steps = self._start_env_steps = int(start_env_steps)
        self._t0 = time.monotonic()
        old_handlers = self._install_signal_handlers()
        reason = "error"
        try:
            self._start()
            reason = self._loop(total_env_steps, time_limit_s)
        except BaseException as e:
            reason = f"error: {type(e).__name__}: {e}"[:500]
            self._stop_hook(reason, raising=False)
            raise
        else:
            self._drain_episodes()  # episodes finished since the last train step still reach the hooks
            self._stop_hook(reason, raising=True)
        finally:
            faulthandler.cancel_dump_traceback_later()
            self._shutdown()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        return self._summary(reason)

    # ----- start ----------------------------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.cfg
        keep_freed_memory()  # the learner here, the sampler through the environment it inherits (procs.py)
        if self.mode == "async" and self._slot_shape is not None:
            first = self._slot_shape  # the envs are built in the sampler process only
        else:
            first = self.env_fn()  # probe: specs and the per-split env count decide the slot shapes
        if self.mode == "serial":
            if self._initial_sampler_rng is not None:
                torch.set_rng_state(self._initial_sampler_rng)  # the sampler draws its action noise from our RNG
            envs = build_split_envs(self.env_fn, cfg.num_splits, first=first)
            self.episodes = EpisodeRing(self.rcfg.episode_capacity, shared=False)
            self.store, self.sampler = build_sampler(
                envs,
                self.policy,
                cfg,
                version_fn=self._learner_version,
                episodes=self.episodes,
                split_seeds=_split_seeds(cfg),
            )
            return
        self._ctx = ctx = mp.get_context(self.rcfg.mp_start_method)
        start_resource_tracker()  # before the store's semaphores register with it: it must survive a group SIGHUP
        try:  # the probe's specs, per-split count and truncation_limit size the slots (wiring.build_store)
            self.store = build_store(first, cfg, shared=True, ctx=ctx, policy=self.policy)
        finally:
            if first is not self._slot_shape:
                first.close()
        self.param_store = ParamStore(self.policy)
        self._publish()
        self.episodes = EpisodeRing(self.rcfg.episode_capacity, shared=True)
        self.control = new_control(shared=True)
        self._rng_shared = SharedRngState()
        if self.rcfg.learner_sched != "normal":
            self._spawner = KeptPolicyThread("sample_fast-spawner", timeout_s=self.rcfg.startup_timeout_s)
        self._spawn_sampler(self._initial_sampler_rng)
        if self._spawner is not None:
            moved = set_threads_sched(sched_policy(self.rcfg.learner_sched), skip={self._spawner.native_id})
            log.info("learner threads %s now %s (runner.learner_sched=%s)", moved,
                     SCHED_POLICIES[self.rcfg.learner_sched], self.rcfg.learner_sched)  # fmt: skip

    def _spawn_sampler(self, rng_state: torch.Tensor | None) -> None:
        """Start a sampler process (the first, or the replacement of one that failed) on the shared stores."""
        ctx = self._ctx
        err_recv, err_send = ctx.Pipe(duplex=False)
        self._dump = StackDumpFile()  # no name on disk: nothing is left in /tmp even after a kill -9 of this process
        self._err_conn = err_recv
        self.control[CTRL_STOP] = 0.0
        self.control[CTRL_SAMPLER_READY] = 0.0
        self.control[CTRL_SAMPLER_HEARTBEAT] = time.time()
        args = (
            self.env_fn,
            self.policy_fn,
            self.store,
            self.param_store,
            self.episodes,
            self.control,
            self.cfg,
            self.rcfg.poll_s,
            _split_seeds(self.cfg, self._generation),
            int(torch.randint(0, 2**31 - 1, ())),
            rng_state,
            self._rng_shared,
            err_send,
            self._dump.child_handle(),
            os.getpid(),
            self._sampler_hook,
        )
        process = ctx.Process(target=_sampler_main, args=args, name="sample_fast-sampler", daemon=True)
        self._sampler_started_s = time.monotonic()
        try:
            if self._spawner is None:
                with stop_signals_blocked():  # the child is born with them blocked (procs.stop_signals_blocked)
                    process.start()
            else:  # the child inherits the forking thread's policy: the spawner's normal one, signals blocked
                # (a start() still running after the timeout leaves a child that its parent-death signal takes down)
                try:
                    self._spawner.call(process.start, timeout_s=self.rcfg.startup_timeout_s)
                except concurrent.futures.TimeoutError:
                    raise SamplerError(
                        f"starting the sampler process took longer than runner.startup_timeout_s="
                        f"{self.rcfg.startup_timeout_s:g}", kind="startup",
                    ) from None  # fmt: skip
        finally:
            err_send.close()  # the child holds the only write end: EOF on our side means it is gone
        self.process = process

    # ----- loop -----------------------------------------------------------------------------------------------
    def _loop(self, total_env_steps: int, time_limit_s: float | None) -> str:
        while True:
            if self.mode == "async":
                self.control[CTRL_LEARNER_HEARTBEAT] = time.time()  # read by monitoring (bench), cheap
            if self._stop_requested:
                return "stop_requested"
            if self.env_steps >= total_env_steps:
                return "total_env_steps"
            if time_limit_s is not None and time.monotonic() - self._t0 >= time_limit_s:
                return "time_limit"
            try:
                slot_idx = self._next_ready_slot()
                if slot_idx is not None:
                    self._train_on(slot_idx)
            except SamplerError as e:
                self._replace_sampler(e)  # raises when it must not (or may no longer) be replaced

    def _next_ready_slot(self) -> int | None:
        store = self.store
        if self.mode == "serial":
            slot_idx = store.acquire_ready(timeout_s=0.0)
            while slot_idx is None and not self._stop_requested:
                self.sampler.advance(wait_s=0.0)
                slot_idx = store.acquire_ready(timeout_s=0.0)
            return slot_idx
        t0 = time.monotonic()
        slot_idx = store.acquire_ready(timeout_s=self.rcfg.poll_s)  # SYNC: bounded wait for the sampler
        self._learner_wait_s += time.monotonic() - t0
        if slot_idx is None:
            self._check_sampler()
        return slot_idx

    def _train_on(self, slot_idx: int) -> None:
        store, cfg = self.store, self.cfg
        batch = store.slot(slot_idx)
        try:
            if cfg.check_slots:
                store.check_written(slot_idx)
            lag = (self._learner_version() - batch["policy_version"]).to(torch.float64)
            faulthandler.dump_traceback_later(self.rcfg.learner_stall_dump_s, exit=False)  # a hung train() dumps stacks
            metrics = dict(self.learner.train(batch))
            faulthandler.cancel_dump_traceback_later()
        finally:
            try:
                store.release(slot_idx)  # INVARIANT: the learner keeps no reference into the slot after train()
            except StoreLockTimeout as e:  # the sampler died or is stopped inside the lock: replace it
                if self.mode == "serial":
                    raise
                # A kill -9 that lands inside the lock's microseconds is still a death: name it and its signal.
                self._check_sampler()
                raise SamplerError(f"the sampler process (pid {self.process.pid}) held the store's lock: {e}",
                                   kind="stalled") from None  # fmt: skip
        self._num_trains += 1
        self.env_steps += store.rollout_len * store.num_envs
        if self.param_store is not None:
            self._publish()
        wall_s = time.monotonic() - self._t0
        metrics.update(
            policy_lag_min=float(lag.min()),
            policy_lag_mean=float(lag.mean()),
            policy_lag_max=float(lag.max()),
            fps=(self.env_steps - self._start_env_steps) / max(wall_s, 1e-9),
            learner_wait_s=self._learner_wait_s,
            sampler_wait_s=self._sampler_stat(CTRL_SAMPLER_WAIT_S),
        )
        self._hook("on_train", self.env_steps, metrics)
        self._drain_episodes()
        if self.mode == "async":
            self._check_sampler()

    def _drain_episodes(self) -> None:
        returns, lengths = self.episodes.drain()
        if returns.numel():
            self._hook("on_episodes", self.env_steps, returns, lengths)

    # ----- versions -------------------------------------------------------------------------------------------
    def _learner_version(self) -> int:
        version = getattr(self.learner, "policy_version", None)
        return int(version) if version is not None else self._num_trains

    def _publish(self) -> None:
        version = self._learner_version()
        if version != self._published_version:
            self._published_version = self.param_store.publish(self.policy, version=version)

    def _sampler_stat(self, idx: int) -> float:
        if self.mode == "serial":
            return self.sampler.wait_s if idx == CTRL_SAMPLER_WAIT_S else float(self.sampler.env_steps)
        return float(self.control[idx])

    # ----- liveness -------------------------------------------------------------------------------------------
    def _check_sampler(self) -> None:
        """Raise SamplerError if the sampler process reported an error, died, or stopped sending heartbeats."""
        proc = self.process
        closed = False
        if self._err_conn.poll():
            tb = self._recv_error()
            if tb:
                raise SamplerError(
                    f"the sampler process (pid {proc.pid}) raised an exception; its traceback:\n{tb}", kind="exception"
                )
            closed = True  # EOF: the child closed its end, i.e. it is exiting
        if closed or not proc.is_alive():
            proc.join(timeout=2.0)
            code = proc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise SamplerError(
                f"the sampler process (pid {proc.pid}) died with {how} (no traceback: killed, or crashed in native "
                "code; a kill -9 by the OOM killer shows in `dmesg`)",
                kind="died" if code is not None and code < 0 else "exited",
            )
        if self.control[CTRL_SAMPLER_READY] == 0:
            waited = time.monotonic() - self._sampler_started_s
            if waited > self.rcfg.startup_timeout_s:
                self._raise_stalled(
                    "did not build its envs and policy within "
                    f"runner.startup_timeout_s={self.rcfg.startup_timeout_s:g}",
                    kind="startup",
                )
            return
        age = time.time() - float(self.control[CTRL_SAMPLER_HEARTBEAT])
        if age > self.rcfg.heartbeat_timeout_s:
            self._raise_stalled(
                f"sent no heartbeat for {age:.1f} s (runner.heartbeat_timeout_s={self.rcfg.heartbeat_timeout_s:g})"
            )

    def _recv_error(self) -> str:
        try:
            return str(self._err_conn.recv())
        except (EOFError, OSError):
            return ""

    def _raise_stalled(self, what: str, kind: str = "stalled") -> None:
        pid = self.process.pid
        try:
            os.kill(pid, signal.SIGUSR1)  # faulthandler in the child writes every thread's stack to the dump file
        except OSError:
            pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not self._dump.read():
            time.sleep(0.05)
        time.sleep(0.1)
        dump = self._dump.read() or "(no stack dump was written)"
        raise SamplerError(f"the sampler process (pid {pid}) {what}; its stacks:\n{dump}", kind=kind)

    # ----- restarts -------------------------------------------------------------------------------------------
    def _replace_sampler(self, error: SamplerError) -> None:
        """Replace the failed sampler process (see the module docstring), or raise: ``error`` itself when it must
        not be replaced (serial mode; a first process that raised or timed out before it was ever ready), a
        SamplerRestartLimit when the restarts within the window are used up."""
        if self.mode != "async":
            raise error
        first_never_ready = self._generation == 0 and self.control[CTRL_SAMPLER_READY] == 0
        if first_never_ready and error.kind in ("exception", "exited", "startup"):
            raise error
        cause = str(error).splitlines()[0]
        now = time.monotonic()
        self._failures.append(now)
        while now - self._failures[0] > self.rcfg.restart_window_s:
            self._failures.popleft()
        limit, window = self.rcfg.max_sampler_restarts, self.rcfg.restart_window_s
        if len(self._failures) > limit:
            self._reap_sampler(graceful=False)  # dead or stalled: no graceful wait at shutdown
            raise SamplerRestartLimit(
                f"the sampler process failed {len(self._failures)} times within runner.restart_window_s={window:g} s, "
                f"more than runner.max_sampler_restarts={limit} allows: the run stops. Fix the cause (a crash in the "
                "env or the policy, memory: `dmesg`), or raise runner.max_sampler_restarts. The last failure: "
                f"{error}",
                kind=error.kind,
            ) from error
        detail = str(error).split("\n", 1)[1] if "\n" in str(error) else ""
        log.warning(
            "%s; restarting it (restart %d of this run; %d of runner.max_sampler_restarts=%d within "
            "runner.restart_window_s=%g s)%s", cause, self.sampler_restarts + 1, len(self._failures), limit, window,
            f"\n{detail}" if detail else "",
        )  # fmt: skip
        self._reap_sampler(graceful=False)
        rng_state = self._rng_shared.read(timeout_s=0.1)  # the stream continues where it was last published
        self._rng_shared.reset()
        self.store.replace_writer()  # fresh lock; its partial slots back to FREE, re-poisoned
        self._generation += 1
        self.sampler_restarts += 1
        self._spawn_sampler(rng_state)
        self._hook("on_sampler_restart", self.env_steps, cause, self.sampler_restarts)

    # ----- stop -----------------------------------------------------------------------------------------------
    def _hook(self, name: str, *args: Any) -> None:
        fn = getattr(self.hooks, name, None)  # every hook is optional
        if fn is not None:
            fn(*args)

    def _stop_hook(self, reason: str, raising: bool) -> None:
        try:
            self._hook("on_stop", self.env_steps, reason)
        except Exception:
            if raising:
                raise
            print(f"hooks.on_stop failed while stopping after an error:\n{traceback.format_exc()}", file=sys.stderr)

    def _shutdown(self) -> None:
        """Stop and join the sampler (graceful, then terminate, then kill) and release every resource."""
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None
        self._reap_sampler(graceful=True)
        if self._spawner is not None:
            self._spawner.close()
            self._spawner = None
            self._restore_sched()

    def _restore_sched(self) -> None:
        """Move this process's threads that are at learner_sched's policy (the ones moved, and those they started
        since) back to SCHED_OTHER where allowed: from batch always, from idle only with CAP_SYS_NICE (root) or
        RLIMIT_NICE >= 20; otherwise they stay idle for the rest of the process (the Runner's docstring says so)."""
        policy = sched_policy(self.rcfg.learner_sched)
        others = set()
        for tid in map(int, os.listdir("/proc/self/task")):
            try:
                if os.sched_getscheduler(tid) != policy:
                    others.add(tid)
            except ProcessLookupError:
                continue
        try:
            set_threads_sched(os.SCHED_OTHER, skip=others)
        except PermissionError:
            log.info("runner.learner_sched=%s: this process's threads stay %s (leaving it needs CAP_SYS_NICE)",
                     self.rcfg.learner_sched, SCHED_POLICIES[self.rcfg.learner_sched])  # fmt: skip

    def _reap_sampler(self, graceful: bool) -> None:
        """Stop and join the sampler process and close its pipe and dump file. ``graceful``: ask it through
        ``CTRL_STOP`` and wait ``shutdown_timeout_s`` before SIGKILL; else (it died or stalled) SIGKILL at once."""
        proc = self.process
        if proc is not None:
            if graceful:
                self.control[CTRL_STOP] = 1.0
                try:
                    self.store.wake_all()
                except Exception:
                    pass
                proc.join(timeout=self.rcfg.shutdown_timeout_s)  # SYNC: bounded
            if proc.is_alive():  # it ignores SIGTERM (see _sampler_main): SIGKILL (works on a stopped one too)
                if graceful:
                    print(f"sampler process {proc.pid} did not stop within {self.rcfg.shutdown_timeout_s:g} s; "
                          "killing it", file=sys.stderr)  # fmt: skip
                proc.kill()
            proc.join(timeout=5.0)  # SYNC: bounded
            if proc.exitcode is not None:
                proc.close()
            self.process = None
        if self._err_conn is not None:
            self._err_conn.close()
            self._err_conn = None
        if self._dump is not None:
            self._dump.close()
            self._dump = None

    def _summary(self, reason: str) -> dict:
        wall_s = time.monotonic() - self._t0
        steps = self.env_steps - self._start_env_steps
        return {
            "env_steps": self.env_steps,
            "wall_s": wall_s,
            "fps": steps / max(wall_s, 1e-9),
            "reason": reason,
            "policy_version": self._learner_version(),
            "episodes_dropped": self.episodes.dropped if hasattr(self, "episodes") else 0,
            "sampler_restarts": self.sampler_restarts,
        }

    # ----- signals --------------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM/SIGINT -> request_stop (a second SIGINT raises KeyboardInterrupt), unless the caller already
        installed its own handlers (e.g. the trainer's StopOnSignals), which are left alone."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            current = signal.getsignal(sig)
            if current in (signal.SIG_DFL, signal.default_int_handler):
                old[sig] = signal.signal(sig, self._on_signal)
        return old

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self._stop_requested:
            raise KeyboardInterrupt
        self.request_stop()


__all__ = [
    "Runner",
    "RunnerConfig",
    "RunnerHooks",
    "SamplerConfig",
    "SamplerError",
    "SamplerRestartLimit",
    "CTRL_SAMPLER_STEPS",
]
