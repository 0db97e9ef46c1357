"""benchmarks/race_ant_v4.py: its log/CSV readers, threshold and median logic, verdict, outputs and process control.

No real training: Sample Factory's output is a log captured from a 45-s run (tests/data/sf_ant_race_log.txt, ANSI
colour codes kept), and the process tests launch tiny Python stand-ins that print SF-style lines or append
progress.csv rows.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SF_LOG = Path(__file__).resolve().parent / "data" / "sf_ant_race_log.txt"


def _load():
    spec = importlib.util.spec_from_file_location("race_ant_v4", ROOT / "benchmarks" / "race_ant_v4.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["race_ant_v4"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


race = _load()
INF = math.inf

# The six reports of the captured log, read off the file by eye: (Total num frames, 10-sec FPS, Avg episode reward).
# The first "Fps is (10 sec: nan ...). Total num frames: 0" report has no reward line, so it gives no point.
SF_EXPECTED = [
    (4096, 819.6, -127.227),
    (12288, 1229.1, -229.070),
    (20480, 1638.4, -292.069),
    (28672, 1637.4, -132.708),
    (36864, 1636.7, -292.473),
    (45056, 1639.4, -260.931),
]


# ----- readers ----------------------------------------------------------------------------------------------------
def test_sf_log_parser_reads_the_captured_log():
    data = SF_LOG.read_bytes()
    assert b"\x1b[36m" in data  # the excerpt is raw console output, colour codes included
    points = race.parse_sf_log(data)
    assert [(p.env_steps, p.fps, p.episode_return_mean) for p in points] == SF_EXPECTED
    assert all(math.isnan(p.trainer_wall_s) for p in points)


def test_sf_log_parser_handles_lines_split_across_reads():
    data = SF_LOG.read_bytes() + "[é] Avg episode reward: [(0, '3000.500')]\n".encode()
    parser = race.SFLogParser()
    got = []
    # 7-byte reads split lines, ANSI codes and the 2-byte "é"; each point is stamped when its line completes.
    for i in range(0, len(data), 7):
        got += parser.feed(data[i : i + 7], launch_s=float(i))
    assert [(p.env_steps, p.episode_return_mean) for p in got] == [(s, r) for s, _, r in SF_EXPECTED] + [
        (45056, 3000.5)
    ]
    end_of_last_line = len(data) - 1
    assert got[-1].launch_s == float(end_of_last_line - end_of_last_line % 7)
    stamps = [p.launch_s for p in got]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_progress_csv_reader_reads_each_complete_row_once(tmp_path):
    path = tmp_path / "progress.csv"
    reader = race.ProgressCsvReader(str(path))
    assert reader.poll(1.0) == []  # the trainer has not written it yet
    path.write_text("env_steps,wall_s,fps,episode_return_mean,num_episodes\n45056.0,10.1,7496.5,,0\n")
    (first,) = reader.poll(2.0)
    assert (first.launch_s, first.env_steps, first.trainer_wall_s, first.fps) == (2.0, 45056.0, 10.1, 7496.5)
    assert math.isnan(first.episode_return_mean)  # no finished episode yet: an empty cell
    with open(path, "a") as f:
        f.write("86016.0,16.0,6978.0,2999.5")  # half a row: not taken yet
    assert reader.poll(3.0) == []
    with open(path, "a") as f:
        f.write(",12\n122880.0,21.2,7171.9,3100.25,20\n")
    rows = reader.poll(4.0)
    assert [(p.launch_s, p.env_steps, p.episode_return_mean) for p in rows] == [
        (4.0, 86016.0, 2999.5),
        (4.0, 122880.0, 3100.25),
    ]
    assert reader.poll(5.0) == []


# ----- threshold, medians, verdict ----------------------------------------------------------------------------------
def _pt(t, ret, steps=0.0):
    return race.CurvePoint(t, steps, ret)


def test_first_crossing_is_the_first_report_at_or_above_the_threshold():
    curve = [_pt(5, math.nan), _pt(10, 2999.99), _pt(15, 3000.0, 7e5), _pt(20, 3500.0)]
    assert race.first_crossing(curve, 3000.0) is curve[2]  # >= counts; NaN (no episodes yet) never does
    assert race.first_crossing(curve, 3600.0) is None
    assert race.first_crossing([], 3000.0) is None


def test_median_treats_never_reached_as_inf():
    assert race.median_time([370.0, INF, 275.0]) == 370.0  # sorted: 275, 370, inf
    assert race.median_time([INF, 100.0, INF]) == INF  # two of three never got there
    assert race.median_time([300.0, INF]) == INF  # (300 + inf) / 2
    assert race.median_time([300.0, 400.0]) == 350.0
    assert math.isnan(race.median_time([]))


def _run(contender, seed, t, wall_s=900.0):
    r = race.RunResult(contender, seed, ["cmd"], (0.1, 0.2, 0.3))
    r.time_to_threshold_s = t
    r.wall_s = t if math.isfinite(t) else wall_s
    return r


@pytest.mark.parametrize(
    "ours_times, sf_times, ratio, met",
    [
        ([100.0, 120.0, 140.0], [300.0, 350.0, 370.0], 120 / 350, True),  # 120 <= 175
        ([200.0, 180.0, 190.0], [300.0, 350.0, 370.0], 190 / 350, False),  # 190 > 175
        ([175.0, 175.0, 175.0], [350.0, 350.0, 350.0], 0.5, True),  # exactly half meets the bar
        # SF never got there in 2 of 3 (its median is inf; its lower bound is median(275, 900, 900) = 900):
        # ours' 110 <= 450, so met, with no finite ratio.
        ([100.0, 110.0, 120.0], [275.0, INF, INF], None, True),
        # ours never got there in 2 of 3: lower bound median(900, 900, 100) = 900 > 0.5 x 370
        ([INF, INF, 100.0], [300.0, 350.0, 370.0], None, False),
        # neither median is finite: ours in [900, inf], SF in [900, inf]; neither inf <= 450 nor 900 > inf holds
        ([INF, INF, 100.0], [INF, INF, INF], None, None),
    ],
)
def test_verdict(ours_times, sf_times, ratio, met):
    ours = [_run("ours", i, t, wall_s=900.0) for i, t in enumerate(ours_times)]
    sf = [_run("sf", i, t, wall_s=900.0) for i, t in enumerate(sf_times)]
    v = race.verdict(ours, sf)
    assert v["ratio"] == pytest.approx(ratio) if ratio is not None else v["ratio"] is None
    assert v["met"] is met
    assert v["ours_num_reached"] == sum(math.isfinite(t) for t in ours_times)


def test_verdict_with_one_contender_is_undetermined():
    v = race.verdict([_run("ours", 0, 100.0)], [])
    assert v["met"] is None and v["ratio"] is None and v["ours_median_s"] == 100.0


def test_plan_interleaves_contenders_by_seed():
    assert race.plan([0, 1, 2], None) == [("sf", 0), ("ours", 0), ("sf", 1), ("ours", 1), ("sf", 2), ("ours", 2)]
    assert race.plan([3, 1], "ours") == [("ours", 3), ("ours", 1)]


# ----- outputs ----------------------------------------------------------------------------------------------------
def test_summary_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(race, "machine_facts", lambda args: {"cpu_count": 2, "sf_sample-factory": "2.1.1"})
    args = race.parse_args(["--seeds", "0", "1", "--out", str(tmp_path), "--ours-overrides", "learner.lr=1e-3"])
    runs = []
    for seed, (t_ours, t_sf) in enumerate([(150.0, 300.0), (170.0, INF)]):
        for name, t in (("sf", t_sf), ("ours", t_ours)):
            r = _run(name, seed, t, wall_s=900.0)
            r.curve = [
                race.CurvePoint(10.0, 4e4, math.nan, 5000.0, 8.0),
                race.CurvePoint(
                    t if t < INF else 900.0, 1e6 * (seed + 1), 3000.0 if t < INF else 2500.0, 7000.0, 120.0
                ),
            ]
            if t < INF:
                r.steps_at_threshold, r.stop_reason = 1e6 * (seed + 1), "threshold"
            else:
                r.stop_reason = "timeout"
            race.write_curve(str(tmp_path / f"{name}_seed{seed}.csv"), r.curve)
            runs.append(r)
    summary = race.write_outputs(runs, args, str(tmp_path))

    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    by_run = {(r["contender"], r["seed"]): r for r in saved["runs"]}
    assert by_run[("ours", 1)]["time_to_threshold_s"] == 170.0
    assert by_run[("ours", 1)]["steps_at_threshold"] == 2e6
    assert by_run[("ours", 1)]["trainer_wall_s_at_threshold"] == 120.0
    assert by_run[("sf", 1)]["time_to_threshold_s"] is None and not by_run[("sf", 1)]["reached"]
    assert by_run[("sf", 1)]["stop_reason"] == "timeout"
    assert by_run[("sf", 0)]["median_fps"] == 6000.0  # median of 5000 and 7000
    assert by_run[("sf", 0)]["load_before"] == [0.1, 0.2, 0.3]
    # ours: median(150, 170) = 160; SF: median(300, inf) = inf, lower bound median(300, 900) = 600 -> met
    assert saved["contenders"]["ours"]["median_time_to_threshold_s"] == 160.0
    assert saved["contenders"]["sf"]["median_time_to_threshold_s"] is None
    assert saved["contenders"]["sf"]["median_lower_bound_s"] == 600.0
    assert saved["ratio_ours_over_sf"] is None and saved["bar_met"] is True
    assert saved["ours_overrides"] == "learner.lr=1e-3" and saved["machine"]["cpu_count"] == 2

    md = (tmp_path / "summary.md").read_text()
    assert "Verdict: **met**" in md
    # best return 3000 and median FPS 6000 from the two-point curves built above
    # avg env steps/s from the first to the last report: ours seed 0 (1e6 - 4e4) / (150 - 10) = 6857;
    # SF seed 1 (2e6 - 4e4) / (900 - 10) = 2202. Attempt 1, no quiet check recorded.
    row = "| ours_seed0 | 150 s | 1.00M | 120 s | threshold (after 150 s) | 3000 | 6857 | 1 |  | 0.10/0.20/0.30 |"
    assert row in md
    assert "| sf_seed1 | not reached |  |  | timeout (after 900 s) | 2500 | 2202 | 1 |  | 0.10/0.20/0.30 |" in md
    assert by_run[("ours", 0)]["avg_fps"] == pytest.approx(6857.143, abs=1e-3)
    assert saved["ours_solo_fps"] is None and saved["sf_solo_fps"] is None and saved["discarded_runs"] == []
    assert "not reached (> 600 s)" in md
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A later --only run keeps the recorded runs it does not redo, curves read back from their CSVs.
    kept = race.previous_runs(str(tmp_path), 3000.0, skip={("ours", 0), ("ours", 1)})
    assert sorted((r.contender, r.seed) for r in kept) == [("sf", 0), ("sf", 1)]
    sf1 = next(r for r in kept if r.seed == 1)
    assert sf1.time_to_threshold_s == INF and sf1.wall_s == 900.0
    assert [(p.launch_s, p.env_steps, p.fps) for p in sf1.curve] == [(10.0, 4e4, 5000.0), (900.0, 2e6, 7000.0)]
    assert race.previous_runs(str(tmp_path), 2500.0, skip=set()) == []  # another threshold: not comparable


# ----- processes ----------------------------------------------------------------------------------------------------
FAKE_SF = textwrap.dedent(
    """
    import subprocess, sys, time
    # a grandchild that outlives its parent, like SF's workers; its pid goes to argv[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(sys.argv[1], "w").write(str(child.pid))
    for i in range(1, 1000):
        print(f"\\x1b[36m[t][1] Fps is (10 sec: 5000.0, 60 sec: nan, 300 sec: nan). Total num frames: {i * 4096}.")
        print(f"\\x1b[36m[t][1] Avg episode reward: [(0, '{i * 100.0:.3f}')]\\x1b[0m", flush=True)
        time.sleep(0.05)
    """
)

FAKE_OURS = textwrap.dedent(
    """
    import signal, sys, time
    path, ret = sys.argv[1], float(sys.argv[2])
    def stop(signum, frame):  # the trainer's SIGINT: stop, checkpoint, exit 0
        open(path + ".sigint", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    with open(path, "w") as f:
        f.write("env_steps,wall_s,fps,episode_return_mean\\n")
    for i in range(1, 1000):
        with open(path, "a") as f:
            f.write(f"{i * 1000.0},{i * 0.05},7000.0,{ret + i}\\n")
        time.sleep(0.05)
    """
)


def _contender(name, tmp_path, script, make_reader, stop_signal, *script_args):
    return race.Contender(
        name,
        [sys.executable, "-c", script, *script_args],
        dict(os.environ),
        str(tmp_path),
        str(tmp_path / f"{name}.log"),
        make_reader,
        stop_signal,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_race_one_stops_sf_at_the_threshold_and_kills_its_orphans(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    log = str(tmp_path / "sf.log")
    c = _contender("sf", tmp_path, FAKE_SF, lambda: race.SFLogFollower(log), None, str(pid_file))
    t0 = time.monotonic()
    r = race.race_one(c, seed=0, threshold=500.0, timeout_s=30.0, poll_s=0.02)
    assert r.stop_reason == "threshold" and r.reached
    assert r.steps_at_threshold == 5 * 4096  # the report of 500.0 followed "Total num frames: 20480"
    assert 0.0 < r.time_to_threshold_s <= r.wall_s < time.monotonic() - t0
    assert [p.episode_return_mean for p in r.curve[:5]] == [100.0, 200.0, 300.0, 400.0, 500.0]
    assert not _alive(r.pid) and not _alive(int(pid_file.read_text()))
    assert race.session_pids(r.pid) == []


def test_remove_orphan_shm_deletes_only_new_torch_files_of_dead_pids(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    names = {
        "old": f"torch_{dead.pid}_old_0",  # there before: not ours to judge
        "dead": f"torch_{dead.pid}_123_4",  # new, its creator is gone: removed
        "live": f"torch_{os.getpid()}_55_1",  # new, its creator runs: kept
        "sem": "sem.mp-abc",  # new, no pid in the name: kept
    }
    (tmp_path / names["old"]).write_bytes(b"x")
    before = set(os.listdir(tmp_path))
    for key in ("dead", "live", "sem"):
        (tmp_path / names[key]).write_bytes(b"x")
    assert race.remove_orphan_shm(before, root=str(tmp_path)) == [names["dead"]]
    assert sorted(os.listdir(tmp_path)) == sorted([names["old"], names["live"], names["sem"]])
    assert race.remove_orphan_shm(before, root=str(tmp_path / "missing")) == []


@pytest.mark.timeout(60)
def test_race_one_sigints_ours_and_times_out_below_the_threshold(tmp_path):
    csv_path = str(tmp_path / "progress.csv")
    c = _contender(
        "ours", tmp_path, FAKE_OURS, lambda: race.ProgressCsvReader(csv_path), race.signal.SIGINT, csv_path, "-1e6"
    )
    r = race.race_one(c, seed=3, threshold=3000.0, timeout_s=1.5, poll_s=0.05, stop_grace_s=10.0)
    assert r.stop_reason == "timeout" and not r.reached and r.time_to_threshold_s == INF
    assert r.steps_at_threshold is None and 1.5 <= r.wall_s < 40.0  # the upper bound only catches a hang
    assert os.path.exists(csv_path + ".sigint") and r.returncode == 0  # stopped by SIGINT, not killed
    rows = r.curve
    assert len(rows) >= 5 and [p.env_steps for p in rows] == [1000.0 * (i + 1) for i in range(len(rows))]
    assert all(p.launch_s <= r.wall_s for p in rows)


@pytest.mark.timeout(60)
def test_race_one_reports_a_run_that_exits_early(tmp_path):
    csv_path = str(tmp_path / "progress.csv")
    c = _contender("ours", tmp_path, "import sys; sys.exit(3)", lambda: race.ProgressCsvReader(csv_path), 2)
    r = race.race_one(c, seed=0, threshold=3000.0, timeout_s=30.0, poll_s=0.02)
    assert (r.stop_reason, r.returncode, r.curve) == ("exited", 3, [])


def test_missing_sf_venv_names_the_install_command(tmp_path, capsys):
    with pytest.raises(race.RaceError, match=r"setup_venv\.sh"):
        race.sf_python(str(tmp_path / "no-venv"))
    code = race.main(["--only", "sf", "--sf-venv", str(tmp_path / "no-venv"), "--out", str(tmp_path / "out")])
    assert code == 2 and "bash benchmarks/sample_factory/setup_venv.sh" in capsys.readouterr().err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_commands(tmp_path):
    args = race.parse_args(["--seeds", "4", "--ours-overrides", "learner.lr=1e-3 'sampler.rollout_len=32'"])
    ours = race.ours_contender(4, args, str(tmp_path / "run"), str(tmp_path / "log"))
    assert ours.command[1:3] == ["-m", "sample_fast.train"] and ours.stop_signal == race.signal.SIGINT
    assert {"run.seed=4", f"run.dir={tmp_path / 'run'}", "logging.progress=plain", "run.time_limit_s=900"} <= set(
        ours.command
    )
    assert ours.command[-2:] == ["learner.lr=1e-3", "sampler.rollout_len=32"]
    assert ("env=ant_v4" in ours.command) == race.ant_v4_preset_available()
    sf_venv = tmp_path / "venv"
    (sf_venv / "bin").mkdir(parents=True)
    (sf_venv / "bin" / "python").touch()
    args = race.parse_args(["--sf-venv", str(sf_venv), "--sf-env-steps", "2e6"])
    sf = race.sf_contender(1, args, str(tmp_path / "sf"), str(tmp_path / "sf.log"))
    assert sf.command[0] == str(sf_venv / "bin" / "python") and sf.stop_signal is None
    assert {
        "--env=mujoco_ant",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        "--device=cpu",
        "--seed=1",
        "--train_for_env_steps=2000000",
        "--with_wandb=False",
        "--restart_behavior=overwrite",
    } <= set(sf.command)
    assert "PYTHONPATH" not in sf.env and sf.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", [True, False], ids=["env=ant_v4", "inline_options"])
def test_ours_command_composes_to_ant_v4_options(tmp_path, monkeypatch, preset):
    """Hydra accepts the race's command line, with the ant_v4 preset or without it (the options inline), and it
    selects Ant-v4's task options (--cfg job prints the composed config: no training)."""
    if preset and not race.ant_v4_preset_available():
        pytest.skip("configs/env/ant_v4.yaml is not in this tree")
    monkeypatch.setattr(race, "ant_v4_preset_available", lambda: preset)
    args = race.parse_args(["--seeds", "0"])
    ours = race.ours_contender(0, args, str(tmp_path / "run"), str(tmp_path / "log"))
    assert ("env=ant_v4" in ours.command) == preset and (race.ANT_V4_OVERRIDE in ours.command) != preset
    out = subprocess.run([*ours.command, "--cfg", "job"], capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "include_cfrc_ext_in_observation: false" in out.stdout
    assert "contact_cost_weight: 0.0" in out.stdout and "healthy_reward_always: true" in out.stdout
    assert "name: ant\n" in out.stdout and "seed: 0" in out.stdout


def test_main_interleaves_and_writes_the_finished_runs_when_interrupted(tmp_path, monkeypatch, capsys):
    """The orchestration with race_one stubbed: launch order, the per-run files, and Ctrl-C during the third run."""
    monkeypatch.setattr(race, "machine_facts", lambda args: {"cpu_count": 2})
    sf_venv = tmp_path / "venv"
    (sf_venv / "bin").mkdir(parents=True)
    (sf_venv / "bin" / "python").touch()
    launched = []

    def fake_race_one(c, seed, threshold, timeout_s, poll_s, stop_grace_s, report_every_s):
        launched.append((c.name, seed))
        if len(launched) == 3:
            raise KeyboardInterrupt
        r = race.RunResult(c.name, seed, c.command, (0.0, 0.0, 0.0))
        r.curve = [race.CurvePoint(12.5, 1e5, threshold + 1.0, 4000.0)]
        r.time_to_threshold_s, r.steps_at_threshold, r.stop_reason, r.wall_s = 12.5, 1e5, "threshold", 12.5
        return r

    monkeypatch.setattr(race, "race_one", fake_race_one)
    monkeypatch.setattr(race, "wait_until_quiet", lambda name, args: {"quiet": True})
    out = tmp_path / "out"
    argv = ["--seeds", "0", "1", "--out", str(out), "--sf-venv", str(sf_venv), "--solo-s", "0"]
    assert race.main(argv) == 130
    assert launched == [("sf", 0), ("ours", 0), ("sf", 1)]
    saved = json.loads((out / "summary.json").read_text())
    assert [(r["contender"], r["seed"], r["time_to_threshold_s"]) for r in saved["runs"]] == [
        ("sf", 0, 12.5),
        ("ours", 0, 12.5),
    ]
    assert saved["ratio_ours_over_sf"] == 1.0 and saved["bar_met"] is False  # 12.5 > 0.5 x 12.5
    assert (out / "sf_seed0.csv").read_text().splitlines()[1] == "12.500,100000,3001.000,4000.0,nan"
    assert (out / "ours_seed0").is_dir() and not (out / "ours_seed1.csv").exists()
    assert "interrupted" in capsys.readouterr().err


def test_overrides_of_keys_the_race_owns_are_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        race.parse_args(["--ours-overrides", "learner.lr=1e-3 run.seed=5"])
    assert e.value.code == 2 and "run.seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        race.parse_args(["--ours-overrides", "+run.time_limit_s=10"])
    assert race.parse_args(["--ours-overrides", "run.mode=serial"]).ours_overrides == "run.mode=serial"


# ----- fairness: average throughput, solo runs, discarding disturbed runs --------------------------------------------
def test_average_fps_is_steps_over_time_between_first_and_last_report():
    pts = [race.CurvePoint(5.0, 0.0, math.nan), race.CurvePoint(15.0, 4096.0, 1.0), race.CurvePoint(25.0, 40960.0, 2.0)]
    assert race.average_fps(pts) == (40960.0 - 0.0) / (25.0 - 5.0)  # 2048 steps/s
    assert math.isnan(race.average_fps(pts[:1]))  # one report: no span
    assert math.isnan(race.average_fps([pts[0], race.CurvePoint(7.0, 10.0, 1.0)]))  # span 2 s < 5 s


def test_too_slow_compares_with_the_solo_figure():
    solo = _run("ours", 0, INF, wall_s=120.0)
    solo.curve = [race.CurvePoint(10.0, 0.0, math.nan), race.CurvePoint(110.0, 1e6, 1.0)]  # 10k steps/s
    fast, slow = _run("ours", 0, 100.0, wall_s=100.0), _run("ours", 0, 100.0, wall_s=100.0)
    fast.curve = [race.CurvePoint(10.0, 0.0, 1.0), race.CurvePoint(110.0, 9.1e5, 2.0)]  # 9.1k: 9% below
    slow.curve = [race.CurvePoint(10.0, 0.0, 1.0), race.CurvePoint(110.0, 8.9e5, 2.0)]  # 8.9k: 11% below
    assert not race.too_slow(fast, solo, 0.10) and race.too_slow(slow, solo, 0.10)
    assert not race.too_slow(slow, None, 0.10)  # no solo figure: nothing to compare with


def test_race_measures_solo_then_discards_and_reruns_a_disturbed_run(tmp_path, monkeypatch):
    """Solo runs come first (unreachable threshold, --solo-s long); a race run averaging > --max-slowdown below its
    solo figure is renamed aside, recorded as discarded and rerun; the quiet check runs before every launch."""
    monkeypatch.setattr(race, "machine_facts", lambda args: {"cpu_count": 2})
    sf_venv = tmp_path / "venv"
    (sf_venv / "bin").mkdir(parents=True)
    (sf_venv / "bin" / "python").touch()
    launched, quiet_checks = [], []
    # steps/s of each launch in order: solo sf, solo ours, sf seed 0, ours seed 0 (disturbed), ours seed 0 again
    rates = iter([4000.0, 10000.0, 3900.0, 7000.0, 9800.0])

    def fake_race_one(c, seed, threshold, timeout_s, poll_s, stop_grace_s, report_every_s):
        launched.append((c.name, seed, threshold, timeout_s))
        rate = next(rates)
        r = race.RunResult(c.name, seed, c.command, (0.0, 0.0, 0.0))
        r.curve = [race.CurvePoint(10.0, 0.0, 100.0), race.CurvePoint(110.0, rate * 100.0, min(threshold, 3500.0))]
        if math.isfinite(threshold):
            r.time_to_threshold_s, r.steps_at_threshold, r.stop_reason = 110.0, rate * 100.0, "threshold"
        else:
            r.stop_reason = "timeout"
        r.wall_s = 110.0
        return r

    def fake_quiet(name, args):
        quiet_checks.append(name)
        return {"quiet": True, "busy_fraction": 0.02, "waited_s": 0.0}

    monkeypatch.setattr(race, "race_one", fake_race_one)
    monkeypatch.setattr(race, "wait_until_quiet", fake_quiet)
    out = tmp_path / "out"
    argv = ["--seeds", "0", "--out", str(out), "--sf-venv", str(sf_venv), "--solo-s", "60"]
    assert race.main(argv) == 0
    assert [(n, s) for n, s, _, _ in launched] == [("sf", 0), ("ours", 0), ("sf", 0), ("ours", 0), ("ours", 0)]
    assert launched[0][2:] == (INF, 60.0) and launched[1][2:] == (INF, 60.0)  # solo: never stopped by threshold
    assert launched[2][2:] == (3000.0, 900.0)
    assert quiet_checks == ["solo_sf", "solo_ours", "sf_seed0", "ours_seed0", "ours_seed0"]
    saved = json.loads((out / "summary.json").read_text())
    assert saved["sf_solo_fps"] == 4000.0 and saved["ours_solo_fps"] == 10000.0
    assert [(r["contender"], r["avg_fps"], r["attempt"]) for r in saved["runs"]] == [
        ("sf", 3900.0, 1),
        ("ours", 9800.0, 2),
    ]
    assert [(r["contender"], r["avg_fps"]) for r in saved["discarded_runs"]] == [("ours", 7000.0)]  # 70% of solo
    assert (out / "ours_seed0_attempt1.csv").exists() and (out / "ours_seed0.csv").exists()
    assert (out / "solo_sf.csv").exists() and (out / "solo_ours").is_dir()
    md = (out / "summary.md").read_text()
    assert "| discarded ours_seed0 |" in md and "7000 (70% of solo)" in md and "9800 (98% of solo)" in md
