"""Atari in the FPS suite: planning, the Atari peers (EnvPool sync/async, ale-py's vector env, gymnasium's Python
pipeline, the CleanRL-style PPO, Sample Factory's Atari example), their preprocessing against our backends', and the
CleanRL-style script's score bookkeeping against hand-computed values."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
from sample_fast.envs import make

from sample_fast.benchmark import BenchmarkConfig, cleanrl_peer, peers, resolve, sample_factory_peer
from sample_fast.benchmark.stages import Case
from sample_fast.benchmark.suite import plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cleanrl_ppo_atari  # noqa: E402


def tiny(**kw) -> BenchmarkConfig:
    base = dict(repeats=2, seconds_per_repeat=0.2, warmup_s=0.0, measure_timeout_s=60.0, num_threads=1, out_dir="x")
    return resolve(BenchmarkConfig(**{**base, **kw}))


def test_plan_runs_atari_on_its_backends_and_peers_only():
    cfg = tiny(
        stages=["env", "train"],
        backends=["mujoco", "envpool", "ale"],
        envs=["Pong-v5", "ant"],
        num_envs=[8],
        peers=["mujoco_rollout", "envpool_raw", "ale_vector_raw", "cleanrl_ppo"],
    )
    cases, skipped = plan(cfg)
    pong = [c for c in cases if c.env == "Pong-v5"]
    assert pong == [
        Case("env", "sample_fast", "envpool", "Pong-v5", 8),
        Case("env", "sample_fast", "ale", "Pong-v5", 8),
        Case("env", "peer", "envpool_raw", "Pong-v5", 8),
        Case("env", "peer", "ale_vector_raw", "Pong-v5", 8),
        Case("train", "sample_fast", "envpool", "Pong-v5", 8),
        Case("train", "sample_fast", "ale", "Pong-v5", 8),
        Case("train", "peer", "cleanrl_ppo", "Pong-v5", 8),  # CleanRL's 8 envs
    ]
    what = {s["what"] for s in skipped}
    assert {"mujoco_rollout · Pong-v5", "env · mujoco · Pong-v5", "train · mujoco · Pong-v5", "env · ale · ant"} <= what
    with pytest.raises(Exception, match="Pong-v4|envs"):
        resolve(BenchmarkConfig(envs=["Pong-v4"], out_dir="x"))  # not an Atari name (<Game>-v5) nor a task


@pytest.mark.parametrize("peer", ["envpool_raw", "envpool_raw_async", "ale_vector_raw", "gymnasium_sync"])
def test_atari_env_peers_step_pong(peer):
    res = peers.MEASURE[peer]("Pong-v5", 4, tiny())
    assert res.frame_skip == 4 and len(res.rates) == 2 and min(res.rates) > 0


def test_atari_peers_preprocess_like_our_backends():
    """Same frames shape and dtype, same action set: the env-only ratios compare the same work."""
    ours = make("Pong-v5", 2, backend="envpool")
    try:
        pool, frame_skip = peers._envpool_pool("Pong-v5", 2, tiny(), batch_size=2)
        obs, _ = pool.reset()
        assert obs.shape[1:] == tuple(ours.observation_spec.shape) == (4, 84, 84) and obs.dtype == np.uint8
        assert pool.action_space.n == ours.action_spec.num_actions and frame_skip == ours.frame_skip
        pool.close()
        gym_vec = peers._gymnasium_atari("Pong-v5", 2, "sync")
        obs, _ = gym_vec.reset(seed=0)
        assert obs.shape[1:] == (4, 84, 84) and obs.dtype == np.uint8
        assert gym_vec.single_action_space.n == ours.action_spec.num_actions
        gym_vec.close()
    finally:
        ours.close()
    with pytest.raises(peers.Skip, match="Atari games"):
        peers.MEASURE["ale_vector_raw"]("ant", 4, tiny())


def test_game_stats_count_a_game_only_when_the_last_life_is_lost():
    stats = cleanrl_ppo_atari.GameStats(2)
    # env 0 loses a life (terminated by episodic life, 2 lives left): no game ends; env 1 scores 1
    step = dict(reward=np.array([0.0, 1.0]), lives=np.array([2, 3]))
    assert stats.update(step, np.array([True, False]), np.array([False, False])) == []
    # env 0 scores 3 unclipped, then loses its last life; env 1 is truncated by the frame cap
    step = dict(reward=np.array([3.0, -1.0]), lives=np.array([0, 3]))
    assert stats.update(step, np.array([True, False]), np.array([False, True])) == [(3.0, 2), (0.0, 2)]
    assert stats.returns.tolist() == [0.0, 0.0] and stats.lengths.tolist() == [0, 0]


def test_parse_cleanrl_updates():
    log = "A.L.E. banner\nupdate 1 global_step 64 sps 10.0 score_mean100 nan\nupdate 2 global_step 128 sps 55.5 x\n"
    assert cleanrl_peer.parse_updates(log) == [(1, 64, 10.0), (2, 128, 55.5)]


@pytest.mark.timeout(120)
def test_cleanrl_peer_bounded_run():
    cfg = tiny()
    cfg.cleanrl.num_envs, cfg.cleanrl.num_steps, cfg.cleanrl.env_steps = 2, 16, 3 * 32
    res = cleanrl_peer.run_cleanrl("Pong-v5", cfg)
    assert len(res.rates) == 2 and min(res.rates) > 0  # 3 updates, the first (start-up) left out
    assert res.extra["updates"] == 3 and res.frame_skip == 4


def test_sample_factory_atari_command():
    cfg = BenchmarkConfig(num_threads=2)
    assert sample_factory_peer.sf_env("Pong-v5") == "atari_pong"
    assert sample_factory_peer.sf_env("MontezumaRevenge-v5") == "atari_montezuma"
    assert sample_factory_peer.sf_env("ant") == "mujoco_ant" and sample_factory_peer.sf_env("toy") is None
    cmd = sample_factory_peer.command("Breakout-v5", cfg, "/tmp/x")
    assert cmd[1:3] == ["-m", "sf_examples.atari.train_atari"] and "--env=atari_breakout" in cmd
    assert "--summaries_use_frameskip=False" in cmd  # agent steps, as every other runner counts
    assert "--summaries_use_frameskip=False" not in sample_factory_peer.command("ant", cfg, "/tmp/x")


def test_cleanrl_sticky_actions_option(capsys):
    assert cleanrl_ppo_atari.parse_args([]).repeat_action_probability == 0.0  # EnvPool's default, as CleanRL
    assert cleanrl_ppo_atari.parse_args(["--repeat-action-probability", "0.25"]).repeat_action_probability == 0.25
    with pytest.raises(SystemExit):
        cleanrl_ppo_atari.parse_args(["--repeat-action-probability", "1.5"])
    assert "--repeat-action-probability must be in [0, 1]" in capsys.readouterr().err


def test_pong_race_times_to_a_mean_score(tmp_path, load_bench):
    race = load_bench("pong_race")
    ours = tmp_path / "progress.csv"
    ours.write_text("env_steps,wall_s,episode_return_mean\n100,10,\n200,20,-12\n300,30,0.5\n400,40,-1\n")
    peer = tmp_path / "updates.csv"
    peer.write_text("wall_s,global_step,sps,score_mean100\n15,100,9,nan\n35,300,9,-16\n45,400,9,-5\n")
    a, b = race.read_ours(str(ours)), race.read_peer(str(peer))
    assert a.first_reach(-15.0) == (20.0, 200.0) and a.first_reach(0.0) == (30.0, 300.0)
    assert a.first_reach(1.0) is None and b.first_reach(-15.0) == (45.0, 400.0)
    assert math.isnan(a.at_time(15)) and a.at_time(35) == 0.5 and b.at_time(40) == -16.0
    assert a.at_steps(250) == -12.0 and b.at_steps(399) == -16.0 and math.isnan(b.at_steps(99))
    assert a.median_fps() == 10.0 and b.median_fps() == 10.0  # 100 steps per 10 s in each interval
    text = race.table([a, b])
    assert "| >= +0 | 30 s (0.00M) | not reached in 45 s (0.00M) |" in text
    assert race.main(["--ours", str(ours), "--peer", str(peer), "--out", str(tmp_path / "race")]) == 0
    assert (tmp_path / "race.png").stat().st_size > 0 and (tmp_path / "race.md").read_text() == text + "\n"
    # our run alone (gpu_pong.sh): one column, the +20 row, wall-clock marks within the run and its end (40 s)
    assert race.main(["--ours", str(ours), "--out", str(tmp_path / "alone"), "--title", "Pong-v5 on one GPU"]) == 0
    alone = (tmp_path / "alone.md").read_text().splitlines()
    assert alone[0] == "| mean score of the last 100 games | sample_fast env=pong |"
    assert "| >= +20 | not reached in 40 s (0.00M) |" in alone and "| at 40 s | -1.00 |" in alone
    assert not any(line.startswith("| at 60 s") for line in alone)
    # with Sample Factory's curve (sf_pong_race.py's curve.csv, its launch clock) as a third column
    sf = tmp_path / "curve.csv"
    sf.write_text(
        "launch_s,env_steps,episode_return_mean,fps,trainer_wall_s\n12,100,nan,0,nan\n22,250,-3,15,nan\n"
        "32,350,0,10,nan\n"
    )
    c = race.read_sf(str(sf))
    assert c.first_reach(-5.0) == (22.0, 250.0) and c.first_reach(0.0) == (32.0, 350.0) and c.median_fps() == 15.0
    assert race.main(["--ours", str(ours), "--peer", str(peer), "--sf", str(sf), "--out", str(tmp_path / "three")]) == 0
    three = (tmp_path / "three.md").read_text().splitlines()
    head = "| mean score of the last 100 games | sample_fast env=pong | CleanRL-style PPO | Sample Factory 2.1.1 |"
    assert three[0] == head
    assert "| >= +0 | 30 s (0.00M) | not reached in 45 s (0.00M) | 32 s (0.00M) |" in three


# A stand-in for .venv-sf's python: as SF's Atari example it prints two reports in SF's log format, stamped with the
# wall time as SF stamps its lines (the second one at a mean score of +0.5), then trains on (sleeps) until it is
# killed. Asked to check the sticky-actions hook (-c ... sample_fast_sf_sticky ...), it answers as the hook would
# when bin/hook exists (its content, or else $SAMPLE_FAST_SF_STICKY) and fails as a venv without it otherwise;
# asked for versions (any other -c), it prints none.
FAKE_SF = """#!/bin/sh
bin="$(dirname "$0")"
if [ "$1" = "-c" ]; then
  case "$2" in *sample_fast_sf_sticky*)
    [ -f "$bin/hook" ] || { echo "ModuleNotFoundError: No module named 'sample_fast_sf_sticky'" >&2; exit 1; }
    v="$(cat "$bin/hook")"; echo "sticky ${v:-$SAMPLE_FAST_SF_STICKY}"; exit 0;;
  esac
fi
if [ "$1" != "-m" ]; then exit 0; fi
echo "$@" > "$bin/argv"
echo "$SAMPLE_FAST_SF_STICKY" > "$bin/sticky"
echo $$ > "$bin/pid"
now() { date '+%Y-%m-%d %H:%M:%S,%3N'; }  # SF's stamp, to the millisecond
echo "[$(now)][00123] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0."
sleep 1
echo "[$(now)][00123] Fps is (10 sec: 200.0, 60 sec: 190.0, 300 sec: 190.0). Total num frames: 2048."
echo "[$(now)][00123] Avg episode reward: [(0, '-20.500')], avg true_objective: [(0, '-20.500')]"
echo "[$(now)][00123] Fps is (10 sec: 210.0, 60 sec: 200.0, 300 sec: 200.0). Total num frames: 4096."
echo "[$(now)][00123] Avg episode reward: [(0, '0.500')], avg true_objective: [(0, '0.500')]"
exec sleep 120
"""


def _fake_sf_venv(tmp_path, hook=True):
    venv = tmp_path / "venv-sf"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_SF)
    python.chmod(0o755)
    if hook:
        (venv / "bin" / "hook").write_text("")
    return venv


def test_sf_pong_race_follows_sample_factory_and_stops_its_session(tmp_path, load_bench):
    import json

    from sample_fast.procs import pid_alive

    sfr = load_bench("sf_pong_race")
    venv = _fake_sf_venv(tmp_path)
    out = tmp_path / "out"
    argv = ["--time-limit-s", "60", "--out-dir", str(out), "--sf-venv", str(venv), "--stop-at", "0", "--seed", "3"]
    assert sfr.main([*argv, "--sf-workers", "2", "--quiet-timeout-s", "1"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] == "threshold" and meta["steps_at_0"] == 4096 and meta["best_mean_score"] == 0.5
    assert 0 < meta["time_to_0_s"] < 60 and meta["final_env_steps"] == 4096
    curve = sfr.race.read_curve(str(out / "curve.csv"))
    assert [(p.env_steps, p.episode_return_mean, p.fps) for p in curve] == [(2048, -20.5, 200.0), (4096, 0.5, 210.0)]
    # the FPS suite's layout: the example's 8 envs over the 2 workers, agent steps counted, the seed passed on
    sent = (venv / "bin" / "argv").read_text().split()
    for flag in ("--env=atari_pong", "--num_workers=2", "--num_envs_per_worker=4", "--summaries_use_frameskip=False",
                 "--seed=3", "--device=cpu"):  # fmt: skip
        assert flag in sent
    # sticky actions as env=pong plays, checked before the launch and passed to every SF process
    assert meta["sticky_actions"] == 0.25 and (venv / "bin" / "sticky").read_text().strip() == "0.25"
    # SF's whole session is gone (the fake's `sleep` would have run for 2 minutes)
    assert meta["pid"] > 0 and not pid_alive(meta["pid"]) and not sfr.race.session_pids(meta["pid"])


def test_sf_pong_race_interrupted_keeps_the_curve_and_stops_sample_factory(tmp_path):
    """SIGTERM mid-race (what a batch system sends): SF's session is killed, curve.csv comes from its log."""
    import csv
    import json
    import signal
    import subprocess
    import time

    venv = _fake_sf_venv(tmp_path)
    out = tmp_path / "out"
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sf_pong_race.py")
    argv = ["--time-limit-s", "60", "--out-dir", str(out), "--sf-venv", str(venv), "--stop-at", "5"]
    proc = subprocess.Popen([sys.executable, script, *argv, "--quiet-timeout-s", "1", "--sticky", "0"])
    try:
        deadline = time.monotonic() + 60
        while b"'0.500'" not in ((out / "stdout.log").read_bytes() if (out / "stdout.log").exists() else b""):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] == "interrupted" and meta["sticky_actions"] == 0.0
    assert meta["time_to_0_s"] is not None and meta["steps_at_0"] == 4096 and meta["best_mean_score"] == 0.5
    rows = list(csv.DictReader(open(out / "curve.csv")))
    assert [(float(r["env_steps"]), float(r["episode_return_mean"])) for r in rows] == [(2048, -20.5), (4096, 0.5)]
    # stamped by SF's own clock since the launch: after the fake's 1-s pause, before the interrupt
    assert all(0.5 < float(r["launch_s"]) < meta["wall_s"] + 1 for r in rows)
    assert (venv / "bin" / "sticky").read_text().strip() == "0.0"
    from sample_fast.procs import pid_alive

    assert not pid_alive(int((venv / "bin" / "pid").read_text()))  # the fake's `sleep 120` (exec'd: same pid)


@pytest.mark.parametrize("value, expected", [("0.25", 0.25), ("", 0.0)])
def test_sf_sticky_hook_sets_ale_repeat_action_probability(value, expected):
    """The hook setup_venv.sh installs in .venv-sf, run here on this venv's gymnasium and ale-py (a fresh process:
    it patches gymnasium.make): NoFrameskip-v4 ids get the variable's value, other ids and an unset variable not."""
    import subprocess

    hook_dir = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sample_factory")
    code = "import sample_fast_sf_sticky as s; print('sticky', s.check(), s.check('ALE/Pong-v5'))"
    env = dict(os.environ, PYTHONPATH=hook_dir, SAMPLE_FAST_SF_STICKY=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("sticky ")]
    assert [float(x) for x in line.split()[1:]] == [expected, 0.25]  # Pong-v5 keeps its own default


def test_sf_log_timed_stamps_points_by_sf_clock(load_bench):
    import datetime

    race = load_bench("race_ant_v4")
    log = (
        "\x1b[36m[2026-12-03 10:00:05,000][00123] Fps is (10 sec: 100.0, 60 sec: 1, 300 sec: 1). "
        "Total num frames: 1024.\x1b[0m\n"
        "[2026-12-03 10:00:07,250][00123] Avg episode reward: [(0, '-3.000')]\n"
        "no stamp here\n"
    )
    launch = datetime.datetime(2026, 12, 3, 10, 0, 0).timestamp()  # SF stamps local time, as this does
    (point,) = race.parse_sf_log_timed(log, launch)
    assert (point.env_steps, point.episode_return_mean, point.fps) == (1024, -3.0, 100.0)
    assert point.launch_s == pytest.approx(7.25, abs=1e-6)


def test_sf_pong_race_bad_input_writes_nothing(tmp_path, load_bench, capsys):
    sfr = load_bench("sf_pong_race")
    out = tmp_path / "out"
    argv = ["--out-dir", str(out), "--sf-venv", str(tmp_path / "missing")]
    assert sfr.main(["--time-limit-s", "60", *argv]) == 2
    assert "build it with: bash benchmarks/sample_factory/setup_venv.sh" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sfr.main(["--time-limit-s", "0", *argv])
    assert "--time-limit-s=0 must be > 0 seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sfr.main(["--time-limit-s", "60", "--sticky", "1.5", *argv])
    assert "--sticky=1.5 must be in [0, 1)" in capsys.readouterr().err
    # a venv without the sticky-actions hook, or one whose hook sets another value: the fix named, nothing written
    venv = _fake_sf_venv(tmp_path, hook=False)
    argv = ["--time-limit-s", "60", "--out-dir", str(out), "--sf-venv", str(venv)]
    assert sfr.main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot set sticky actions" in err and "setup_venv.sh" in err and "sample_fast_sf_sticky" in err
    (venv / "bin" / "hook").write_text("0")
    assert sfr.main(argv) == 2
    assert "sticky actions 0, not --sticky=0.25" in capsys.readouterr().err
    assert not out.exists() and not (venv / "bin" / "argv").exists()


def test_gpu_scripts_parse_and_pin_the_wheels_the_trainer_imports():
    # The GPU scripts run only on a lent GPU (benchmarks/gpu_*.sh): a syntax error there would cost a scarce session.
    # gpu_setup.sh's wheel list must pin every package the trainer and the ale backend import that the GPU image lacks.
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for script in sorted((root / "benchmarks").glob("gpu_*.sh")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    setup = (root / "benchmarks" / "gpu_setup.sh").read_text()
    wheels = re.search(r'GPU_WHEELS="([^"]*)"', setup).group(1).split()
    pinned = {w.split("==")[0] for w in wheels if "==" in w}
    assert len(pinned) == len(wheels)  # every wheel pinned to one version
    needed = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "tensordict", "gymnasium", "ale-py", "mujoco"}
    assert needed <= pinned, needed - pinned
