"""DD-PPO-style data parallelism on ``torch.distributed``: ``torchrun ... -m sample_fast.train distributed=ddp``.

Every rank runs the single-node design unchanged (its own envs, sampler process, trajectory store and learner);
the ranks meet only inside the learner and at the end of each update:

* every minibatch: one ``all_reduce`` of the flattened gradients (and the loss, for the non-finite check), divided
  by the world size, so every rank takes the same Adam step (``Sync.grads``);
* every epoch: the advantage normalisation's count, sum and sum of squares (two small ``all_reduce``);
* every update: the batch moments (count, mean, variance) of the observation normaliser and of the reward scaler's
  discounted returns are all-gathered and merged in rank order (Chan et al.), so every rank applies the identical
  merged update (``Sync.moments``); with ``lr_schedule=kl_adaptive`` the update's KL is averaged;
* at the start and at the end of every update a ``monitored_barrier`` on a gloo group, which names a rank that did
  not arrive within ``distributed.timeout_s``; after the end one, one ``all_reduce`` of [stop flag, per-rank env
  steps/s] so that a stop (signal, time limit, a failure on rank 0) is taken by all ranks after the same update
  (``DistHooks``).

Rank 0 alone touches the run directory (config, meta, logs, TensorBoard, checkpoints); the resume state it loads is
broadcast to the other ranks, and the initial weights are broadcast from it. See docs/distributed.md.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "DistributedConfig", "DistributedError", "LaunchInfo", "launch_info", "core_share", "rank_device", "rank_seed",
    "Sync", "DistHooks", "FollowerHooks", "NullLogger", "attempt_store", "restart_hazard", "setup", "attach_learner",
    "global_summary",
]  # fmt: skip

MODES = ("none", "ddp")
BACKENDS = ("auto", "nccl", "gloo")
#: the variables torchrun (torch.distributed.run) sets for every worker
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LAUNCH_HINT = (
    "launch it with torchrun, e.g. `torchrun --nproc_per_node=2 -m sample_fast.train env=ant distributed=ddp` "
    "(or `python -m torch.distributed.run --nproc_per_node=2 -m sample_fast.train ...`; several machines: "
    "--nnodes=N --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT; see docs/distributed.md), or drop distributed=ddp "
    "for one process"
)


@dataclass
class DistributedConfig:
    """Data-parallel training across processes and machines (docs/distributed.md)."""

    #: none (one process), ddp (one learner per torchrun worker, gradients averaged every minibatch)
    mode: str = "none"
    #: auto (nccl when the learner is on CUDA, gloo on the CPU), nccl, gloo
    backend: str = "auto"
    #: seconds a collective (or the per-update barrier) waits for the other ranks before the run fails naming them
    timeout_s: float = 300.0
    #: pin each rank of a machine to its own share of this process's cores (the sampler process inherits it)
    pin_cores: bool = True

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; use none or ddp")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is unknown; use auto, nccl or gloo")
        if isinstance(self.timeout_s, bool) or not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a positive number of seconds")


class DistributedError(RuntimeError):
    """A collective failed or timed out (a rank died, hung or was killed); the message names this rank, the
    operation and, where torch knows it, the rank that did not answer."""


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """This worker's place in the group, from torchrun's environment. ValueError (with how to launch) without it."""
    env = os.environ if environ is None else environ
    missing = [k for k in TORCHRUN_VARS if k not in env]
    if missing:
        raise ValueError(f"distributed=ddp but {', '.join(missing)} not set: not a torchrun worker; {LAUNCH_HINT}")
    try:
        info = LaunchInfo(*(int(env[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")))
    except ValueError:
        raise ValueError(f"torchrun's RANK, WORLD_SIZE, LOCAL_RANK must be integers; {LAUNCH_HINT}") from None
    if not (0 <= info.rank < info.world_size and 0 <= info.local_rank < info.local_world_size <= info.world_size):
        raise ValueError(f"inconsistent torchrun environment {info}; {LAUNCH_HINT}")
    return info


def core_share(cores: list[int], local_rank: int, local_world_size: int) -> list[int]:
    """The cores of ``local_rank`` among ``local_world_size`` ranks on this machine: disjoint contiguous shares
    (the first ``len % k`` ranks get one more); with fewer cores than ranks, ranks share round-robin."""
    n, k = len(cores), local_world_size
    if n < k:
        return [cores[local_rank % n]]
    start = local_rank * (n // k) + min(local_rank, n % k)
    return cores[start : start + n // k + (1 if local_rank < n % k else 0)]


def rank_device(device: str, local_rank: int, num_gpus: int) -> str:
    """``cuda`` becomes this rank's own GPU (``cuda:<local_rank mod GPUs>``); explicit indices and cpu are kept."""
    return f"cuda:{local_rank % max(1, num_gpus)}" if device == "cuda" else device


def rank_seed(seed: int, rank: int) -> int:
    """Rank 0 keeps ``seed`` (a 1-rank ddp run samples like a plain run); other ranks get independent streams."""
    if rank == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, rank]).generate_state(1)[0] & 0x7FFFFFFF)


# ----- the collectives --------------------------------------------------------------------------------------------
class Sync:
    """The collectives the learner and the hooks call (``Learner.sync``). One per process, after ``setup``."""

    def __init__(self, rank: int, world_size: int, local_rank: int, local_world_size: int, backend: str,
                 timeout_s: float, device: torch.device):  # fmt: skip
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.backend, self.timeout_s, self.device = backend, float(timeout_s), device
        self.ctrl = None  # a gloo group for control traffic (monitored_barrier is gloo-only)
        self.allreduce_s = 0.0  #: seconds spent in the gradient all_reduce (for the benchmark)
        self.allreduce_calls = 0
        #: the rendezvous key-value store: each rank posts how far it got, so a failed collective names the
        #: rank that is behind (``behind``); None where torch does not expose it
        self.store = None
        self.progress = 0

    # -- helpers
    def _mark(self) -> None:
        """Post this rank's progress (a counter of the update boundaries it reached, 2 per update) to the store: one
        small TCP write to torchrun's rendezvous store per boundary, not per collective (a remote store costs more)."""
        self.progress += 1
        if self.store is not None:
            try:
                self.store.set(self._key("progress", self.rank), str(self.progress))
            except Exception:  # the store is only for the diagnosis
                self.store = None

    def _key(self, kind: str, rank: int) -> str:
        return f"sample_fast/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{kind}/{rank}"

    def _get(self, kind: str, rank: int) -> int | None:
        key = self._key(kind, rank)
        return int(self.store.get(key)) if self.store.check([key]) else None

    def _silent(self, rank: int) -> bool:
        return self._get("failed", rank) is None and (self._get("progress", rank) or 0) <= self.progress

    def behind(self, wait_s: float = 5.0) -> str:
        """After a failed collective: the ranks that neither got past this rank's update boundary nor reported a
        failure of their own within ``wait_s`` (a live peer blocked in the same collective times out too, and says
        so): those hung, were stopped or died. '' when unknown (no store) or when every peer answered."""
        if self.store is None:
            return ""
        try:
            self.store.set(self._key("failed", self.rank), str(self.progress))
            deadline = time.monotonic() + min(wait_s, self.timeout_s)
            while True:
                silent = [r for r in range(self.world_size) if r != self.rank and self._silent(r)]
                if not silent or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        except Exception:
            return ""
        if not silent:
            return ""
        where = ", ".join(f"rank {r} (update boundary {self._get('progress', r) or 0})" for r in silent)
        return (f"; {where} neither completed the collective nor reported a failure of its own (this rank: update "
                f"boundary {self.progress}): it hung or died")  # fmt: skip

    def _fail(self, what: str, e: BaseException) -> DistributedError:
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        who = self.behind() or "; a peer rank died, hung or was stopped"
        return DistributedError(
            f"rank {self.rank}/{self.world_size}: {what} did not complete (distributed.timeout_s={self.timeout_s:g}): "
            f"{cause}{who}. torchrun --max-restarts=R restarts the group from the last checkpoint"
        )

    def all_reduce_(self, t: Tensor, what: str, group=None) -> Tensor:
        try:
            dist.all_reduce(t, group=group)
        except RuntimeError as e:
            raise self._fail(what, e) from None
        return t

    # -- learner
    def begin_update(self) -> None:
        """Every rank arrives here before an update's first collective: a rank that does not is named."""
        self._mark()
        try:
            dist.monitored_barrier(group=self.ctrl, timeout=datetime.timedelta(seconds=self.timeout_s),
                                   wait_all_ranks=True)  # fmt: skip
        except RuntimeError as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DistributedError(
                f"rank {self.rank}/{self.world_size}: the ranks did not all reach the update within "
                f"distributed.timeout_s={self.timeout_s:g} s ({msg}){self.behind()}; that rank hung or died"
            ) from None

    def grads(self, params: list[Tensor], loss: Tensor) -> Tensor:
        """Average the gradients of ``params`` across ranks in place (one flat all_reduce); returns the mean loss
        (non-finite on every rank as soon as one rank's loss or gradient is)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads] + [loss.detach().reshape(1).float()])
        t0 = time.perf_counter()
        self.all_reduce_(flat, "the gradient all_reduce")
        self.allreduce_s += time.perf_counter() - t0
        self.allreduce_calls += 1
        flat /= self.world_size
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            chunk = flat[offset : offset + n].view_as(g)
            if p.grad is None:
                p.grad = chunk.to(p.dtype).clone()
            else:
                p.grad.copy_(chunk)
            offset += n
        return flat[-1]

    def moments(self, count: Any, mean: Any, var: Any) -> tuple[Any, Any, Any]:
        """Merge per-rank batch moments (count, mean, population variance; floats or float64 tensors) into the
        global batch's, identically on every rank (all-gathered, combined in rank order)."""
        scalar = not isinstance(mean, Tensor)
        mean_t = torch.as_tensor(mean, dtype=torch.float64, device=self.device).reshape(-1)
        var_t = torch.as_tensor(var, dtype=torch.float64, device=self.device).reshape(-1)
        n_t = torch.full_like(mean_t, float(count))
        mine = torch.stack([n_t, mean_t, var_t])  # [3, D]
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(gathered, mine)
        except RuntimeError as e:
            raise self._fail("the normaliser-statistics all_gather", e) from None
        n, m, v = gathered[0][0], gathered[0][1], gathered[0][2]
        for other in gathered[1:]:
            nb, mb, vb = other[0], other[1], other[2]
            total = n + nb
            delta = mb - m
            m2 = v * n + vb * nb + delta.square() * n * nb / total
            m = m + delta * nb / total
            v = m2 / total
            n = total
        if scalar:
            return float(n[0]), float(m[0]), float(v[0])
        return float(n[0]), m.reshape(torch.as_tensor(mean).shape), v.reshape(torch.as_tensor(var).shape)

    def normalize_advantages(self, adv: Tensor, mask: Tensor | None, eps: float = 1e-8) -> Tensor:
        """``losses.normalize_advantages`` over all ranks' samples (masked count, sum, then centred sum of squares)."""
        w = mask.to(adv.dtype) if mask is not None else torch.ones_like(adv)
        s = torch.stack([w.sum(), (adv * w).sum()]).double()
        self.all_reduce_(s, "the advantage all_reduce")
        mean = (s[1] / s[0].clamp_min(1.0)).to(adv.dtype)
        ss = ((adv - mean).square() * w).sum().double().reshape(1)
        self.all_reduce_(ss, "the advantage all_reduce")
        var = (ss[0] / s[0].clamp_min(1.0)).to(adv.dtype)
        return (adv - mean) / (var.sqrt() + eps)

    def mean_scalar(self, x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        self.all_reduce_(t, "the metric all_reduce")
        return float(t[0]) / self.world_size

    # -- start-up
    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=0, group=self.ctrl)
        except RuntimeError as e:
            raise self._fail("the start-up broadcast from rank 0", e) from None
        return box[0]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers (the normaliser's statistics included) on every rank."""
        try:
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        except RuntimeError as e:
            raise self._fail("the weight broadcast from rank 0", e) from None

    def check_identical(self, module: torch.nn.Module) -> None:
        """Raise DistributedError unless every rank holds bit-identical parameters and buffers (a float64
        fingerprint of each tensor, all-gathered: cheap enough for the end of a run)."""
        tensors = [*module.parameters(), *module.buffers()]
        mine = torch.stack(
            [torch.stack([t.detach().double().sum(), (t.detach().double() * 1.000001 ** torch.arange(
                t.numel(), device=t.device, dtype=torch.float64).view_as(t)).sum()]) for t in tensors]
        ).reshape(-1)  # fmt: skip
        gathered = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(gathered, mine)
        except RuntimeError as e:
            raise self._fail("the final weight check", e) from None
        differ = [r for r, g in enumerate(gathered) if not torch.equal(g, gathered[0])]
        if differ:
            raise DistributedError(f"rank(s) {differ} hold weights that differ from rank 0's: the ranks diverged")

    def step_exchange(self, stop: bool, fps: float) -> tuple[bool, list[float]]:
        """After each update: [any rank asks to stop, every rank's env steps/s] (a monitored barrier, then one
        all_reduce on the gloo group)."""
        self.begin_update()  # the update's collectives are done: a rank missing here hung in between
        t = torch.zeros(1 + self.world_size, dtype=torch.float64)
        t[0] = 1.0 if stop else 0.0
        t[1 + self.rank] = fps
        self.all_reduce_(t, "the end-of-update all_reduce", group=self.ctrl)
        return bool(t[0] > 0), t[1:].tolist()

    def close(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a broken group after a peer died: the process exits anyway
                pass


def start_tracker_outside_session() -> None:
    """Start multiprocessing's resource tracker in a session of its own (before anything registers with it).

    torchrun stops a worker that outlives its SIGTERM by 30 s with ``killpg(SIGKILL)`` of the worker's whole session;
    a tracker inside it would die too and the worker's named semaphores would stay in /dev/shm. Outside it, the
    tracker sees its last client gone and unlinks them. (It still starts with the stop signals blocked, as
    ``procs.start_resource_tracker`` does.)"""
    import subprocess
    from multiprocessing import util

    from .procs import start_resource_tracker

    def spawn_own_session(path: str, args: list[str], passfds: Any) -> int:
        fds = tuple(sorted(map(int, passfds)))
        return subprocess.Popen(args, executable=path, pass_fds=fds, close_fds=True, start_new_session=True).pid

    original = util.spawnv_passfds
    util.spawnv_passfds = spawn_own_session
    try:
        start_resource_tracker()
    finally:
        util.spawnv_passfds = original


def attempt_store(timeout: datetime.timedelta, environ: Mapping[str, str] | None = None) -> dist.Store | None:
    """The key-value store this restart attempt's process group meets on, or None for torch's plain env:// one.

    torchrun (c10d rendezvous, torch >= 2.4) keeps one TCPStore server in its agent for the whole job and hands every
    restart round the same MASTER_PORT (``TORCHELASTIC_USE_AGENT_STORE=True``); torch's env:// handler then adds no
    per-attempt prefix. The restarted group's gloo rendezvous keys (``default_pg/0//...``) are those of the dead
    group, still in the store: a rank that reads a peer's address before the new peer rewrote it connects to the dead
    process (``Gloo connectFullMesh ... Connection refused``), which is what a loaded machine made likely. One
    prefix per ``TORCHELASTIC_RESTART_COUNT`` gives every attempt its own keys."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"sample_fast/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def restart_hazard(environ: Mapping[str, str] | None = None) -> str:
    """Why a restart of this multi-machine job may fail to re-form its group, or ''. Each machine's torchrun agent
    counts its own restarts (an agent that restarts because another machine's worker failed does not count it;
    pytorch/pytorch#108158, #135712), so ``attempt_store``'s prefix can differ between machines. One machine, no
    restarts, or a store per round (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) are safe."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) <= 0:
        return ""
    if int(env.get("WORLD_SIZE", "1")) <= int(env.get("LOCAL_WORLD_SIZE", "1")):
        return ""
    return ("this job spans several machines and may restart (--max-restarts > 0) while torchrun shares one "
            "rendezvous store across restarts, whose restart counts are per machine: a restart may fail to form "
            "its group. Launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 set on every machine "
            "(docs/distributed.md)")  # fmt: skip


def setup(cfg: DistributedConfig, device: str) -> Sync:
    """Join torchrun's group (env:// rendezvous), pin this rank's cores, pick its GPU. ``cfg`` is resolved (backend
    set) and ``device`` is this rank's learner device."""
    info = launch_info()
    start_tracker_outside_session()
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if cfg.pin_cores and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, core_share(cores, info.local_rank, info.local_world_size))
    timeout = datetime.timedelta(seconds=float(cfg.timeout_s))
    kwargs: dict[str, Any] = {"backend": cfg.backend, "timeout": timeout}
    if dev.type == "cuda":
        kwargs["device_id"] = dev
    store = attempt_store(timeout)
    hazard = restart_hazard()
    if hazard and info.rank == 0:
        print(f"warning: {hazard}", file=sys.stderr, flush=True)
    if store is not None:
        kwargs.update(store=store, rank=info.rank, world_size=info.world_size)
    dist.init_process_group(**kwargs)
    sync = Sync(info.rank, info.world_size, info.local_rank, info.local_world_size, cfg.backend, cfg.timeout_s, dev)
    sync.ctrl = dist.new_group(backend="gloo", timeout=timeout) if cfg.backend != "gloo" else dist.group.WORLD
    try:
        sync.store = dist.distributed_c10d._get_default_store()  # torchrun's rendezvous store (private accessor)
    except Exception:
        sync.store = None
    return sync


def attach_learner(sync: Sync, learner: Any, seed: int, resumed: bool) -> Any:
    """Give ``learner`` its collectives; broadcast rank 0's weights; per-rank seeds for the minibatch generator and
    (ranks > 0) this process's RNGs. Returns the learner."""
    import random

    sync.broadcast_module(learner.policy)
    learner.sync = sync
    if learner.cfg.scale_rewards:
        learner.reward_scaler.merge = sync.moments
    if sync.rank > 0:
        s = rank_seed(seed, sync.rank)
        learner.generator.manual_seed(s)
        torch.manual_seed(s)
        np.random.seed(s)
        random.seed(s)
        if resumed:  # rank 0's per-env running returns belong to rank 0's envs
            learner.reward_scaler.returns = None
    return learner


# ----- hooks ------------------------------------------------------------------------------------------------------
class _StopProxy:
    """The runner as the stopper and the hooks see it: ``request_stop`` only raises a flag, which the end-of-update
    exchange turns into a stop on every rank after the same update."""

    def __init__(self, runner: Any, owner: DistHooks):
        self._runner, self._owner = runner, owner

    def request_stop(self) -> None:
        self._owner.stop_wanted = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


class DistHooks:
    """Wraps the rank's hooks (``TrainHooks`` on rank 0, ``FollowerHooks`` elsewhere): turns the runner's per-rank
    env steps into global ones (``start + world_size * local``), applies the time limit by rank 0's clock, agrees on
    stops after each update, and skips the final checkpoint after a collective failure (the group is broken; the
    restart resumes from the last checkpoint)."""

    def __init__(self, inner: Any, sync: Sync, start_env_steps: int, time_limit_s: float | None):
        self.inner, self.sync = inner, sync
        self.start_env_steps = int(start_env_steps)
        self.time_limit_s = time_limit_s
        self.stop_wanted = False
        self.time_limit_hit = False
        self.rank_fps: list[float] = []
        self._t0 = time.monotonic()
        self._runner = None

    def proxy(self, runner: Any) -> _StopProxy:
        self._runner = runner
        return _StopProxy(runner, self)

    def global_steps(self, local_env_steps: int) -> int:
        return self.start_env_steps + self.sync.world_size * int(local_env_steps)

    def local_target(self, total_env_steps: int) -> int:
        """Per-rank env steps that bring the global count to ``total_env_steps``."""
        return max(0, math.ceil((int(total_env_steps) - self.start_env_steps) / self.sync.world_size))

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        steps = self.global_steps(env_steps)
        if self.sync.rank == 0 and self.time_limit_s is not None and time.monotonic() - self._t0 >= self.time_limit_s:
            self.time_limit_hit = True
            self.stop_wanted = True
        self.inner.on_train(steps, self._with_ranks(metrics))
        stop, self.rank_fps = self.sync.step_exchange(self.stop_wanted, float(metrics.get("fps", 0.0)))
        if stop and self._runner is not None:
            self._runner.request_stop()

    def _with_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        out = dict(metrics)
        for r, fps in enumerate(self.rank_fps):  # the previous exchange's figures (this update's come after it)
            out[f"fps_rank{r}"] = fps
        return out

    def on_episodes(self, env_steps: int, returns: Tensor, lengths: Tensor) -> None:
        self.inner.on_episodes(self.global_steps(env_steps), returns, lengths)

    def on_stop(self, env_steps: int, reason: str) -> None:
        if reason.startswith("error"):
            self.inner.on_stop_without_save(self.global_steps(env_steps))
            return
        if self._runner is not None:  # INVARIANT: the ranks end with identical weights (else: an error, no save)
            self.sync.check_identical(self._runner.policy)
        self.inner.on_stop(self.global_steps(env_steps), "time_limit" if self.time_limit_hit else reason)


def global_summary(summary: dict, hooks: DistHooks) -> dict:
    """The runner's per-rank summary in global env steps (all ranks), with each rank's env steps/s."""
    out = dict(summary)
    out["env_steps"] = hooks.global_steps(summary["env_steps"])
    out["fps"] = (out["env_steps"] - hooks.start_env_steps) / max(float(summary.get("wall_s", 0.0)), 1e-9)
    out["rank_fps"] = list(hooks.rank_fps)
    if hooks.time_limit_hit and out.get("reason") == "stop_requested":
        out["reason"] = "time_limit"
    return out


class FollowerHooks:
    """Hooks of a rank > 0: it writes nothing (rank 0 logs and checkpoints the identical weights)."""

    def __init__(self, start_env_steps: int):
        self.env_steps = start_env_steps
        self.runner = None
        self.fatal: str | None = None
        self.final_saved = False
        self.last_saved_path: str | None = None
        self.stop_reason: str | None = None
        self._start_rollbacks: int | None = None

    def on_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        self.env_steps = env_steps

    def on_episodes(self, env_steps: int, returns: Tensor, lengths: Tensor) -> None:
        pass

    def on_stop(self, env_steps: int, reason: str) -> None:
        self.env_steps, self.stop_reason = env_steps, reason

    def on_stop_without_save(self, env_steps: int) -> None:
        self.env_steps = env_steps

    def interrupted_message(self) -> str:
        return "interrupted (second Ctrl-C); rank 0 writes the checkpoints"


class NullLogger:
    """The logger of a rank > 0: counts nothing, writes nothing."""

    wall_s = 0.0

    def add_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        pass

    def add_episodes(self, returns: Tensor, lengths: Tensor) -> None:
        pass

    def episode_return_mean(self) -> float:
        return math.nan

    def set_gauge(self, name: str, value: float) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def close(self, env_steps: int | None = None, plot: bool = True) -> None:
        pass
