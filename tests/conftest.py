"""Shared test settings: ``slow`` tests run only with --runslow; ``gpu`` tests only with a CUDA device. The
``load_bench`` fixture imports a script of ``benchmarks/`` by name.

``@pytest.mark.isolated("func", timeout_s=...)``: the test's work is ``func()`` of the test's own file, run in a
fresh interpreter with a hard timeout (MJX on the CPU has been seen to hang inside XLA, where no Python-level timeout
reaches). These jobs are compile-bound and single-process, and most of the suite keeps only one of the two cores
busy, so the jobs of every selected ``isolated`` test start when collection ends, one at a time at nice 10 on the
spare core, in collection order; the test itself (fixture ``isolated``) waits for its job's result. A job still
running when the session ends (Ctrl-C, a failure with -x) is killed. Under pytest-xdist (``-n 2``, what
scripts/test.sh runs) each worker gets a share of the tests and the other worker keeps the second core busy, so
there a job runs in the foreground, at normal priority, when its test runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "isolated(func, timeout_s): run func() of the test's file in a background subprocess (conftest)"
    )
    # pytest-xdist registers it too; registered here for a run without xdist (-p no:xdist), where it changes nothing
    config.addinivalue_line("markers", "xdist_group(name): tests that share a compile cache run on one xdist worker")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    skip_gpu = pytest.mark.skip(reason="gpu: no CUDA device on this machine")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = long_tests_first_in_each_half(items, run_slow=config.getoption("--runslow"))


def _weight(item, run_slow: bool) -> int:
    """2: an ``isolated`` MJX compile job (50-145 s each); 1: another ``slow`` test; 0: the rest, or a test that
    shares a module-scoped fixture with its neighbours (moving it away would build that fixture twice)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d and d[-1].scope in ("module", "package") for d in defs.values()):
        return 0
    if item.get_closest_marker("isolated") is not None and (run_slow or "slow" not in item.keywords):
        return 2
    return 1 if run_slow and "slow" in item.keywords else 0


def _group(item, weight: int) -> str | None:
    """The ``xdist_group`` name of a test that shares an on-disk compile cache with the others of its group (MuJoCo
    Warp's kernels, one MJX program in the XLA cache): all of them run on one worker, so the group compiles once
    instead of once per worker at the same time. An ``isolated`` job (weight 2) runs in a fresh interpreter and
    shares nothing, so it is dealt like any long test."""
    marker = item.get_closest_marker("xdist_group")
    if marker is None or weight == 2:
        return None
    return str(marker.args[0] if marker.args else marker.kwargs["name"])


def long_tests_first_in_each_half(items: list, run_slow: bool) -> list:
    """The order for xdist's ``worksteal``: it hands the first half of the list to one worker and the second half to
    the other, and a worker that runs out steals from the END of the other's queue. With the long tests dealt
    to the front of each half (each to the half with fewer so far), both workers start on them and end on short
    tests, so neither is left running a two-minute test alone at the end (the same order in every worker, as xdist
    requires). The tests of one ``xdist_group`` all go to one half (groups alternate between the halves): its long
    tests among that half's leaders, its short ones right after them, in collection order, where the other worker
    does not steal them."""
    weights = [_weight(it, run_slow) for it in items]
    groups = [_group(it, w) for it, w in zip(items, weights, strict=True)]
    home = {g: k % 2 for k, g in enumerate(dict.fromkeys(g for g in groups if g))}
    halves: list[list[int]] = [[], []]
    for i in sorted((i for i, w in enumerate(weights) if w), key=lambda i: -weights[i]):  # stable: collection order
        g = groups[i]
        halves[home[g] if g else int(len(halves[1]) < len(halves[0]))].append(i)
    for i, (w, g) in enumerate(zip(weights, groups, strict=True)):
        if g and not w:
            halves[home[g]].append(i)
    short = [i for i, (w, g) in enumerate(zip(weights, groups, strict=True)) if not w and not g]
    fill = max(0, len(items) // 2 - len(halves[0]))
    halves[0] += short[:fill]
    halves[1] += short[fill:]
    return [items[i] for i in halves[0] + halves[1]]


# ----- isolated jobs --------------------------------------------------------------------------------------------
@dataclass
class IsolatedJob:
    """``func()`` of ``path`` in a fresh interpreter, killed after ``timeout_s`` of its own run time."""

    path: str
    func: str
    timeout_s: float
    background: bool = True  #: started by IsolatedRunner at nice 10; False: run by the test itself (xdist)
    started: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    elapsed_s: float = 0.0

    def run(self, procs: list[subprocess.Popen], stopping: threading.Event) -> None:
        # nice 10: the job takes the core the suite leaves idle; PR_SET_PDEATHSIG (1) = SIGKILL (9): it dies with
        # the thread that started it if pytest itself is killed (SIGKILL, OOM), as no cleanup hook then runs.
        self.started = True
        death = "import ctypes; ctypes.CDLL(None).prctl(1, 9); " if sys.platform == "linux" else ""
        nice = "os.nice(10); " if self.background else ""
        code = f"import os, runpy; {death}{nice}runpy.run_path({self.path!r})[{self.func!r}]()"
        t0 = time.monotonic()
        try:
            if stopping.is_set():
                self.returncode, self.stderr = -1, "not started: the session was ending"
                return
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
            procs.append(proc)
            try:
                self.stdout, self.stderr = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.stdout, self.stderr = proc.communicate(timeout=30)
                self.timed_out = True
            self.returncode = proc.returncode
        finally:
            self.elapsed_s = time.monotonic() - t0
            self.done.set()

    def check(self) -> None:
        """Wait for the job (it runs in collection order, each bounded by its timeout) and turn its outcome into
        the test's: an assertion failed in the child -> AssertionError (what xfail(raises=AssertionError) expects);
        a crash or a hang -> pytest.fail, never mistaken for an expected failure."""
        if not self.background and not self.started:
            self.run([], threading.Event())  # xdist: in the foreground, bounded by timeout_s
        while not self.done.wait(timeout=1.0):
            pass  # bounded: every job ahead of this one and this one itself have a hard timeout
        where = f"{self.func} ({self.elapsed_s:.0f} s{' in the background' if self.background else ''})"
        if self.timed_out:
            pytest.fail(f"{where} did not finish within {self.timeout_s:g} s (MJX hang on CPU?)\n{self.stderr[-3000:]}")
        if self.returncode != 0:
            message = f"{where} failed:\n{self.stdout[-3000:]}\n{self.stderr[-5000:]}"
            if "\nAssertionError" in self.stderr:
                raise AssertionError(message)
            pytest.fail(message)
        sys.stdout.write(self.stdout)  # the child's measurements, shown with -s or on failure


class IsolatedRunner:
    def __init__(self, jobs: list[IsolatedJob]):
        self.jobs = jobs
        self.procs: list[subprocess.Popen] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="isolated-jobs", daemon=True)

    def _loop(self) -> None:
        for job in self.jobs:
            job.run(self.procs, self.stopping)

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        self.thread.join(timeout=60)


_JOBS: dict[str, IsolatedJob] = {}
_RUNNER: list[IsolatedRunner] = []


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    background = "PYTEST_XDIST_WORKER" not in os.environ  # an xdist worker runs only some of the collected tests
    jobs = []
    for item in session.items:
        marker = item.get_closest_marker("isolated")
        if marker is None or item.get_closest_marker("skip") is not None:
            continue
        job = IsolatedJob(str(item.path), marker.args[0], float(marker.kwargs["timeout_s"]), background)
        _JOBS[item.nodeid] = job
        jobs.append(job)
    if jobs and background:
        runner = IsolatedRunner(jobs)
        _RUNNER.append(runner)
        runner.thread.start()


def pytest_sessionfinish(session, exitstatus):
    for runner in _RUNNER:
        runner.stop()


@pytest.fixture(scope="session", autouse=True)
def _third_party_temp_dirs(tmp_path_factory):
    """stable-baselines3 makes a log folder in /tmp at every ``learn()`` (``SB3-<date>``) unless SB3_LOGDIR names
    one: point it under pytest's own temporary folder, which pytest prunes (the last 3 sessions are kept)."""
    old = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3"))
    yield
    if old is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = old


@pytest.fixture
def isolated(request) -> IsolatedJob:
    """The background job of this ``@pytest.mark.isolated`` test; ``isolated.check()`` waits for it."""
    return _JOBS[request.node.nodeid]


@pytest.fixture
def load_bench():
    """``load_bench("bench_envs")``: the module ``benchmarks/bench_envs.py`` (benchmarks/ is not a package)."""

    def load(name: str):
        path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # as an import does: dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    return load
