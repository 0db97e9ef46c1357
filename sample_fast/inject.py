"""Fault injection for rehearsing recovery in a real run: ``debug.inject=nonfinite_loss@update:20``.

Owns the parsing of ``DebugConfig.inject`` and the injectors the trainer installs from it; nothing here runs unless
a fault is named. A fault fires at the n-th event of its counter, counted from 1 in this start of the run
(``<fault>@<counter>:<n>``), or at every event from the n-th on (``<n>+``). Unknown faults, counters that do not go
with the fault and malformed entries are ``ConfigError``s, so a fault cannot be switched on by a typo.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import signal
from dataclasses import dataclass
from typing import Any

from .config import ConfigError

#: fault name -> (the counter it is placed on, what it does)
FAULTS: dict[str, tuple[str, str]] = {
    "nonfinite_loss": (
        "update",
        "the n-th learner update (one batch, one row of num_updates in progress.csv) gets NaN rewards, so its loss "
        "is non-finite: the learner skips its minibatch steps and, after learner.nonfinite_patience of them, rolls "
        "back to its last good state and lowers the learning rate",
    ),
    "sampler_crash": (
        "slot",
        "the async sampler process dies with SIGKILL right after its n-th READY slot (n counts the slots of every "
        "sampler process of this start), as after the OOM killer or a crash in native code: the runner replaces it "
        "(runner.max_sampler_restarts), the learner trains on",
    ),
    "save_error": (
        "save",
        "the n-th checkpoint save fails with ENOSPC (No space left on device) after half of its temporary file is "
        "written: the temporary file is removed, the previous checkpoints are kept, and the save is retried at the "
        "next run.checkpoint_interval_s",
    ),
}
_ENTRY = re.compile(r"^(?P<fault>[a-z_]+)@(?P<counter>[a-z_]+):(?P<at>[0-9]+)(?P<repeat>\+?)$")


@dataclass(frozen=True)
class Fault:
    name: str
    counter: str
    at: int  #: the event (1-based) it fires at
    repeat: bool  #: also at every later event

    def fires(self, count: int) -> bool:
        return count == self.at or (self.repeat and count > self.at)

    def __str__(self) -> str:
        return f"{self.name}@{self.counter}:{self.at}{'+' if self.repeat else ''}"


def parse_faults(spec: str | None) -> list[Fault]:
    """``debug.inject`` as a list of Faults (empty when unset). Raises ConfigError naming the bad entry."""
    import difflib

    faults = []
    for entry in [e.strip() for e in (spec or "").split(",") if e.strip()]:
        m = _ENTRY.match(entry)
        usage = ", ".join(f"{name}@{counter}:<n>" for name, (counter, _) in FAULTS.items())
        if m is None:
            raise ConfigError(
                f"debug.inject entry {entry!r} is not <fault>@<counter>:<n> (or <n>+ for every event from the n-th "
                f"on); the faults: {usage}"
            )
        name, counter, at = m["fault"], m["counter"], int(m["at"])
        if name not in FAULTS:
            near = difflib.get_close_matches(name, FAULTS, n=1)
            hint = f"did you mean {near[0]}@{FAULTS[near[0]][0]}:{at}? " if near else ""
            raise ConfigError(f"debug.inject: unknown fault {name!r}; {hint}the faults: {usage}")
        if counter != FAULTS[name][0] or at < 1:
            raise ConfigError(f"debug.inject: {entry!r}: use {name}@{FAULTS[name][0]}:<n> with n >= 1")
        faults.append(Fault(name, counter, at, bool(m["repeat"])))
    return faults


class Injector:
    """The faults of one run, with their counters. ``tick(counter)`` counts one event and returns the names of the
    faults that fire at it."""

    def __init__(self, faults: list[Fault]):
        self.faults = list(faults)
        self.counts: dict[str, int] = {}
        self.fired: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.faults)

    def tick(self, counter: str) -> list[str]:
        if not self.faults:
            return []
        n = self.counts[counter] = self.counts.get(counter, 0) + 1
        names = [f.name for f in self.faults if f.counter == counter and f.fires(n)]
        self.fired += [f"{name}@{counter}:{n}" for name in names]
        return names

    def save_error(self, path: os.PathLike | str) -> OSError | None:
        """The error the next checkpoint save must fail with, or None (counts one save)."""
        if "save_error" not in self.tick("save"):
            return None
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected: debug.inject)", str(path))

    def sampler_hook(self) -> Any:
        """The picklable ``slot_hook`` the runner calls in the sampler process after each READY slot (its
        ``sampler_hook``): it kills the process where ``sampler_crash`` fires; None without that fault."""
        crashes = [f for f in self.faults if f.name == "sampler_crash"]
        return functools.partial(_crash_sampler, tuple(crashes)) if crashes else None

    def wrap_learner(self, learner: Any) -> None:
        """Route ``learner.train`` through the ``update`` counter (an instance attribute shadowing the method)."""
        if not any(f.counter == "update" for f in self.faults):
            return
        train = learner.train

        def train_with_faults(batch: Any) -> dict[str, float]:
            if "nonfinite_loss" in self.tick("update"):
                batch = _with_nan_rewards(batch)
            return train(batch)

        learner.train = train_with_faults


def _crash_sampler(faults: tuple[Fault, ...], num_slots: int) -> None:
    """In the sampler process: die at once, without a traceback or any cleanup, where a fault fires."""
    if any(f.fires(num_slots) for f in faults):
        os.kill(os.getpid(), signal.SIGKILL)


def _with_nan_rewards(batch: Any) -> Any:
    """A copy of ``batch`` whose rewards are all NaN (the slot in shared memory is left as it is)."""
    import torch

    poisoned = batch.clone() if hasattr(batch, "clone") else dict(batch)
    poisoned["rewards"] = torch.full_like(batch["rewards"], math.nan)
    return poisoned
