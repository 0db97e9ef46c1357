"""The suite: plans every case of a BenchmarkConfig, runs them with a progress bar, and writes the report.

Owns the order of cases (per env: the physical limit first, then each stage's sample_fast backends and peers), the
skip lines (missing package, incompatible combination, timeout, failure: never a crash of the whole run) and the
choice of which cases run isolated in a child process with a hard timeout.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import harness
from . import report as rep
from .config import STAGES, BenchmarkConfig, is_atari, num_threads, resolve
from .measure import CaseResult, Skip, format_rate, run_isolated, summarize
from .peers import MEASURE, PEERS, check_available, fixed_num_envs
from .stages import STAGE_FUNCTIONS, Case, compatible


def plan(cfg: BenchmarkConfig) -> tuple[list[Case], list[dict[str, str]]]:
    """Every case to measure, in run order, and the combinations skipped up front (with the reason)."""
    cases: list[Case] = []
    skipped: list[dict[str, str]] = []
    peers_by_stage = {s: [p for p in cfg.peers if PEERS[p].stage == s] for s in STAGES}
    for env in cfg.envs:
        if "mujoco_rollout" in cfg.peers:
            # The physical limit is measured whatever the stages, so every figure has its ratio.
            if env == "toy" or is_atari(env):
                skipped.append({"what": f"mujoco_rollout · {env}", "reason": "it runs MuJoCo tasks only"})
            else:
                cases += [Case("env", "peer", "mujoco_rollout", env, n) for n in cfg.num_envs]
        for stage in cfg.stages:
            for backend in cfg.backends:
                reason = compatible(backend, env)
                if reason:
                    skipped.append({"what": f"{stage} · {backend} · {env}", "reason": reason})
                    continue
                cases += [Case(stage, "sample_fast", backend, env, n) for n in cfg.num_envs]
            for peer in peers_by_stage[stage]:
                if peer == "mujoco_rollout":
                    continue
                if env == "toy":
                    skipped.append({"what": f"{peer} · {env}", "reason": "peers run MuJoCo tasks only"})
                    continue
                sizes = cfg.num_envs if PEERS[peer].sweeps else [fixed_num_envs(peer, cfg, env)]
                if peer == "gymnasium_async":  # one process per env: past the cap, one process per core instead
                    sizes = [n for n in sizes if n <= cfg.gymnasium_async_max_envs] or [num_threads(cfg)]
                cases += [Case(stage, "peer", peer, env, n) for n in sizes]
    return cases, skipped


def run_case(case: Case, cfg: BenchmarkConfig) -> CaseResult:
    """Measure one case (module-level so ``run_isolated`` can run it in a child)."""
    if case.kind == "peer":
        check_available(PEERS[case.name])
        return MEASURE[case.name](case.env, case.num_envs, cfg)
    return STAGE_FUNCTIONS[case.stage](case, cfg)


#: Backends that simulate on ``cfg.device`` (isolate=mjx runs them in a child process).
DEVICE_BACKENDS = ("mjx", "warp")


def _isolated(case: Case, cfg: BenchmarkConfig) -> bool:
    device_sim = case.kind == "sample_fast" and case.name in DEVICE_BACKENDS
    return cfg.isolate == "all" or (cfg.isolate == "mjx" and device_sim)


#: Backend options that change neither physics nor episodes, so rows using them need no note.
NON_PHYSICS_OPTIONS = ("compilation_cache_dir", "kernel_cache_dir", "cuda_graph", "num_threads", "step_timeout_s")


def _options_note(case: Case, cfg: BenchmarkConfig) -> str:
    """Rows whose physics or episode settings differ from the task's defaults say so."""
    if case.kind != "sample_fast":
        return ""
    opts = {**(cfg.env_options if case.name != "toy" else {}), **(cfg.backend_options.get(case.name) or {})}
    opts = {k: v for k, v in opts.items() if k not in NON_PHYSICS_OPTIONS and v is not None}  # None: the default
    return "options: " + ", ".join(f"{k}={v}" for k, v in sorted(opts.items())) if opts else ""


def _result_dict(case: Case, res: CaseResult, loads: list[float | None], cfg: BenchmarkConfig) -> dict[str, Any]:
    stats = summarize(res.rates)
    extra = dict(res.extra)
    extra["load_1min_at_start"] = loads  # one per round
    notes = "; ".join(n for n in (_options_note(case, cfg), res.notes) if n)
    return {
        "stage": case.stage,
        "kind": case.kind,
        "name": case.name,
        "env": case.env,
        "num_envs": case.num_envs,
        "frame_skip": res.frame_skip,
        "device": res.device,
        "env_steps_per_s": stats,
        "physics_steps_per_s": stats["median"] * res.frame_skip,
        "ratio_to_limit": None,
        "ratio_to_best_peer": None,
        "notes": notes,
        "extra": extra,
    }


def _limits(merged: dict[Case, CaseResult]) -> dict[str, Any]:
    """Physical limits from the windows measured so far (for the running log lines)."""
    rows = [
        {
            "name": c.name,
            "kind": c.kind,
            "env": c.env,
            "num_envs": c.num_envs,
            "env_steps_per_s": {"median": summarize(r.rates)["median"]},
        }
        for c, r in merged.items()
        if c.name == rep.LIMIT_PEER
    ]
    return rep.physical_limits(rows)


def _result_line(r: dict[str, Any], limits: dict[str, Any]) -> str:
    s = r["env_steps_per_s"]
    limit = limits.get(r["env"])
    ratio = f", {s['median'] / limit['env_steps_per_s']:.2f}× limit" if limit and r["name"] != rep.LIMIT_PEER else ""
    return (
        f"{r['stage']} · {r['name']} · {r['env']} · {r['num_envs']} envs: {format_rate(s['median'])} env steps/s "
        f"[{format_rate(s['min'])}–{format_rate(s['max'])}], {format_rate(r['physics_steps_per_s'])} physics "
        f"steps/s (frame_skip {r['frame_skip']}){ratio}"
    )


def run_suite(cfg: BenchmarkConfig, console: Console | None = None, write: bool = True) -> dict[str, Any]:
    """Run every planned case and (with ``write``) write ``<out_name>.{json,md,png}`` into ``cfg.out_dir``.

    Returns the report dict (the JSON's content). Raises BenchmarkConfigError on bad settings before running.
    """
    cfg = resolve(cfg)
    console = console or Console(soft_wrap=True)
    t_start = time.monotonic()
    quiet = harness.check_quiet(
        cfg.wait_quiet,
        cfg.max_busy,
        timeout_s=cfg.quiet_timeout_s,
        log=lambda m: console.print(f"[yellow]{escape(m)}[/]"),
    )
    load_before = harness.load_average()
    machine = rep.machine_info(quiet)
    cases, skipped = plan(cfg)
    for s in skipped:
        console.print(f"[yellow]skip[/] {s['what']}: {s['reason']}")
    merged, loads = _run_rounds(cases, cfg, console, skipped)
    results = [_result_dict(case, merged[case], loads[case], cfg) for case in cases if case in merged]
    report = _report(cfg, machine, quiet, load_before, time.monotonic() - t_start, results, skipped)
    console.print(summary_table(report), width=max(console.width, 150))
    if write:
        paths = write_report(report, cfg.out_dir, cfg.out_name)
        report["files"] = paths
        console.print(f"wrote {paths['json']}, {paths['markdown']}, {paths['png']}")
    return report


def _run_rounds(
    cases: list[Case], cfg: BenchmarkConfig, console: Console, skipped: list[dict[str, str]]
) -> tuple[dict[Case, CaseResult], dict[Case, list[float | None]]]:
    """Every case once per round, in plan order: each case's windows pooled over the rounds, and the 1-min load
    before each of its measurements. A case that is skipped or fails is logged into ``skipped`` and not retried; a
    backend or peer that cannot import skips its other sizes at once; Ctrl-C stops with what was measured."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        transient=True,
    )

    def log_skip(case: Case, reason: str) -> None:
        skipped.append({"what": case.label(), "reason": reason})
        console.print(f"[yellow]skip[/] {case.label()}: {reason}")

    unavailable: dict[str, str] = {}  # a backend or peer that failed to import: skip its other sizes quickly
    merged: dict[Case, CaseResult] = {}  # windows of every round, pooled per case
    loads: dict[Case, list[float | None]] = {}
    dropped: set[Case] = set()  # skipped or failed once: not retried in later rounds
    with progress:
        task = progress.add_task("benchmark", total=len(cases) * cfg.rounds)
        for round_idx in range(cfg.rounds):
            for case in cases:
                progress.update(task, description=f"{case.label()} (round {round_idx + 1}/{cfg.rounds})")
                key = f"{case.kind}:{case.name}"
                if case in dropped or (key in unavailable and round_idx > 0):
                    progress.advance(task)
                    continue
                if key in unavailable:
                    dropped.add(case)
                    log_skip(case, unavailable[key])
                    progress.advance(task)
                    continue
                load_1min = harness.load_1min()
                try:
                    if _isolated(case, cfg):
                        res = run_isolated(run_case, (case, cfg), cfg.measure_timeout_s + 60.0)
                    else:
                        res = run_case(case, cfg)
                except Skip as e:
                    reason = str(e)
                    if "install" in reason or "not available" in reason or "needs the package" in reason:
                        unavailable[key] = reason
                    dropped.add(case)
                    log_skip(case, reason)
                except KeyboardInterrupt:
                    console.print("[red]interrupted[/]: writing the results measured so far")
                    return merged, loads
                except Exception as e:  # one failing case must not lose the others' figures
                    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [""]
                    # First and last line: what failed and (for a child's traceback) the innermost error.
                    summary = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
                    dropped.add(case)
                    log_skip(case, f"failed: {type(e).__name__}: {summary[:500]}")
                    if os.environ.get("SAMPLE_FAST_BENCH_DEBUG"):
                        console.print(traceback.format_exc())
                else:
                    loads.setdefault(case, []).append(load_1min)
                    if case in merged:
                        merged[case].rates.extend(res.rates)
                    else:
                        merged[case] = res
                    line = _result_line(_result_dict(case, res, [load_1min], cfg), _limits(merged))
                    console.print(line + (f" (round {round_idx + 1}/{cfg.rounds})" if cfg.rounds > 1 else ""))
                progress.advance(task)
    return merged, loads


def _report(
    cfg: BenchmarkConfig, machine: dict[str, Any], quiet: dict[str, Any], load_before: Any, wall_s: float,
    results: list[dict[str, Any]], skipped: list[dict[str, str]],
) -> dict[str, Any]:  # fmt: skip
    """The report dict (the JSON's content): machine, load, timing, config, results with their ratios, skips."""
    limits, peers = rep.add_ratios(results)
    load_after = harness.load_average()
    usable = machine["cpu_usable"] or 1
    return {
        "schema_version": rep.SCHEMA_VERSION,
        "title": cfg.title,
        "created_utc": harness.now_utc(),
        "wall_s": round(wall_s, 2),
        "machine": machine,
        "load": {
            "before": load_before,
            "after": load_after,
            "busy": bool(load_before and load_before[0] > 0.5 * usable),
            "note": "1/5/15-min load averages; 'before' is other processes' load, as the suite had not started",
        },
        "quiet": quiet,
        "timing": {
            "rounds": cfg.rounds,
            "repeats": cfg.repeats,
            "seconds_per_repeat": cfg.seconds_per_repeat,
            "warmup_s": cfg.warmup_s,
            "measure_timeout_s": cfg.measure_timeout_s,
        },
        "config": dataclasses.asdict(cfg),
        "results": results,
        "skipped": skipped,
        "physical_limit": limits,
        "best_peer": peers,
    }


def summary_table(report: dict[str, Any]) -> Table:
    """The final figures with both ratios (known only once every peer of the stage has run)."""
    table = Table(title=f"{report['title']} (median env steps/s; load before {report['load']['before']})")
    for col in ("stage", "runner", "env"):
        table.add_column(col)
    for col in ("num_envs", "env steps/s", "spread", "physics steps/s", "× limit", "× best peer"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        s = r["env_steps_per_s"]
        table.add_row(
            r["stage"],
            r["name"] + (" (peer)" if r["kind"] == "peer" else ""),
            r["env"],
            str(r["num_envs"]),
            format_rate(s["median"]),
            f"{format_rate(s['min'])}–{format_rate(s['max'])}",
            format_rate(r["physics_steps_per_s"]),
            "—" if r["ratio_to_limit"] is None else f"{r['ratio_to_limit']:.2f}×",
            "—" if r["ratio_to_best_peer"] is None else f"{r['ratio_to_best_peer']:.2f}×",
        )
    return table


def write_report(report: dict[str, Any], out_dir: str, out_name: str = "results") -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "json": os.path.join(out_dir, f"{out_name}.json"),
        "markdown": os.path.join(out_dir, f"{out_name}.md"),
        "png": os.path.join(out_dir, f"{out_name}.png"),
    }
    report["files"] = paths  # before writing: the JSON names its siblings
    harness.write_results(out_dir, out_name, report, rep.markdown(report))
    rep.write_plot(report, paths["png"])
    return paths
