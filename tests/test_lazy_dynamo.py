"""sample_fast/_lazy_dynamo.py: tensordict is imported without torch._dynamo, and once dynamo is imported it holds
the same marks (allow_in_graph, assume_constant_result) on tensordict's functions as after a plain import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys, time
t = time.perf_counter()
import sample_fast.trajectory_store  # imports tensordict, as every sampler and learner process does
import_s = time.perf_counter() - t
loaded_early = "torch._dynamo" in sys.modules
import torch._dynamo
from torch._dynamo import trace_rules
import tensordict, tensordict.utils, tensordict._td, tensordict.base
marked, allowed = set(), set()
for mod in (tensordict.utils, tensordict._td, tensordict.base):
    for name, obj in vars(mod).items():
        if callable(obj):
            if getattr(obj, "_dynamo_marked_constant", False):
                marked.add(f"{mod.__name__}.{name}")
            if id(obj) in trace_rules._allowed_callable_ids:
                allowed.add(f"{mod.__name__}.{name}")
print(json.dumps({"loaded_early": loaded_early, "marked": sorted(marked), "allowed": sorted(allowed),
                  "import_s": import_s}))
"""


def _probe(eager: bool) -> dict:
    env = {**os.environ, "SAMPLE_FAST_EAGER_DYNAMO": "1" if eager else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tensordict_loads_without_dynamo_and_dynamo_later_gets_the_same_marks():
    lazy, eager = _probe(eager=False), _probe(eager=True)
    assert eager["loaded_early"] and not lazy["loaded_early"]
    assert eager["marked"] and eager["allowed"]  # the reference saw tensordict's marks at all
    assert lazy["marked"] == eager["marked"]
    assert lazy["allowed"] == eager["allowed"]
