"""MJX compile time per task: the env as it is against a variant of its programs or compile options.

    python benchmarks/bench_mjx_compile.py                    # humanoid -> benchmarks/results/mjx_compile/
    python benchmarks/bench_mjx_compile.py --tasks humanoid,ant --rounds 2
    python benchmarks/bench_mjx_compile.py --variants current,llvm_cheap --tasks humanoid,hopper \
        --out benchmarks/results/mjx_compile_llvm_passes

Variants: ``current`` (the env as it is; called ``reset_forward`` in the first result), ``full`` (a full
``mjx.forward`` at reset instead of ``reset_forward``), ``llvm_cheap`` (the env as it is, in a process with
``XLA_FLAGS=--xla_llvm_disable_expensive_passes=true``, measured for the test suite and not adopted:
benchmarks/results/mjx_compile_llvm_passes/; XLA reads it from the environment only: the same key among
``compile()``'s compiler options changed nothing here).

A gymnasium reset runs ``mj_forward``; the env's reset program and the reset branch inside its step program (the
envs whose episode ended) compute only the stages the task's observation and position read (``reset_forward``).
Each case builds ``make(task, 2, backend="mjx", xla_opt_level=0)`` -- the tests' setting -- in a fresh process and
records ``env.compile_s`` split into the reset and step programs, then the median time of 20 env steps (what the
compile options may cost at run time). The order of the variants turns round by round, so a load change hits all.
Compiling is single-threaded here; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sample_fast.benchmark import harness

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "mjx_compile"

CASE = r"""
import json, statistics, sys, time
import jax.stages, torch
from mujoco import mjx
from sample_fast.envs import make, mjx_env
task, variant = sys.argv[1], sys.argv[2]
if variant == "full":
    mjx_env.reset_forward = lambda mx, d, fields, gravcomp: mjx.forward(mx, d)
else:
    assert variant in ("current", "llvm_cheap"), variant  # llvm_cheap: XLA_FLAGS set by run_case
times = []
compile_ = jax.stages.Lowered.compile
def timed(self, *a, **k):
    t = time.perf_counter(); out = compile_(self, *a, **k); times.append(time.perf_counter() - t); return out
jax.stages.Lowered.compile = timed
env = make(task, 2, backend="mjx", seed=0, xla_opt_level=0)
env.reset(seed=0)
actions = torch.zeros(2, env.action_spec.shape[0])
steps = []
for _ in range(22):
    t = time.perf_counter(); env.step(actions); steps.append(time.perf_counter() - t)
print(json.dumps({"compile_s": env.compile_s, "reset_xla_s": times[0], "step_xla_s": times[1],
                  "step_ms": 1e3 * statistics.median(steps[2:])}))
"""


#: XLA_FLAGS of the llvm_cheap variant
LLVM_CHEAP = "--xla_llvm_disable_expensive_passes=true"
#: the variants and their names in the report
VARIANTS = {"current": "current", "full": "mjx.forward at reset", "llvm_cheap": "LLVM's expensive passes off"}


def run_case(task: str, variant: str, timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # current/full: XLA's defaults
    if variant == "llvm_cheap":
        env["XLA_FLAGS"] = LLVM_CHEAP
    proc = subprocess.run([sys.executable, "-c", CASE, task, variant], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, env=env)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{task}/{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="humanoid")
    ap.add_argument("--variants", default="current,full", help=f"comma-separated: {', '.join(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--out", type=Path, default=OUT)
    harness.add_quiet_arguments(ap)
    args = ap.parse_args()
    variants = args.variants.split(",")
    if "current" not in variants or not set(variants) <= set(VARIANTS):
        ap.error(f"--variants must include current and name only {', '.join(VARIANTS)}: {variants}")
    quiet = harness.check_quiet_from_args(args)
    rows = []
    for task in args.tasks.split(","):
        for r in range(args.rounds):
            for variant in variants if r % 2 == 0 else variants[::-1]:
                row = {"task": task, "variant": variant, "round": r, **run_case(task, variant, args.timeout_s)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": harness.cpu_model(),
            "command": " ".join(["python", "benchmarks/bench_mjx_compile.py", *sys.argv[1:]]),
            "machine": harness.machine_record(quiet), "quiet": quiet}  # fmt: skip
    (args.out / "compile.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    report = write_report(meta, rows, variants, args.out)
    print(report)


def write_report(meta: dict, rows: list[dict], variants: list[str], out: Path) -> str:
    """README.md from the rows: the median per task and variant with its ratio to ``current``, then every case."""
    lines = [f"# MJX compile time: {' vs '.join(VARIANTS[v] for v in variants)} ({meta['date']}, {meta['cpu']})", "",
             f"`{meta['command']}`: 2 envs, `xla_opt_level=0`, each case in a fresh process; median over the rounds, "
             "seconds (`compile.json` has every case); step: median of 20 env steps after the compile.", "",
             harness.quiet_line(meta["quiet"]), "",
             "| task | variant | reset program XLA s | step program XLA s | compile_s (incl. tracing) | x current | "
             "step ms | rounds |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    keys = ("reset_xla_s", "step_xla_s", "compile_s", "step_ms")
    for task in dict.fromkeys(x["task"] for x in rows):
        med = {}
        for variant in variants:
            sel = [x for x in rows if x["task"] == task and x["variant"] == variant]
            med[variant] = {k: statistics.median(x[k] for x in sel) for k in keys} | {"n": len(sel)}
        for variant, m in med.items():
            ratio = m["compile_s"] / med["current"]["compile_s"]
            lines.append(f"| {task} | {VARIANTS[variant]} | {m['reset_xla_s']:.1f} | {m['step_xla_s']:.1f} | "
                         f"{m['compile_s']:.1f} | {ratio:.2f}x | {m['step_ms']:.1f} | {m['n']} |")  # fmt: skip
    lines += ["", "Every case: " + "; ".join(
        f"{x['task']} {x['variant']} round {x['round']}: " + " / ".join(f"{x[k]:.1f}" for k in keys) for x in rows
    ) + " (reset / step / compile_s / step ms)."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
