"""distributed=ddp (sample_fast.distributed): gloo on the CPU, 2 ranks.

Learner level (two spawned gloo processes, synthetic batches): the ranks' weights are bit-identical after several
updates, and one 2-rank update equals a 1-rank update on the concatenation of both ranks' batches (a float64-free
but independent reference: the plain single-process learner). Trainer level (torchrun on the toy env): only rank 0
writes files, a 2-rank checkpoint resumes with 1 rank and back with 2 (counters, normaliser and weights continue),
kill -9 of a rank under --max-restarts=1 resumes from the checkpoint and finishes, and distributed=ddp without
torchrun is a config error (exit status 2) that says how to launch."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict

from sample_fast.checkpoint import read_checkpoint_file
from sample_fast.distributed import (
    Sync,
    attach_learner,
    attempt_store,
    core_share,
    launch_info,
    rank_device,
    rank_seed,
    restart_hazard,
)
from sample_fast.learner import Learner, LearnerConfig
from sample_fast.policy import ActorCritic, PolicyConfig
from sample_fast.procs import LEAK_WINDOW_S, leaked_shm, shm_entries

sys.path.insert(0, str(Path(__file__).parent))
from test_learner import CONT, OBS, make_batch  # noqa: E402

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parents[1]
SHM_PREFIXES = ("torch_", "sem.mp-", "mp-", "psm_")
QUIET = ("logging.progress=plain", "logging.interval_s=0.5", "logging.tensorboard=false", "logging.plot=false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----- learner level -------------------------------------------------------------------------------------------
def _learner(cfg: LearnerConfig, init_seed: int) -> Learner:
    torch.manual_seed(init_seed)
    policy = ActorCritic(OBS, CONT, PolicyConfig(hidden_sizes=[32, 32]))
    return Learner(policy, cfg)


def _batches(rank: int, count: int, num_envs: int = 6) -> list[TensorDict]:
    torch.manual_seed(100 + rank)
    behaviour = ActorCritic(OBS, CONT, PolicyConfig(hidden_sizes=[32, 32]))
    return [make_batch(behaviour, num_envs=num_envs, seed=10 * rank + i) for i in range(count)]


def _worker(rank: int, world: int, port: int, cfg: LearnerConfig, num_batches: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        sync = Sync(rank, world, rank, world, "gloo", 60.0, torch.device("cpu"))
        sync.ctrl = dist.group.WORLD
        learner = attach_learner(sync, _learner(cfg, init_seed=rank), seed=0, resumed=False)  # rank 1: other init
        for batch in _batches(rank, num_batches):
            learner.train(batch)
        torch.save({"policy": learner.policy.state_dict(), "learner": learner.state_dict()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path, cfg: LearnerConfig, num_batches: int) -> list[dict]:
    mp.spawn(_worker, args=(2, free_port(), cfg, num_batches, str(tmp_path)), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_weights_are_bit_identical_across_ranks_after_several_updates(tmp_path):
    # default minibatching (4 minibatches x 2 epochs), different data and different initial weights per rank
    out = _run_ranks(tmp_path, LearnerConfig(), num_batches=3)
    a, b = out[0]["policy"], out[1]["policy"]
    assert out[0]["learner"]["num_updates"] == 3 * 2 * 4
    for key in a:
        assert torch.equal(a[key], b[key]), key
    fresh = _learner(LearnerConfig(), init_seed=0).policy.state_dict()
    assert not torch.equal(a["actor.0.weight"], fresh["actor.0.weight"])  # it trained
    # every rank counts the global env steps: 3 batches x T=8 x B=6 x 2 ranks
    assert out[0]["learner"]["env_steps"] == out[1]["learner"]["env_steps"] == 3 * 8 * 6 * 2
    assert out[0]["learner"]["reward_scaler"]["count"] == out[1]["learner"]["reward_scaler"]["count"] == 288


def _cat_slots(a: TensorDict, b: TensorDict) -> TensorDict:
    """Two slot-layout batches side by side (B = B_a + B_b): the final-obs side tables joined, b's env index
    shifted by B_a."""
    num_steps, b_a = a["rewards"].shape
    b_b = b["rewards"].shape[1]
    data = {k: torch.cat([a[k], b[k]], dim=1) for k in ("obs", "actions", "behavior_logp", "rewards", "terminated",
                                                        "truncated", "policy_version")}  # fmt: skip
    na, nb = int(a["final_count"]), int(b["final_count"])
    capacity = num_steps * (b_a + b_b)
    final_obs = torch.full((capacity, *a["final_obs"].shape[1:]), float("nan"))
    final_obs[: na + nb] = torch.cat([a["final_obs"][:na], b["final_obs"][:nb]])
    step = torch.full((capacity,), -1, dtype=torch.int64)
    env = torch.full((capacity,), -1, dtype=torch.int64)
    step[: na + nb] = torch.cat([a["final_step_idx"][:na], b["final_step_idx"][:nb]])
    env[: na + nb] = torch.cat([a["final_env_idx"][:na], b["final_env_idx"][:nb] + b_a])
    data.update(final_obs=final_obs, final_step_idx=step, final_env_idx=env, final_count=torch.tensor(na + nb))
    return TensorDict(data, batch_size=[])


def test_a_two_rank_update_equals_one_rank_on_the_concatenated_batch(tmp_path):
    # one minibatch per epoch: the 2-rank minibatch is then exactly the union of both ranks' batches; 2 epochs
    # (targets recomputed with the updated weights), advantage normalisation, reward scaling and the obs
    # normaliser all on, so each merged statistic has to equal the concatenation's
    cfg = LearnerConfig(num_minibatches=1, num_epochs=2)
    out = _run_ranks(tmp_path, cfg, num_batches=2)
    single = _learner(cfg, init_seed=0)  # rank 0's initial weights, which the broadcast gave rank 1
    for a, b in zip(_batches(0, 2), _batches(1, 2), strict=True):
        single.train(_cat_slots(a, b))
    ref = single.policy.state_dict()
    for key, value in out[0]["policy"].items():
        torch.testing.assert_close(value, ref[key], rtol=1e-5, atol=1e-6, msg=key)
    assert float(out[0]["policy"]["normalizer.count"]) == float(ref["normalizer.count"]) == 2 * 8 * 12
    scaler, ref_scaler = out[0]["learner"]["reward_scaler"], single.reward_scaler
    assert scaler["count"] == ref_scaler.count
    assert scaler["mean"] == pytest.approx(ref_scaler.mean, rel=1e-9)
    assert scaler["var"] == pytest.approx(ref_scaler.var, rel=1e-9)


def test_pure_helpers():
    assert core_share([0, 1, 2, 3, 4], 0, 2) == [0, 1, 2] and core_share([0, 1, 2, 3, 4], 1, 2) == [3, 4]
    assert core_share([0, 1], 0, 2) == [0] and core_share([0, 1], 1, 2) == [1]
    assert core_share([5], 1, 2) == [5]  # fewer cores than ranks: shared
    assert rank_device("cuda", 3, 2) == "cuda:1" and rank_device("cuda:0", 3, 2) == "cuda:0"
    assert rank_device("cpu", 1, 4) == "cpu"
    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) != rank_seed(7, 2) != 7
    env = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    assert launch_info(env).rank == 1
    with pytest.raises(ValueError, match="torchrun --nproc_per_node"):
        launch_info({k: v for k, v in env.items() if k != "RANK"})


def test_resolve_fits_each_rank_to_its_share_of_the_cores():
    from hydra import compose, initialize_config_module

    from sample_fast.config import ConfigError, resolve

    env = dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        plain = resolve(compose("train", overrides=["env=ant"]), num_cores=8, cuda=False)
        ddp = resolve(compose("train", overrides=["env=ant", "distributed=ddp"]), num_cores=8, cuda=False, environ=env)
        with pytest.raises(ConfigError, match="needs the learner on CUDA"):
            resolve(compose("train", overrides=["env=ant", "distributed=ddp", "distributed.backend=nccl"]),
                    num_cores=8, cuda=False, environ=env)  # fmt: skip
        with pytest.raises(ConfigError, match="timeout_s"):
            resolve(compose("train", overrides=["env=ant", "distributed=ddp", "distributed.timeout_s=0"]),
                    num_cores=8, cuda=False, environ=env)  # fmt: skip
    assert (plain.env.num_envs, plain.env.num_threads, plain.runner.learner_threads) == (512, 8, 4)
    assert (ddp.env.num_envs, ddp.env.num_threads, ddp.runner.learner_threads) == (256, 4, 2)
    assert ddp.distributed.backend == "gloo" and plain.distributed.mode == "none"


# ----- trainer level (torchrun) --------------------------------------------------------------------------------
AUDIT = """
import os, runpy, sys
rank = os.environ["RANK"]
watched = os.path.realpath(sys.argv[1]); del sys.argv[1]
WRITE_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.move", "shutil.rmtree"}
def hook(event, args):
    path = None
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = (args[1] or "r") if len(args) > 1 else "r", args[2] if len(args) > 2 else 0
        if any(c in str(mode) for c in "wax+") or (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)):
            path = args[0]
    elif event in WRITE_EVENTS and args:
        path = args[0]
    if path is not None:
        p = os.path.realpath(os.fsdecode(path)) if not isinstance(path, int) else ""
        if p.startswith(watched):
            sys.__stderr__.write(f"AUDIT-WRITE rank={rank} {p}\\n")
sys.addaudithook(hook)
sys.argv[0] = "sample_fast.train"
runpy.run_module("sample_fast.train", run_name="__main__", alter_sys=True)
"""


#: torchrun makes a log folder per run (``torchelastic_*``) in $TMPDIR: this module's runs put theirs under pytest's
#: temporary folder (set by ``_torchrun_tmpdir``), not in /tmp.
TORCHRUN_TMPDIR: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _torchrun_tmpdir(tmp_path_factory):
    TORCHRUN_TMPDIR.append(str(tmp_path_factory.mktemp("torchrun")))
    yield
    TORCHRUN_TMPDIR.clear()


def torchrun(nproc: int, *args: str, max_restarts: int = 0, script: list[str] | None = None, **kw):
    cmd = [PYTHON, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--max-restarts={max_restarts}",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--monitor-interval=0.5"]  # fmt: skip
    cmd += script if script is not None else ["-m", "sample_fast.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"TMPDIR": TORCHRUN_TMPDIR[-1]} if TORCHRUN_TMPDIR else {})}
    return subprocess.Popen([*cmd, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)  # fmt: skip


def _finish(proc, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{out[-4000:]}")
    return out


def _train_args(run_dir: Path, steps: int, *extra: str) -> list[str]:
    return ["env=toy", f"run.dir={run_dir}", f"run.total_env_steps={steps}", *QUIET, *extra]


def _checkpoint(run_dir: Path, steps: int) -> dict:
    return read_checkpoint_file(run_dir / "checkpoints" / f"ckpt_{steps:012d}.pt")["state"]


@pytest.mark.slow  # three torchrun starts: ~40-90 s on the 2 shared cores
def test_only_rank_0_writes_files_and_a_run_resumes_with_one_rank_and_again_with_two(tmp_path):
    """toy: T=16 (sampler=short), 8 envs per split: a rank's batch is 128 env steps; 2 ranks: 256 per update.

    The first (2-rank) start runs under an audit hook that reports every file write below tmp_path: only rank 0
    writes (checkpoints, TensorBoard, CSV, meta.json), and no shared-memory entry outlives it."""
    script = tmp_path / "audit.py"
    script.write_text(AUDIT)
    run_dir = tmp_path / "run"
    stages = [(2, 1024), (1, 1536), (2, 2560)]
    version = 0
    prev = None
    for nproc, steps in stages:
        if prev is None:
            before = shm_entries()
            proc = torchrun(nproc, str(tmp_path), *_train_args(run_dir, steps, "distributed=ddp",
                            "logging.tensorboard=true"), script=[str(script)])  # fmt: skip
            out = _finish(proc)
            assert proc.returncode == 0, out[-4000:]
            writes = [line for line in out.splitlines() if line.startswith("AUDIT-WRITE")]
            assert writes and all(w.startswith("AUDIT-WRITE rank=0 ") for w in writes), writes
            assert any("ckpt_000000001024.pt" in w for w in writes) and any("/tb/" in w for w in writes)
            shares = re.findall(r"ranks (\d+)%/(\d+)%", out)  # the progress line: each rank's share of env steps/s
            assert shares and all(abs(int(a) + int(b) - 100) <= 1 for a, b in shares), out[-3000:]
            meta = json.loads((run_dir / "meta.json").read_text())["starts"][0]["distributed"]
            assert meta["world_size"] == 2 and meta["rank_seeds"][0] == 0 and meta["rank_seeds"][1] != 0
            assert leaked_shm(before, SHM_PREFIXES, wait_s=LEAK_WINDOW_S) == set()
        else:
            out = _finish(torchrun(nproc, *_train_args(run_dir, steps, "distributed=ddp")))
        assert f"done: {steps} env steps" in out, out[-4000:]
        ck = _checkpoint(run_dir, steps)
        start = prev["env_steps"] if prev else 0
        version += (steps - start) // (128 * nproc)
        assert ck["env_steps"] == ck["learner"]["env_steps"] == steps
        assert ck["learner"]["policy_version"] == version  # counters continue across world sizes
        # every env step's observation entered the (merged) normaliser exactly once, on every world size
        assert float(ck["policy"]["normalizer.count"]) == steps
        assert ck["learner"]["reward_scaler"]["count"] == steps
        assert ck["logger"]["num_updates"] == version
        if prev is not None:  # the weights continued from the checkpoint (they moved, and by a bounded step)
            moved = (ck["policy"]["actor.0.weight"] - prev["policy"]["actor.0.weight"]).abs().max()
            assert 0 < moved < 0.5
        prev = ck
    starts = json.loads((run_dir / "meta.json").read_text())["starts"]
    assert [s["resumed_from_env_steps"] for s in starts] == [0, 1024, 1536]
    assert [s["distributed"]["world_size"] for s in starts] == [2, 1, 2]


def _worker_pids(agent_pid: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of torchrun's workers (its children with LOCAL_RANK in their environment)."""
    from sample_fast.benchmark.measure import descendants

    out = {}
    for pid in descendants(agent_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"LOCAL_RANK=")]
        if ranks and ppid == agent_pid:
            out[int(ranks[0])] = pid
    return out


@pytest.mark.slow  # two group starts: ~35 s on the 2 shared cores
def test_kill_9_of_a_rank_restarts_the_group_from_its_checkpoint(tmp_path):
    from sample_fast.benchmark.measure import descendants

    run_dir = tmp_path / "run"
    before = shm_entries()
    proc = torchrun(2, *_train_args(run_dir, 4096, "distributed=ddp", "run.checkpoint_interval_s=0.5"),
                    max_restarts=1)  # fmt: skip
    ckdir = run_dir / "checkpoints"
    deadline = time.monotonic() + 120
    while not (ckdir.is_dir() and any(p.name.startswith("ckpt_") for p in ckdir.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    victim = _worker_pids(proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "done: 4096 env steps" in out
    starts = json.loads((run_dir / "meta.json").read_text())["starts"]
    assert len(starts) == 2 and starts[1]["distributed"]["restart_count"] == 1
    assert 0 < starts[1]["resumed_from_env_steps"] < 4096  # it continued from a checkpoint, not from 0
    assert _checkpoint(run_dir, 4096)["learner"]["env_steps"] == 4096
    assert descendants(proc.pid) == []
    assert leaked_shm(before, SHM_PREFIXES, wait_s=LEAK_WINDOW_S) == set()


RESTART_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
from sample_fast.distributed import DistributedConfig, setup
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 1 and rank == 1:
    time.sleep(4)  # the restarted peer is slow to come up, as on a loaded machine
setup(DistributedConfig(mode="ddp", backend="gloo", timeout_s=30), "cpu")
x = torch.full((1,), float(rank + 1))
dist.all_reduce(x)
print(f"attempt {attempt} rank {rank} sum {x.item():g}", flush=True)
if attempt == 0 and rank == 1:
    os._exit(9)  # dies like kill -9: the group breaks, torchrun restarts it
dist.barrier()
dist.destroy_process_group()
"""


def test_a_restarted_group_forms_although_the_dead_groups_keys_are_in_the_shared_store(tmp_path):
    """torchrun's agent keeps one TCPStore for every restart round (TORCHELASTIC_USE_AGENT_STORE=True); without
    ``attempt_store``'s per-attempt prefix the restarted rank 0 reads the dead rank 1's gloo address and fails with
    ``Connection refused`` whenever its new peer comes up later than itself (the flaky kill -9 restart)."""
    script = tmp_path / "restart.py"
    script.write_text(RESTART_SCRIPT)
    proc = torchrun(2, max_restarts=1, script=[str(script)])
    out = _finish(proc, timeout=120)
    assert proc.returncode == 0, out[-4000:]
    for attempt in (0, 1):
        for rank in (0, 1):
            assert f"attempt {attempt} rank {rank} sum 3" in out, out[-4000:]
    assert "Connection refused" not in out


def test_restart_hazard_warns_only_for_a_restartable_multi_machine_job_on_the_shared_store():
    base = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3", "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4"}  # fmt: skip
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart_hazard(base)
    assert restart_hazard({**base, "LOCAL_WORLD_SIZE": "8"}) == ""  # one machine: one agent, one count
    assert restart_hazard({**base, "TORCHELASTIC_MAX_RESTARTS": "0"}) == ""
    assert restart_hazard({**base, "TORCHELASTIC_USE_AGENT_STORE": "False"}) == ""  # a store per round
    timeout = datetime.timedelta(seconds=5)
    assert attempt_store(timeout, {**base, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # torch's env://
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout)
    env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port)}
    first = attempt_store(timeout, {**env, "TORCHELASTIC_RESTART_COUNT": "0"})
    second = attempt_store(timeout, {**env, "TORCHELASTIC_RESTART_COUNT": "1"})
    first.set("default_pg/0//rank_1", "dead peer")
    assert not second.check(["default_pg/0//rank_1"]) and first.check(["default_pg/0//rank_1"])


def test_ddp_without_torchrun_is_a_config_error_saying_how_to_launch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    out = subprocess.run([PYTHON, "-m", "sample_fast.train", *_train_args(tmp_path / "run", 1024, "distributed=ddp")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "torchrun --nproc_per_node" in out.stderr and "distributed=ddp" in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_failed_collective_names_the_rank_that_did_not_answer():
    """``Sync.behind`` from the store's posts: rank 2 reported its own failure, rank 1 stayed silent."""
    store = dist.HashStore()
    sync = Sync(0, 3, 0, 3, "gloo", 60.0, torch.device("cpu"))
    sync.store = store
    sync.progress = 7
    store.set(sync._key("progress", 1), "7")  # reached the same update boundary, then went quiet
    store.set(sync._key("progress", 2), "7")
    store.set(sync._key("failed", 2), "7")  # timed out like rank 0: alive
    msg = sync.behind(wait_s=0.5)
    assert "rank 1 (update boundary 7) neither completed" in msg and "rank 2" not in msg
    store.set(sync._key("progress", 1), "8")  # got past this rank's boundary: not the one
    assert sync.behind(wait_s=0.5) == ""


@pytest.mark.slow  # ~20 s: the start, then the 5 s timeout and rank 0's report
def test_a_hung_rank_ends_the_run_within_the_timeout_naming_it(tmp_path):
    from sample_fast.benchmark.measure import descendants

    run_dir = tmp_path / "run"
    before = shm_entries()
    proc = torchrun(2, *_train_args(run_dir, 10**7, "distributed=ddp", "distributed.timeout_s=5"))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not (run_dir / "progress.csv").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    hung = _worker_pids(proc.pid)[1]
    os.kill(hung, signal.SIGSTOP)  # hung: alive, holding its sockets, never answering
    t0 = time.monotonic()
    pattern = re.compile(r"Ranks? 1 failed to pass monitoredBarrier|rank 1 \(update boundary \d+\) neither completed")
    while not any(pattern.search(line) for line in list(lines)):
        assert time.monotonic() - t0 < 60, "".join(lines)[-4000:]
        time.sleep(0.2)
    named_after = time.monotonic() - t0
    # torchrun then SIGTERMs the stopped worker, which cannot act on it, and SIGKILLs its session after a 30 s grace
    # (torch 2.13 uses 30 s on this path whatever --shutdown-timeout says); the test does that SIGKILL at once.
    os.killpg(hung, signal.SIGKILL)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("torchrun did not exit within 60 s of the hung worker's kill:\n" + "".join(lines)[-4000:])
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode != 0
    assert "rank 0/2" in out  # rank 0 is the one that reports it
    assert named_after < 30, named_after  # the 5 s timeout, the 5 s wait for the others' reports, the report
    assert descendants(proc.pid) == []
    assert leaked_shm(before, SHM_PREFIXES, wait_s=LEAK_WINDOW_S) == set()


@pytest.mark.slow  # ~30 s: one 2-rank start
def test_sigterm_to_one_rank_stops_every_rank_after_the_same_update(tmp_path):
    """A stop asked on rank 1 alone (a preempted node) is taken by all ranks after one update: rank 0 writes the
    final checkpoint, nobody is left blocked in a collective."""
    from sample_fast.benchmark.measure import descendants

    run_dir = tmp_path / "run"
    proc = torchrun(2, *_train_args(run_dir, 10**7, "distributed=ddp", "distributed.timeout_s=30"))
    deadline = time.monotonic() + 120
    while not (run_dir / "progress.csv").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.2)
    os.kill(_worker_pids(proc.pid)[1], signal.SIGTERM)
    t0 = time.monotonic()
    out = _finish(proc, timeout=90)
    assert time.monotonic() - t0 < 25, out[-3000:]  # far below the 30 s collective timeout: no rank waited it out
    assert "SIGTERM received: stopping" in out
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts, out[-3000:]
    final = read_checkpoint_file(ckpts[-1])["state"]
    assert final["env_steps"] == final["learner"]["env_steps"] > 0
    assert f"done: {final['env_steps']} env steps" in out  # rank 0 finished normally at the agreed update
    assert descendants(proc.pid) == []
