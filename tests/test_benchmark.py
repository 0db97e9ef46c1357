"""Tests of the FPS suite (sample_fast.benchmark): statistics and windows against hand-computed values, ratios,
Sample Factory log parsing, planning, bad input, missing peers, process clean-up, and one tiny end-to-end run
that must write a valid JSON, a Markdown row per measured case and a PNG that decodes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
from hydra import compose, initialize_config_module
from rich.console import Console

from sample_fast.benchmark import (
    BenchmarkConfig,
    BenchmarkConfigError,
    measure,
    peers,
    report,
    resolve,
    sample_factory_peer,
)
from sample_fast.benchmark.__main__ import to_config
from sample_fast.benchmark.config import TrainStageConfig
from sample_fast.benchmark.measure import MeasureTimeout, Timing, WindowRecorder, summarize
from sample_fast.benchmark.stages import Case
from sample_fast.benchmark.suite import plan, run_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compose_cfg(*overrides: str) -> BenchmarkConfig:
    """The config exactly as ``python -m sample_fast.benchmark <overrides>`` composes it (yaml + presets)."""
    with initialize_config_module("sample_fast.configs", version_base=None):
        return to_config(compose("benchmark", overrides=list(overrides)))


def quiet_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, soft_wrap=True), buf


# ----- statistics -------------------------------------------------------------------------------------------------
def test_summarize_hand_computed():
    # sorted [1, 2, 3, 4]: median (2+3)/2 = 2.5; inclusive quartiles at positions 0.75 and 2.25 -> 1.75 and 3.25
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"]) == (2.5, 1.0, 4.0, 1.75, 3.25)
    assert s["repeats"] == [4.0, 1.0, 3.0, 2.0]  # kept in measurement order
    one = summarize([7.0])
    assert (one["median"], one["q1"], one["q3"]) == (7.0, 7.0, 7.0)


def test_window_recorder_hand_computed():
    # warm-up 1 s from the first point (t=0): the window opens at the first point with t >= 1, i.e. (1.5, 300);
    # windows of 2 s close at (3.5, 900) -> 600/2 = 300/s and then (6.0, 1900) -> 1000/2.5 = 400/s.
    rec = WindowRecorder(Timing(warmup_s=1.0, repeats=2, seconds_per_repeat=2.0))
    for t, steps in [(0.0, 0), (0.5, 100), (1.5, 300), (2.5, 500), (3.5, 900), (5.0, 1400), (6.0, 1900)]:
        assert not rec.done
        rec.add(t, steps)
    assert rec.done
    assert rec.rates == pytest.approx([300.0, 400.0])
    rec.add(9.0, 99999)  # ignored once done
    assert rec.rates == pytest.approx([300.0, 400.0])


def test_window_recorder_min_points_widens_windows_hand_computed():
    # No warm-up: the window opens at (0, 0). With 1 s windows alone it would close at (1.0, 100); min_points=3
    # keeps it open until the third point after opening, (3.0, 450) -> 450/3 = 150/s. The next opens there and
    # closes at (6.0, 1350): 3 points and 3 s -> 900/3 = 300/s.
    rec = WindowRecorder(Timing(warmup_s=0.0, repeats=2, seconds_per_repeat=1.0), min_points=3)
    for t, steps in [(0.0, 0), (1.0, 100), (2.0, 250), (3.0, 450), (4.0, 750), (5.0, 1050), (6.0, 1350)]:
        assert not rec.done
        rec.add(t, steps)
    assert rec.rates == pytest.approx([150.0, 300.0])
    with pytest.raises(ValueError, match="min_points must be >= 1"):
        WindowRecorder(Timing(), min_points=0)


def test_timed_windows_counts_steps_and_charges_sync():
    # Each step "does" 10 env steps; sync sleeps 50 ms, which the window must include: with a 0.1 s window the
    # rate is at most 10 * steps / (0.1 + 0.05). We check the exact bookkeeping instead of wall-clock speed.
    calls = {"step": 0, "sync": 0}

    def step() -> int:
        calls["step"] += 1
        time.sleep(0.001)
        return 10

    def sync() -> None:
        calls["sync"] += 1
        time.sleep(0.05)

    rates = measure.timed_windows(step, sync, Timing(warmup_s=0.0, repeats=3, seconds_per_repeat=0.1))
    assert len(rates) == 3
    assert calls["sync"] == 2 + 3  # after the first step, after warm-up, and at the end of each window
    assert all(r < 10 / 0.001 * 0.1 / 0.15 + 1 for r in rates)  # sync time lowered every window's rate
    with pytest.raises(MeasureTimeout):
        measure.timed_windows(step, sync, Timing(warmup_s=0.0, repeats=100, seconds_per_repeat=0.05, timeout_s=0.2))


def test_format_rate():
    assert [measure.format_rate(x) for x in (12.4, 12345.6, 2.5e6, None)] == ["12", "12.3k", "2.50M", "—"]


# ----- ratios -----------------------------------------------------------------------------------------------------
def _r(stage, kind, name, n, median):
    return {
        "stage": stage,
        "kind": kind,
        "name": name,
        "env": "ant",
        "num_envs": n,
        "env_steps_per_s": {"median": median},
    }


def test_ratios_to_limit_and_best_peer():
    results = [
        _r("env", "peer", "mujoco_rollout", 64, 10000.0),
        _r("env", "peer", "mujoco_rollout", 256, 12000.0),  # the limit: best over the sweep
        _r("env", "peer", "envpool_raw", 64, 9000.0),
        _r("env", "peer", "gymnasium_sync", 64, 5000.0),
        _r("env", "sample_fast", "mujoco", 64, 6000.0),
        _r("train", "sample_fast", "mujoco", 64, 3000.0),  # no train peer -> no peer ratio
    ]
    limits, best = report.add_ratios(results)
    assert limits == {"ant": {"env_steps_per_s": 12000.0, "num_envs": 256, "source": "mujoco_rollout"}}
    assert best["env/ant"]["name"] == "envpool_raw"
    assert results[4]["ratio_to_limit"] == pytest.approx(0.5)
    assert results[4]["ratio_to_best_peer"] == pytest.approx(6000 / 9000)
    assert results[5]["ratio_to_limit"] == pytest.approx(0.25)
    assert results[5]["ratio_to_best_peer"] is None


def test_stage_shares_of_env_only_hand_computed():
    results = [
        _r("env", "sample_fast", "mujoco", 64, 8000.0),
        _r("env", "sample_fast", "mujoco", 256, 9000.0),
        _r("inference", "sample_fast", "mujoco", 64, 7200.0),
        _r("train", "sample_fast", "mujoco", 64, 6000.0),
        _r("train", "sample_fast", "mujoco", 256, 8100.0),
        _r("train", "sample_fast", "envpool", 64, 5000.0),  # no env-only row of envpool: no share
        _r("env", "peer", "envpool_raw", 64, 9000.0),  # peers are not our backends
    ]
    shares = {(x["stage"], x["name"], x["num_envs"]): x["share"] for x in report.stage_shares(results)}
    assert shares == {
        ("inference", "mujoco", 64): pytest.approx(0.9),
        ("train", "mujoco", 64): pytest.approx(0.75),
        ("train", "mujoco", 256): pytest.approx(0.9),
    }
    text = report.markdown(
        {"title": "t", "created_utc": "now", "machine": {"hostname": "h", "cpu_model": "c", "cpu_usable": 2},
         "load": {"before": [0], "after": [0]}, "timing": {"repeats": 1, "seconds_per_repeat": 1, "warmup_s": 0},
         "results": [dict(r, frame_skip=5, physics_steps_per_s=1.0, ratio_to_limit=None, ratio_to_best_peer=None,
                          env_steps_per_s={"median": r["env_steps_per_s"]["median"], "min": 1.0, "max": 2.0,
                                           "repeats": [1.0]}) for r in results],
         "skipped": []}
    )  # fmt: skip
    assert "| train | mujoco | ant | 64 | 6.0k | 8.0k | 0.75× |" in text


# ----- Sample Factory log parsing ---------------------------------------------------------------------------------
SF_LOG = """\
[2026-01-01 10:00:00,000][01] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0. Throughput: 0: nan.
[2026-01-01 10:00:05,000][01] Fps is (10 sec: 2000.0, 60 sec: 2000.0, 300 sec: 2000.0). Total num frames: 10240. x
[2026-01-01 10:00:10,000][01] Fps is (10 sec: 4000.0, 60 sec: 3000.0, 300 sec: 3000.0). Total num frames: 30720. x
[2026-01-01 10:00:15,000][01] Fps is (10 sec: 4500.0, 60 sec: 3500.0, 300 sec: 3500.0). Total num frames: 53248. x
[2026-01-01 10:00:20,000][01] Fps is (10 sec: 4700.0, 60 sec: 3700.0, 300 sec: 3700.0). Total num frames: 77824. x
[2026-01-01 10:00:25,000][01] Fps is (10 sec: 4800.0, 60 sec: 3800.0, 300 sec: 3800.0). Total num frames: 100352. x
[2026-01-01 10:00:26,000][01] Collected {0: 102400}, FPS: 3900.5
"""


def test_parse_sample_factory_fps():
    windows, final_fps, frames = sample_factory_peer.parse_fps(SF_LOG)
    # Reports after one with frames > 0: 4000, 4500, 4700, 4800 (2000 covers start-up); every other one -> the
    # non-overlapping 10-s windows 4000 and 4700.
    assert windows == [4000.0, 4700.0]
    assert final_fps == 3900.5
    assert frames == 102400


# ----- planning and bad input ---------------------------------------------------------------------------------------
def test_plan_enumerates_cases_and_skips_incompatible():
    cfg = resolve(
        BenchmarkConfig(
            stages=["env"],
            backends=["mujoco", "toy"],
            envs=["ant"],
            num_envs=[4, 32],
            peers=["mujoco_rollout", "gymnasium_async", "torchrl_collector", "sample_factory"],
            out_dir="unused",
        )
    )
    cases, skipped = plan(cfg)
    assert cases == [
        Case("env", "peer", "mujoco_rollout", "ant", 4),
        Case("env", "peer", "mujoco_rollout", "ant", 32),
        Case("env", "sample_fast", "mujoco", "ant", 4),
        Case("env", "sample_fast", "mujoco", "ant", 32),
        Case("env", "peer", "gymnasium_async", "ant", 4),  # 32 > gymnasium_async_max_envs (16 processes)
    ]  # torchrl and sample_factory compare with the inference and train stages, which are not selected
    assert [s["what"] for s in skipped] == ["env · toy · ant"]
    cfg.num_envs, cfg.num_threads = [64, 256], 3
    async_sizes = [c.num_envs for c in plan(cfg)[0] if c.name == "gymnasium_async"]
    assert async_sizes == [3]  # no sweep size fits: one env (process) per simulator thread


@pytest.mark.parametrize(
    "field, value, listed",
    [
        ("backends", ["mujoco", "nope"], "mujoco, envpool, mjx, warp, gymnasium, ale, toy"),
        ("envs", ["antt"], "ant"),
        ("envs", ["Pong"], "<Game>-v5"),
        ("stages", ["envs"], "env, inference, train"),
        ("peers", ["sf"], "sample_factory"),
    ],
)
def test_unknown_choice_lists_options(field, value, listed):
    with pytest.raises(BenchmarkConfigError, match="choose from") as info:
        resolve(BenchmarkConfig(**{field: value}))
    assert listed in str(info.value) and repr(value[-1]) in str(info.value)


@pytest.mark.parametrize(
    "train, message",
    [
        ({"window_calls": 0}, "train.window_calls must be an int >= 1, got 0"),
        ({"window_calls": 2.5}, "train.window_calls must be an int >= 1, got 2.5"),
        ({"warmup_s": -1.0}, "train.warmup_s must be >= 0 or null, got -1.0"),
        ({"weights_refresh": "always"}, "train.weights_refresh='always'; choose from: step, slot"),
    ],
)
def test_bad_train_stage_timing_is_named(train, message):
    with pytest.raises(BenchmarkConfigError) as info:
        resolve(BenchmarkConfig(train=TrainStageConfig(**train)))
    assert str(info.value) == message


@pytest.mark.timeout(120)
def test_cli_unknown_backend_exits_2_with_list():
    out = subprocess.run(
        [sys.executable, "-m", "sample_fast.benchmark", "backends=[mujoco,nope]", "envs=[ant]"],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "unknown backend(s) ['nope']; choose from: mujoco, envpool, mjx, warp, gymnasium, ale, toy" in out.stderr


def test_presets_compose():
    gpu = compose_cfg("preset=gpu")
    assert (gpu.backends, gpu.device, gpu.num_envs) == (["mjx", "warp"], "cuda", [4096, 16384, 65536])
    assert gpu.stages == ["env", "inference", "train"]
    cpu = compose_cfg("preset=cpu")
    mujoco_peers = ["mujoco_rollout", "envpool_raw", "gymnasium_sync", "gymnasium_async", "torchrl_collector"]
    assert (cpu.num_envs, cpu.sample_factory.env_steps) == ([64, 256], 200000)
    assert cpu.peers == [*mujoco_peers, "sample_factory"]
    atari = compose_cfg("preset=atari")
    assert (atari.envs, atari.backends, atari.train.rollout_len) == (["Pong-v5"], ["envpool", "ale"], 128)
    assert "cleanrl_ppo" in atari.peers and atari.train.learner["raw_reward_clip"] == 1.0
    ci = compose_cfg("preset=ci", "num_envs=[2,3]")
    assert (ci.envs, ci.num_envs, ci.repeats) == (["toy"], [2, 3], 1)  # command line beats preset


# ----- missing peers -------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_missing_peer_is_a_skip_line(monkeypatch, tmp_path):
    fake = peers.PeerInfo("envpool_raw", "env", True, ("surely_not_a_module_xyz",), "pip install envpool", "x")
    monkeypatch.setitem(peers.PEERS, "envpool_raw", fake)
    cfg = compose_cfg(
        "preset=ci",
        "stages=[env,train]",
        "backends=[]",
        "envs=[ant]",
        "peers=[envpool_raw,sample_factory]",
        f"sample_factory.venv={tmp_path}/no-venv",
        f"out_dir={tmp_path}",
    )
    console, buf = quiet_console()
    rep = run_suite(cfg, console=console, write=False)
    assert rep["results"] == []
    reasons = {s["what"]: s["reason"] for s in rep["skipped"]}
    assert "install with: pip install envpool" in reasons["env · envpool_raw · ant · 4 envs"]
    sf_line = next(r for w, r in reasons.items() if w.startswith("train · sample_factory"))
    assert "benchmarks/sample_factory/setup_venv.sh" in sf_line
    assert "skip env · envpool_raw · ant · 4 envs: surely_not_a_module_xyz not installed" in buf.getvalue()


# ----- processes ------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_kill_tree_ends_grandchildren():
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 5
    while len(measure.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = measure.descendants(proc.pid)
    assert len(kids) == 2
    signalled = measure.kill_tree(proc.pid, grace_s=5.0)
    proc.wait(timeout=5)
    assert set(kids) <= set(signalled)
    time.sleep(0.2)
    assert not any(measure._alive(k) for k in kids)  # re-parented to init and reaped there, or gone


@pytest.mark.timeout(60)
def test_run_isolated_hard_timeout_and_result():
    assert measure.run_isolated(divmod, (17, 5), timeout_s=40) == (3, 2)
    t0 = time.monotonic()
    with pytest.raises(MeasureTimeout, match="hard timeout"):
        measure.run_isolated(time.sleep, (60,), timeout_s=2.0)
    assert time.monotonic() - t0 < 30


# ----- the suite end to end (tiny) ---------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_tiny_suite_writes_json_markdown_png(tmp_path):
    import imageio.v3 as iio

    cfg = compose_cfg(
        "preset=ci",
        "envs=[toy,ant]",
        "backends=[toy,mujoco]",
        "peers=[mujoco_rollout]",
        f"out_dir={tmp_path}",
        "out_name=tiny",
    )
    console, buf = quiet_console()
    rep = run_suite(cfg, console=console)
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["schema_version"] == report.SCHEMA_VERSION
    for key in ("machine", "load", "timing", "config", "results", "skipped", "physical_limit", "best_peer"):
        assert key in data
    for key in ("cpu_model", "cpu_count", "packages", "hostname"):
        assert key in data["machine"]
    assert data["machine"]["packages"]["torch"]
    assert data["machine"]["git_commit"] == data["machine"]["git_revision"]  # the harness's record, old name kept
    assert len(data["load"]["before"]) == 3
    assert data["quiet"]["max_busy"] == 0.1 and data["machine"]["cpu_busy_fraction"] == data["quiet"]["busy_fraction"]
    measured = {(r["stage"], r["name"], r["env"], r["num_envs"]) for r in data["results"]}
    expected = {
        ("env", "mujoco_rollout", "ant", 4),
        ("env", "toy", "toy", 4),
        ("env", "mujoco", "ant", 4),
        ("inference", "toy", "toy", 4),
        ("inference", "mujoco", "ant", 4),
    }
    assert measured == expected, data["skipped"]
    for r in data["results"]:
        assert set(report.RESULT_FIELDS) <= set(r)
        s = r["env_steps_per_s"]
        assert len(s["repeats"]) == 1 and s["min"] <= s["median"] <= s["max"] and s["median"] > 0
        assert r["physics_steps_per_s"] == pytest.approx(s["median"] * r["frame_skip"])
        assert r["frame_skip"] == (5 if r["env"] == "ant" else 1)  # Ant-v5: 5 physics steps per env step
        if r["env"] == "ant":
            limit = data["physical_limit"]["ant"]["env_steps_per_s"]
            assert r["ratio_to_limit"] == pytest.approx(s["median"] / limit)
        else:
            assert r["ratio_to_limit"] is None
    md = (tmp_path / "tiny.md").read_text().splitlines()
    assert sum(line.startswith("Quiet check before measuring: CPU busy") for line in md) == 1
    cut = md.index("Share of env-only throughput (same backend, env and num_envs, this run):")
    rows = [line for line in md[:cut] if line.startswith("| ") and not line.startswith("| stage")]
    assert len(rows) == len(expected)
    for stage, name, env, n in expected:
        runner = name if name != "mujoco_rollout" else "mujoco_rollout (peer)"
        assert sum(line.startswith(f"| {stage} | {runner} | {env} | {n} |") for line in rows) == 1
    shares = [line for line in md[cut:] if line.startswith("| inference |")]
    assert len(shares) == 2  # inference over env-only, for toy and mujoco
    image = iio.imread(tmp_path / "tiny.png")
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 600
    assert rep["files"]["png"].endswith("tiny.png")
    assert "env · mujoco · ant · 4 envs:" in buf.getvalue()


def test_rows_with_non_default_physics_say_so():
    from sample_fast.benchmark.suite import _options_note

    mjx = Case("env", "sample_fast", "mjx", "ant", 64)
    cfg = compose_cfg()  # the default yaml gives MJX its speed settings on the CPU
    assert _options_note(mjx, cfg) == "options: ls_iterations=4, solver_iterations=1"  # cache dir is not physics
    assert _options_note(Case("env", "sample_fast", "mujoco", "ant", 64), cfg) == ""
    assert _options_note(Case("env", "peer", "mujoco_rollout", "ant", 64), cfg) == ""
    own = compose_cfg("backend_options.mjx.solver_iterations=null", "backend_options.mjx.ls_iterations=null")
    assert _options_note(mjx, own) == ""


@pytest.mark.timeout(60)
def test_rounds_pool_windows_per_case(tmp_path):
    cfg = compose_cfg("preset=ci", "rounds=3", "stages=[env]", f"out_dir={tmp_path}")
    console, buf = quiet_console()
    rep = run_suite(cfg, console=console, write=False)
    (r,) = rep["results"]  # one case (env stage, toy, 4 envs), measured once per round
    assert len(r["env_steps_per_s"]["repeats"]) == 3 and len(r["extra"]["load_1min_at_start"]) == 3
    assert r["env_steps_per_s"]["median"] == sorted(r["env_steps_per_s"]["repeats"])[1]
    assert buf.getvalue().count("(round ") == 3 and rep["timing"]["rounds"] == 3


def test_rnn_share_of_the_mlp_hand_computed():
    results = [
        _r("inference", "sample_fast", "mujoco", 64, 8000.0),
        dict(_r("inference_rnn", "sample_fast", "mujoco", 64, 6000.0), extra={"rnn": "gru"}),
        dict(_r("inference_rnn", "sample_fast", "mujoco", 128, 6000.0), extra={"rnn": "gru"}),  # no MLP row: none
    ]
    shares = report.rnn_shares(results)
    assert [(x["num_envs"], x["rnn"]) for x in shares] == [(64, "gru")]
    assert shares[0]["share"] == pytest.approx(0.75)


@pytest.mark.timeout(120)
def test_inference_rnn_stage_measures_a_recurrent_sampler():
    from sample_fast.benchmark.stages import measure_inference

    cfg = resolve(BenchmarkConfig(stages=["inference_rnn"], backends=["toy"], envs=["toy"], num_envs=[4], peers=[],
                                  repeats=1, seconds_per_repeat=0.3, warmup_s=0.0, policy_rnn="lstm",
                                  policy_rnn_size=8, rollout_len=4, progress=False, out_dir="unused"))  # fmt: skip
    res = measure_inference(Case("inference_rnn", "sample_fast", "toy", "toy", 4), cfg)
    assert res.extra["rnn"] == "lstm" and res.extra["rnn_size"] == 8
    assert min(res.rates) > 0
    with pytest.raises(BenchmarkConfigError, match="policy_rnn='rnn'; choose from: gru, lstm"):
        resolve(BenchmarkConfig(policy_rnn="rnn", out_dir="unused"))


def test_gil_switch_interval_is_checked_before_anything_runs():
    for bad in (0.0, -1e-3, 2.0):
        with pytest.raises(BenchmarkConfigError, match=r"gil_switch_interval_s must be in \(0, 1\] seconds or null"):
            resolve(BenchmarkConfig(gil_switch_interval_s=bad, out_dir="unused"))
    assert resolve(BenchmarkConfig(gil_switch_interval_s=1e-4, out_dir="unused")).gil_switch_interval_s == 1e-4


@pytest.mark.timeout(60)
def test_ctrl_c_mid_suite_keeps_what_was_measured(monkeypatch, tmp_path):
    # rounds=3 of the one toy env case: Ctrl-C during the second round's measurement ends the suite, which still
    # reports (and would write) the first round's windows instead of losing them
    import sample_fast.benchmark.suite as suite_mod

    calls = []
    real = suite_mod.run_case

    def interrupted_on_the_second_call(case, cfg):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(case, cfg)

    monkeypatch.setattr(suite_mod, "run_case", interrupted_on_the_second_call)
    cfg = compose_cfg("preset=ci", "rounds=3", "stages=[env]", f"out_dir={tmp_path}")
    console, buf = quiet_console()
    rep = run_suite(cfg, console=console, write=False)
    (r,) = rep["results"]
    assert len(calls) == 2 and len(r["env_steps_per_s"]["repeats"]) == 1  # round 1 only; round 3 never started
    assert "interrupted: writing the results measured so far" in buf.getvalue()
