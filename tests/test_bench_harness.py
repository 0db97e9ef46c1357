"""sample_fast.benchmark.harness: timing helpers, the quiet record, the machine record and the result files, against
hand-computed values (the CPU sampler is monkeypatched: no test here depends on how busy the machine is)."""

from __future__ import annotations

import argparse
import json
import math
import platform
import types

import pytest

from sample_fast.benchmark import harness, quiet


# ----- statistics ---------------------------------------------------------------------------------------------------
def test_median_hand_computed():
    assert harness.median([3.0, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_paired_ratio_is_the_median_of_per_round_ratios():
    ours, peer = [10.0, 20.0, 30.0], [5.0, 5.0, 10.0]
    # per round: 2, 4, 3 -> median 3; the ratio of the medians would be 20 / 5 = 4
    assert harness.paired_ratio(ours, peer) == 3.0
    with pytest.raises(ValueError):  # rounds must pair up
        harness.paired_ratio([1.0, 2.0], [1.0])


def test_share_at_least_hand_computed():
    # 11 >= 1.1 * 10 (yes), 10 (no), 12 (yes): 2 of 3 rounds
    assert harness.share_at_least([11.0, 10.0, 12.0], [10.0, 10.0, 10.0], 1.1) == pytest.approx(2 / 3)
    assert harness.share_at_least([1.0], [2.0], 1.0) == 0.0


def test_spread_hand_computed():
    s = harness.spread([4.0, 1.0, 3.0, 2.0])
    # inclusive quartiles of 1, 2, 3, 4: positions 0.75 and 2.25 -> 1.75 and 3.25
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"]) == (2.5, 1.0, 4.0, 1.75, 3.25)
    assert s["repeats"] == [4.0, 1.0, 3.0, 2.0]  # in measured order


# ----- timing -----------------------------------------------------------------------------------------------------
def _fake_clock(monkeypatch, step_s: float) -> None:
    """harness's perf_counter reads 0, step_s, 2 * step_s, ... (only harness sees it)."""
    ticks = iter(range(10_000))
    monkeypatch.setattr(harness, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * step_s))


def test_time_calls_passes_indices_syncs_once_and_reads_both_clocks(monkeypatch):
    _fake_clock(monkeypatch, 0.5)
    seen, syncs = [], []
    cpu = iter([1.0, 3.5])
    t = harness.time_calls(seen.append, 4, sync=lambda: syncs.append(len(seen)), cpu_clock=lambda: next(cpu))
    assert seen == [0, 1, 2, 3] and syncs == [4]  # the sync runs after the last call, inside the window
    assert t == harness.Timed(calls=4, wall_s=0.5, cpu_s=2.5)  # two wall reads (0, 0.5); cpu 3.5 - 1.0


def test_run_for_stops_after_the_time_and_the_minimum_calls(monkeypatch):
    _fake_clock(monkeypatch, 0.1)
    seen = []
    # clock: t0 = 0; after call k the check reads 0.1 * (k + 1); 0.3 >= 0.25 after the third call; the end reads 0.4
    t = harness.run_for(seen.append, 0.25, cpu_clock=lambda: 0.0)
    assert seen == [0, 1, 2] and t.calls == 3 and t.wall_s == pytest.approx(0.4)
    _fake_clock(monkeypatch, 0.1)
    t = harness.run_for(lambda k: None, 0.0, min_calls=5, cpu_clock=lambda: 0.0)
    assert t.calls == 5  # the time is up at once; min_calls decides


def test_interleave_is_round_robin():
    order = []
    cases = {name: (lambda r, name=name: order.append((name, r)) or f"{name}{r}") for name in ("a", "b", "c")}
    out = harness.interleave(cases, 2)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]
    assert out == {"a": ["a0", "a1"], "b": ["b0", "b1"], "c": ["c0", "c1"]}


# ----- quiet check ------------------------------------------------------------------------------------------------
def _sampler(monkeypatch, busy: list[float]) -> list[float]:
    """quiet.sample_cpu returns these busy shares in turn (with one busy process); returns the windows asked for."""
    shares, windows = iter(busy), []

    def sample_cpu(window_s, min_share=0.05, exclude=None):
        windows.append(window_s)
        proc = quiet.BusyProcess(42, "python", 0.5, "python spin.py")
        return quiet.CpuSample(window_s, next(shares), [1.5, 1.0, 0.5], [proc])

    monkeypatch.setattr(quiet, "sample_cpu", sample_cpu)
    return windows


def test_check_quiet_records_a_busy_machine_and_warns(monkeypatch):
    windows = _sampler(monkeypatch, [0.25])
    logged = []
    record = harness.check_quiet(max_busy=0.1, window_s=2.0, log=logged.append)
    assert windows == [2.0]
    assert record == {
        "quiet": False,
        "waited_s": 0.0,
        "window_s": 2.0,
        "busy_fraction": 0.25,
        "load_average": [1.5, 1.0, 0.5],
        "processes": [{"pid": 42, "name": "python", "cpu_share": 0.5, "cmdline": "python spin.py"}],
        "max_busy": 0.1,
        "waited": False,
    }
    (msg,) = logged
    assert "busy 25%" in msg and "python[42] 0.50 cores" in msg and "--wait-quiet" in msg
    line = harness.quiet_line(record)
    assert "CPU busy 25% over 2 s (threshold 10%), load [1.5, 1.0, 0.5]" in line and "lower bounds" in line


def test_check_quiet_quiet_machine_logs_nothing(monkeypatch):
    _sampler(monkeypatch, [0.05])
    logged = []
    record = harness.check_quiet(max_busy=0.1, window_s=1.0, log=logged.append)
    assert record["quiet"] is True and record["busy_fraction"] == 0.05 and logged == []
    assert harness.quiet_line(record).endswith(": quiet.")


def test_check_quiet_waits_until_quiet(monkeypatch):
    windows = _sampler(monkeypatch, [0.9, 0.5, 0.05])
    logged = []
    record = harness.check_quiet(wait=True, max_busy=0.1, window_s=0.0, timeout_s=10.0, log=logged.append)
    assert record["quiet"] and record["waited"] and record["busy_fraction"] == 0.05 and len(windows) == 3
    assert logged == [] and "after waiting" in harness.quiet_line(record)


def test_unmeasurable_busy_share_counts_as_quiet(monkeypatch):
    _sampler(monkeypatch, [math.nan])
    record = harness.check_quiet(log=pytest.fail)
    assert record["quiet"] and "CPU busy unmeasurable" in harness.quiet_line(record)


def test_quiet_arguments_reach_check_quiet(monkeypatch):
    windows = _sampler(monkeypatch, [0.15])
    p = argparse.ArgumentParser()
    harness.add_quiet_arguments(p)
    defaults = p.parse_args([])
    assert (defaults.wait_quiet, defaults.max_busy, defaults.quiet_window_s) == (False, 0.10, 1.0)
    args = p.parse_args(["--max-busy", "0.2", "--quiet-window-s", "0.5"])
    record = harness.check_quiet_from_args(args, log=pytest.fail)  # 15% is under the raised threshold
    assert record["quiet"] and record["max_busy"] == 0.2 and windows == [0.5]


# ----- machine record ---------------------------------------------------------------------------------------------
def test_machine_record_fields(monkeypatch):
    windows = _sampler(monkeypatch, [0.07])
    m = harness.machine_record()  # no quiet record: it samples the CPUs itself
    assert windows == [harness.QUIET_WINDOW_S] and m["cpu_busy_fraction"] == 0.07
    assert m["cpu_model"] and m["cpu_count"] >= 1 and 1 <= m["cpu_usable"] <= m["cpu_count"]
    assert m["python"] == platform.python_version() and m["platform"] == platform.platform()
    assert len(m["load_average"]) == 3
    assert m["packages"]["torch"] and set(m["packages"]) == set(harness.PACKAGES)
    assert m["git_revision"]  # the tests run from a git checkout
    m2 = harness.machine_record({"busy_fraction": 0.33})
    assert m2["cpu_busy_fraction"] == 0.33 and windows == [harness.QUIET_WINDOW_S]  # no second sample
    json.dumps(m2)  # a result file can hold it


def test_package_versions_missing_is_none():
    assert harness.package_versions(["no-such-package-xyz"]) == {"no-such-package-xyz": None}


# ----- result files -----------------------------------------------------------------------------------------------
def test_write_results_json_and_markdown(tmp_path):
    paths = harness.write_results(tmp_path / "out", "r", {"a": 1, "x": math.nan}, "# title")
    assert paths == {"json": str(tmp_path / "out" / "r.json"), "markdown": str(tmp_path / "out" / "r.md")}
    data = json.loads((tmp_path / "out" / "r.json").read_text())
    assert data["a"] == 1 and math.isnan(data["x"])
    assert (tmp_path / "out" / "r.md").read_text() == "# title\n"  # a final newline is added when missing
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.json", "r.md"]  # no temporary left


def test_write_results_merge_keeps_other_keys(tmp_path):
    harness.write_results(tmp_path, "s", {"a": 1, "b": 2})
    harness.write_results(tmp_path, "s", {"b": 3, "c": 4}, merge=True)
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 1, "b": 3, "c": 4}
    harness.write_results(tmp_path, "s", {"d": 5})  # without merge: replaced
    assert json.loads((tmp_path / "s.json").read_text()) == {"d": 5}
    assert harness.write_results(tmp_path, "m", None, "x\n") == {"markdown": str(tmp_path / "m.md")}
    assert not (tmp_path / "m.json").exists()


def test_split_stem():
    assert harness.split_stem("a/b/envs") == ("a/b", "envs")
    assert harness.split_stem("envs") == (".", "envs")


def test_run_case_in_subprocess_returns_the_result_or_an_error_row(tmp_path):
    script = tmp_path / "case.py"
    script.write_text(
        "import json, sys, time\n"
        "case = json.loads(sys.argv[2])\n"
        "if case['kind'] == 'crash': sys.exit('boom')\n"
        "if case['kind'] == 'hang': time.sleep(60)\n"
        "print('noise'); print('RESULT ' + json.dumps({'rate': case['n'] * 2}))\n"
    )
    ok = harness.run_case_in_subprocess(str(script), {"kind": "ok", "n": 21}, timeout_s=30)
    assert ok["rate"] == 42 and ok["wall_s"] > 0 and "error" not in ok
    crash = harness.run_case_in_subprocess(str(script), {"kind": "crash", "n": 1}, timeout_s=30)
    assert crash["error"].startswith("exit 1: boom") and crash["kind"] == "crash"
    hang = harness.run_case_in_subprocess(str(script), {"kind": "hang", "n": 1}, timeout_s=1, timeout_note=" (hung)")
    assert hang["error"] == "timeout after 1 s (hung)"
