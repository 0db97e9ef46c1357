"""MJX compile time per task: the reset the env builds (``mjx_env.reset_forward``) against a full ``mjx.forward``.

    python benchmarks/bench_mjx_compile.py                    # humanoid -> benchmarks/results/mjx_compile/
    python benchmarks/bench_mjx_compile.py --tasks humanoid,ant --rounds 2

A gymnasium reset runs ``mj_forward``; the env's reset program and the reset branch inside its step program (the
envs whose episode ended) compute only the stages the task's observation and position read (``reset_forward``).
Each case builds ``make(task, 2, backend="mjx", xla_opt_level=0)`` -- the tests' setting -- in a fresh process and
records ``env.compile_s`` split into the reset and step programs; ``full`` swaps ``reset_forward`` for
``mjx.forward`` (what the env compiled before). Cases alternate round by round, so a load change hits both.
Compiling is single-threaded here; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "mjx_compile"

CASE = r"""
import json, sys, time
import jax.stages
from mujoco import mjx
from sample_fast.envs import make, mjx_env
task, variant = sys.argv[1], sys.argv[2]
if variant == "full":
    mjx_env.reset_forward = lambda mx, d, fields, gravcomp: mjx.forward(mx, d)
times = []
compile_ = jax.stages.Lowered.compile
def timed(self, *a, **k):
    t = time.perf_counter(); out = compile_(self, *a, **k); times.append(time.perf_counter() - t); return out
jax.stages.Lowered.compile = timed
env = make(task, 2, backend="mjx", seed=0, xla_opt_level=0)
print(json.dumps({"compile_s": env.compile_s, "reset_xla_s": times[0], "step_xla_s": times[1]}))
"""


def run_case(task: str, variant: str, timeout_s: float) -> dict:
    proc = subprocess.run([sys.executable, "-c", CASE, task, variant], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{task}/{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="humanoid")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    for task in args.tasks.split(","):
        for r in range(args.rounds):
            for variant in ("reset_forward", "full") if r % 2 == 0 else ("full", "reset_forward"):
                row = {"task": task, "variant": variant, "round": r, **run_case(task, variant, args.timeout_s)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": platform.processor() or "?",
            "command": " ".join(["python", "benchmarks/bench_mjx_compile.py", *sys.argv[1:]])}  # fmt: skip
    (args.out / "compile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    report = write_report(meta, rows, args.out)
    print(report)


def write_report(meta: dict, rows: list[dict], out: Path) -> str:
    """README.md from the rows: the median per task and variant, then every case."""
    lines = [f"# MJX compile time: reset_forward against a full mjx.forward at reset ({meta['date']})", "",
             f"`{meta['command']}`: 2 envs, `xla_opt_level=0`, each case in a fresh process; median over the rounds, "
             "seconds (`compile.json` has every case).", "",
             "| task | reset | reset program XLA s | step program XLA s | compile_s (incl. tracing) | rounds |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    keys = ("reset_xla_s", "step_xla_s", "compile_s")
    for task in dict.fromkeys(x["task"] for x in rows):
        for variant in ("full", "reset_forward"):
            sel = [x for x in rows if x["task"] == task and x["variant"] == variant]
            med = {k: statistics.median(x[k] for x in sel) for k in keys}
            name = "mjx.forward (before)" if variant == "full" else "reset_forward"
            lines.append(f"| {task} | {name} | {med['reset_xla_s']:.1f} | {med['step_xla_s']:.1f} | "
                         f"{med['compile_s']:.1f} | {len(sel)} |")  # fmt: skip
    lines += ["", "Every case: " + "; ".join(
        f"{x['task']} {x['variant']} round {x['round']}: " + " / ".join(f"{x[k]:.1f}" for k in keys) for x in rows
    ) + " (reset / step / compile_s)."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
