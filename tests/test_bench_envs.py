"""benchmarks/bench_envs.py and bench_islands.py run end to end and report consistent figures (smoke runs, not speed
tests)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.timeout(180)
def test_bench_envs_quick_run_writes_consistent_ratios(tmp_path, monkeypatch, load_bench):
    monkeypatch.chdir(tmp_path)  # MuJoCo may write MUJOCO_LOG.TXT into the working directory
    bench = load_bench("bench_envs")
    stem = tmp_path / "envs"
    bench.main(["--quick", "--num-envs", "4", "--no-gym", "--out", str(stem)])
    report = json.loads(stem.with_suffix(".json").read_text())
    (case,) = report["cases"]
    results = case["results"]
    assert {"ours_mujoco", "rollout", "rollout_islands", "envpool_sync", "envpool_async"} <= set(results)
    assert all(r["median"] > 0 and r["cpu_us_per_step"] > 0 for r in results.values())
    for name, r in results.items():
        if name != "ours_mujoco":
            ratio = results["ours_mujoco"]["median"] / r["median"]
            assert case["ratios"][f"ours/{name}"] == pytest.approx(ratio)
            # one round: the paired ratio is that round's ratio, which is the ratio of the medians
            assert case["paired_ratios"][f"ours/{name}"] == pytest.approx(ratio)
            assert case["rounds_at_1_1x"][f"ours/{name}"] == float(ratio >= 1.1)
    ceiling = case["ceiling"]
    assert set(ceiling) == {"rollout/rollout_islands", "rollout/envpool_sync", "rollout/envpool_async"}
    assert ceiling["rollout/envpool_sync"] == pytest.approx(
        results["rollout"]["median"] / results["envpool_sync"]["median"]
    )
    # the harness's records, with the report's original machine names kept
    assert report["quiet"]["window_s"] == 1.0 and "busy_fraction" in report["quiet"]
    assert report["machine"]["cpu"] == report["machine"]["cpu_model"] and report["machine"]["versions"]["mujoco"]
    text = stem.with_suffix(".md").read_text()
    assert "Quiet check before measuring" in text
    assert "Paired by round" in text and "Ceiling" in text and "| rollout_islands |" in text


@pytest.mark.timeout(120)
def test_bench_islands_quick_run(tmp_path, load_bench):
    bench = load_bench("bench_islands")
    stem = tmp_path / "islands"
    args = ["--envs", "hopper", "--rounds", "2", "--num-envs", "2", "--num-steps", "20", "--out", str(stem)]
    report = bench.main(args)
    row = json.loads(stem.with_suffix(".json").read_text())["tasks"]["hopper"]
    assert row == report["tasks"]["hopper"]
    assert row["bit_identical"] and row["ntree"] == 1  # the benchmark's own check agrees with tests/test_env_physics.py
    assert row["skipped_us"] > 0 and row["default_us"] > 0 and row["speedup"] > 0
    assert "| hopper |" in stem.with_suffix(".md").read_text()
