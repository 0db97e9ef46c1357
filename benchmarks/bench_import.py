"""A process's start: ``python -c "import sample_fast.train"`` with tensordict's compile markers deferred (the
default, sample_fast/_lazy_dynamo.py) against ``SAMPLE_FAST_EAGER_DYNAMO=1`` (torch._dynamo imported with tensordict).

    python benchmarks/bench_import.py --rounds 5     # -> benchmarks/results/import_time/README.md

The two alternate round by round, each a fresh interpreter, wall time from outside. Every learner, sampler and
torchrun rank process pays this import once; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "import_time"


def one(eager: bool) -> float:
    env = {**os.environ, "SAMPLE_FAST_EAGER_DYNAMO": "1" if eager else "0"}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sample_fast.train"], env=env, check=True, timeout=120, cwd=ROOT)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    one(False)  # warm the page cache
    times: dict[str, list[float]] = {"deferred": [], "eager": []}
    for r in range(args.rounds):
        for eager in (False, True) if r % 2 == 0 else (True, False):
            times["eager" if eager else "deferred"].append(one(eager))
    load = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in times.items()}
    every = {k: ", ".join(f"{x:.2f}" for x in v) for k, v in times.items()}
    lines = [
        f"# `import sample_fast.train` in a fresh process ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`python benchmarks/bench_import.py --rounds {args.rounds}`; {os.cpu_count()} CPUs ({platform.machine()}), "
        f"load average {load:.2f} at the end; wall seconds per interpreter, alternating.",
        "",
        "| tensordict's compile markers | median s | every round |",
        "|---|---:|---|",
        f"| deferred (default) | {med['deferred']:.2f} | {every['deferred']} |",
        f"| eager (`SAMPLE_FAST_EAGER_DYNAMO=1`) | {med['eager']:.2f} | {every['eager']} |",
        "",
        f"Deferred / eager: {med['deferred'] / med['eager']:.2f}x.",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
