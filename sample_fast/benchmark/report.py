"""The suite's report: machine information, ratios to the physical limit and the best peer, Markdown and PNG.

Owns the result schema (``SCHEMA_VERSION``) and the content of the three files a run leaves in ``out_dir`` (the
harness writes them). Ratios are computed here, after every case has run, so each figure is compared with peers
measured in the same run.
"""

from __future__ import annotations

from typing import Any

from . import harness
from .measure import format_rate

SCHEMA_VERSION = 1
#: The peer whose best figure (over num_envs) is the physical limit of an env.
LIMIT_PEER = "mujoco_rollout"
RESULT_FIELDS = (
    "stage",
    "kind",
    "name",
    "env",
    "num_envs",
    "frame_skip",
    "device",
    "env_steps_per_s",
    "physics_steps_per_s",
    "ratio_to_limit",
    "ratio_to_best_peer",
    "notes",
    "extra",
)


# ----- machine ----------------------------------------------------------------------------------------------------
def machine_info(quiet_record: dict[str, Any] | None = None) -> dict[str, Any]:
    """``harness.machine_record`` plus ``git_commit``, the name this schema gave the revision before the harness."""
    machine = harness.machine_record(quiet_record)
    machine["git_commit"] = machine["git_revision"]
    return machine


# ----- ratios -----------------------------------------------------------------------------------------------------
def physical_limits(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per env: the best ``mujoco_rollout`` median over the num_envs sweep."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["name"] == LIMIT_PEER and r["kind"] == "peer":
            best = out.get(r["env"])
            if best is None or r["env_steps_per_s"]["median"] > best["env_steps_per_s"]:
                out[r["env"]] = {
                    "env_steps_per_s": r["env_steps_per_s"]["median"],
                    "num_envs": r["num_envs"],
                    "source": LIMIT_PEER,
                }
    return out


def best_peers(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``stage/env``: the best peer median (the limit itself excluded) over num_envs."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["kind"] != "peer" or r["name"] == LIMIT_PEER:
            continue
        key = f"{r['stage']}/{r['env']}"
        best = out.get(key)
        if best is None or r["env_steps_per_s"]["median"] > best["env_steps_per_s"]:
            out[key] = {"env_steps_per_s": r["env_steps_per_s"]["median"], "name": r["name"], "num_envs": r["num_envs"]}
    return out


def stage_shares(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Inference and train throughput as a share of the env-only throughput of the same backend, env and num_envs,
    measured in the same run: what the sampler and the learner cost on top of the simulator."""
    env_only = {
        (r["name"], r["env"], r["num_envs"]): r["env_steps_per_s"]["median"]
        for r in results
        if r["stage"] == "env" and r["kind"] == "sample_fast"
    }
    out = []
    for r in results:
        base = env_only.get((r["name"], r["env"], r["num_envs"]))
        if r["stage"] in ("inference", "train", "inference_rnn") and r["kind"] == "sample_fast" and base:
            median = r["env_steps_per_s"]["median"]
            out.append({"stage": r["stage"], "name": r["name"], "env": r["env"], "num_envs": r["num_envs"],
                        "env_steps_per_s": median, "env_only_steps_per_s": base, "share": median / base})  # fmt: skip
    return out


def rnn_shares(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recurrent policy's inference throughput (stage ``inference_rnn``) as a share of the MLP policy's
    (stage ``inference``), same backend, env and num_envs, this run."""
    mlp = {(r["name"], r["env"], r["num_envs"]): r["env_steps_per_s"]["median"]
           for r in results if r["stage"] == "inference" and r["kind"] == "sample_fast"}  # fmt: skip
    out = []
    for r in results:
        base = mlp.get((r["name"], r["env"], r["num_envs"]))
        if r["stage"] == "inference_rnn" and base:
            median = r["env_steps_per_s"]["median"]
            out.append({"name": r["name"], "env": r["env"], "num_envs": r["num_envs"], "rnn": r["extra"].get("rnn"),
                        "env_steps_per_s": median, "mlp_steps_per_s": base, "share": median / base})  # fmt: skip
    return out


def add_ratios(results: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fill ``ratio_to_limit`` and ``ratio_to_best_peer`` of every result; return (limits, best peers)."""
    limits, peers = physical_limits(results), best_peers(results)
    for r in results:
        median = r["env_steps_per_s"]["median"]
        limit = limits.get(r["env"])
        peer = peers.get(f"{r['stage']}/{r['env']}")
        r["ratio_to_limit"] = median / limit["env_steps_per_s"] if limit else None
        r["ratio_to_best_peer"] = median / peer["env_steps_per_s"] if peer else None
    return limits, peers


# ----- Markdown and PNG -------------------------------------------------------------------------------------------
def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def result_row(r: dict[str, Any]) -> str:
    s = r["env_steps_per_s"]
    runner = r["name"] if r["kind"] == "sample_fast" else f"{r['name']} (peer)"
    return (
        f"| {r['stage']} | {runner} | {r['env']} | {r['num_envs']} | {format_rate(s['median'])} | "
        f"{format_rate(s['min'])}–{format_rate(s['max'])} | {len(s['repeats'])} | {r['frame_skip']} | "
        f"{format_rate(r['physics_steps_per_s'])} | {_ratio(r['ratio_to_limit'])} | "
        f"{_ratio(r['ratio_to_best_peer'])} | {r.get('notes') or ''} |"
    )


def markdown(report: dict[str, Any]) -> str:
    m, t = report["machine"], report["timing"]
    lines = [
        f"# {report['title']}",
        "",
        f"{report['created_utc']} on `{m['hostname']}`: {m['cpu_model']}, {m['cpu_usable']} usable cores"
        + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f"; git {m.get('git_commit') or '?'}.",
        f"Load average (1/5/15 min) before {report['load']['before']}, after {report['load']['after']}"
        + (
            " — **the machine was busy: treat absolute figures as a lower bound, trust the ratios more**"
            if report["load"].get("busy")
            else ""
        )
        + ".",
        *([harness.quiet_line(report["quiet"])] if report.get("quiet") else []),
        f"Each figure: median of {t['repeats']} window(s) of {t['seconds_per_repeat']:g} s after a "
        f"{t['warmup_s']:g} s warm-up"
        + (f", in each of {t['rounds']} rounds over the whole plan" if t.get("rounds", 1) > 1 else "")
        + "; spread is min–max. Env steps are agent actions; physics steps = env steps × "
        "frame_skip. ×limit: ratio to raw `mujoco.rollout` (best over num_envs); ×best peer: ratio to the best "
        "peer of the same stage and env.",
        "",
        "| stage | runner | env | num_envs | env steps/s | spread | n | frame_skip | physics steps/s | × limit | "
        "× best peer | notes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [result_row(r) for r in report["results"]]
    shares = stage_shares(report["results"])
    if shares:
        lines += [
            "",
            "Share of env-only throughput (same backend, env and num_envs, this run):",
            "",
            "| stage | backend | env | num_envs | env steps/s | env-only steps/s | share |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {x['stage']} | {x['name']} | {x['env']} | {x['num_envs']} | {format_rate(x['env_steps_per_s'])} | "
            f"{format_rate(x['env_only_steps_per_s'])} | {_ratio(x['share'])} |"
            for x in shares
        ]
    rnn = rnn_shares(report["results"])
    if rnn:
        lines += [
            "",
            "Recurrent policy (inference_rnn) as a share of the MLP policy (inference), same backend, env and "
            "num_envs, this run:",
            "",
            "| backend | env | num_envs | core | env steps/s | MLP env steps/s | share |",
            "|---|---|---:|---|---:|---:|---:|",
        ]
        lines += [
            f"| {x['name']} | {x['env']} | {x['num_envs']} | {x['rnn']} | {format_rate(x['env_steps_per_s'])} | "
            f"{format_rate(x['mlp_steps_per_s'])} | {_ratio(x['share'])} |"
            for x in rnn
        ]
    if report["skipped"]:
        lines += ["", "Skipped:", ""]
        lines += [f"- {s['what']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


def write_plot(report: dict[str, Any], path: str) -> None:
    """One row per env: throughput vs num_envs (log-log; colour = runner, line style = stage, the physical limit
    in black) and, per stage, each runner's best figure over the sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    envs = list(dict.fromkeys(r["env"] for r in results)) or ["(none)"]
    names = list(dict.fromkeys(r["name"] for r in results))
    palette = plt.get_cmap("tab10").colors
    colour = {n: ("black" if n == LIMIT_PEER else palette[i % len(palette)]) for i, n in enumerate(names)}
    dashes = {"env": "-", "inference": "--", "train": ":", "inference_rnn": "-."}
    stages = ["env", "inference", "train"] + (["inference_rnn"] if any(r["stage"] == "inference_rnn" for r in results)
                                              else [])  # fmt: skip
    fig, axes = plt.subplots(len(envs), 2, figsize=(14, 4.8 * len(envs)), squeeze=False)
    for row, env in enumerate(envs):
        ax_sweep, ax_bars = axes[row]
        rs = [r for r in results if r["env"] == env]
        series: dict[tuple[str, str], list[tuple[int, float, float, float]]] = {}
        for r in rs:
            s = r["env_steps_per_s"]
            series.setdefault((r["stage"], r["name"]), []).append((r["num_envs"], s["median"], s["min"], s["max"]))
        for (stage, name), pts in series.items():
            pts.sort()
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax_sweep.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=err,
                fmt="o",
                linestyle=dashes.get(stage, "-"),
                color=colour[name],
                capsize=3,
                label=f"{name} ({stage})",
            )
        ax_sweep.set_xscale("log", base=2)
        ax_sweep.set_yscale("log")
        ax_sweep.set_xlabel("num_envs")
        ax_sweep.set_ylabel("env steps/s (median, min–max)")
        ax_sweep.set_title(f"{env}: throughput vs num_envs (line: — env, - - inference, ··· train)")
        ax_sweep.grid(True, which="both", alpha=0.3)
        if series:
            ax_sweep.legend(fontsize=7, ncol=2)
        env_names = [n for n in names if any(r["name"] == n for r in rs)]
        width = 0.8 / max(len(env_names), 1)
        for i, name in enumerate(env_names):
            heights = []
            for stage in stages:
                vals = [r["env_steps_per_s"]["median"] for r in rs if r["name"] == name and r["stage"] == stage]
                heights.append(max(vals) if vals else 0.0)
            ax_bars.bar([k + i * width for k in range(len(stages))], heights, width, label=name, color=colour[name])
        ax_bars.set_xticks([k + 0.4 - width / 2 for k in range(len(stages))], stages)
        ax_bars.set_ylabel("env steps/s (best over num_envs)")
        ax_bars.set_title(f"{env}: stages (each runner's best size)")
        ax_bars.grid(True, axis="y", alpha=0.3)
        if env_names:
            ax_bars.legend(fontsize=7)
    m = report["machine"]
    load = report["load"]["before"]
    fig.suptitle(f"{report['title']} — {m['cpu_model']}, {m['cpu_usable']} cores, load before {load}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
