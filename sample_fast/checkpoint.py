"""Checkpoints: atomic, checksummed files in ``<run_dir>/checkpoints``; the last K and the best are kept.

Owns the files under ``<run_dir>/checkpoints`` only. A save writes a temporary file in the same directory, fsyncs
it and ``os.replace``s it into place, so a crash leaves either the old file or the new one, never half of one; old
checkpoints are pruned only after the new one is in place. Each file carries a SHA-256 of its payload, so a
truncated or corrupted file is detected on load, reported with a warning naming it, and the previous one used.
What goes in the state (policy, learner, counters, RNG states, config) is the trainer's business.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import random
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

#: File layout: MAGIC, then the 32-byte SHA-256 of the payload, then the payload length (uint64 little-endian),
#: then the payload (``torch.save`` of ``{"meta": {...}, "state": state}``).
MAGIC = b"SFCKPT1\n"
_HEADER = struct.Struct("<32sQ")
_NAME_RE = re.compile(r"^ckpt_(\d{12,})\.pt$")
BEST_NAME = "best.pt"


class CheckpointError(RuntimeError):
    """A checkpoint file could not be read (truncated, corrupted, or not a sample_fast checkpoint)."""


def _fsync_dir(path: Path) -> None:
    # The rename itself must be durable too: fsync the directory entry (POSIX; a no-op where unsupported).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint_file(path: Path, payload: bytes, inject_error: OSError | None = None) -> None:
    """Atomically write ``payload`` with the checksummed header to ``path`` (tmp file + fsync + os.replace).

    On any failure the temporary file is removed (a removal that fails too, as on a read-only file system, is left
    to the next save's cleanup of stale temporary files: ``CheckpointManager._prune``) and the error propagates;
    ``path`` is untouched. ``inject_error``: raised after half the payload is written (``debug.inject``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(_HEADER.pack(hashlib.sha256(payload).digest(), len(payload)))
            if inject_error is not None:
                f.write(payload[: len(payload) // 2])
                raise inject_error
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def read_checkpoint_file(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and verify one checkpoint file; returns ``{"meta": {...}, "state": state}``.

    Raises ``CheckpointError`` naming the file when it is truncated, corrupted or not a checkpoint. Files are
    unpickled (``weights_only=False``, to carry configs and RNG states): load only checkpoints you wrote.
    """
    path = Path(path)
    data = path.read_bytes()
    head = len(MAGIC) + _HEADER.size
    if len(data) < head or not data.startswith(MAGIC):
        raise CheckpointError(f"{path}: not a sample_fast checkpoint (bad header; file truncated or foreign)")
    digest, length = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise CheckpointError(f"{path}: truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path}: checksum mismatch (file corrupted)")
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)


class CheckpointManager:
    """Saves and finds checkpoints in ``<run_dir>/checkpoints``.

    Files: ``ckpt_<env_steps, 12 digits>.pt`` (the last ``keep_last``) and ``best.pt`` (highest ``metric`` so far, a
    separate copy never pruned by keep_last). ``load_*`` return ``(state, path)`` or None when nothing readable.
    """

    def __init__(self, run_dir: str | os.PathLike, keep_last: int = 3, map_location: str | torch.device = "cpu"):
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be a positive int, got {keep_last!r}")
        self.dir = Path(run_dir) / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep_last = keep_last
        self.map_location = map_location
        self._best_metric: float | None = None
        self._best_loaded = False

    # ----- queries --------------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Regular checkpoint files, oldest first (by env steps in the name)."""
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := _NAME_RE.match(p.name))]
        return [p for _, p in sorted(found)]

    @property
    def best_path(self) -> Path:
        return self.dir / BEST_NAME

    @property
    def best_metric(self) -> float | None:
        """Metric of ``best.pt`` (read from the file once, then tracked in memory)."""
        if not self._best_loaded:
            self._best_loaded = True
            if self.best_path.exists():
                try:
                    self._best_metric = read_checkpoint_file(self.best_path, "cpu")["meta"]["metric"]
                except Exception as e:  # a corrupt best is replaced by the next save with a metric
                    log.warning(
                        "checkpoint: cannot read %s (%s); it will be replaced by the next best", self.best_path, e
                    )
        return self._best_metric

    # ----- save -----------------------------------------------------------------------------------------------
    def save(
        self, state: dict[str, Any], env_steps: int, metric: float | None = None, inject_error: OSError | None = None
    ) -> Path:
        """Write ``state`` as ``ckpt_<env_steps>.pt``; also as ``best.pt`` if ``metric`` beats the best so far.

        Atomic: on any failure (serialisation error, full disk, read-only file system, crash) existing checkpoints
        are untouched and no temporary file is left. A file system error raises OSError naming the path (its
        ``filename``); so does too little free space, checked before writing (``shutil.disk_usage``, a statvfs: the
        size is known exactly, the payload being serialised in memory first). Pruning to ``keep_last`` happens only
        after the new file is in place. ``inject_error``: see ``write_checkpoint_file``.
        """
        if env_steps < 0:
            raise ValueError(f"env_steps must be >= 0, got {env_steps}")
        meta = {"env_steps": int(env_steps), "metric": None if metric is None else float(metric), "time": time.time()}
        buffer = io.BytesIO()
        torch.save({"meta": meta, "state": state}, buffer)  # fails here -> nothing on disk changed
        payload = buffer.getvalue()
        path = self.dir / f"ckpt_{int(env_steps):012d}.pt"
        best = self.best_metric
        new_best = metric is not None and metric == metric and (best is None or metric > best)
        self._check_free_space(path, len(payload) * (2 if new_best else 1))
        write_checkpoint_file(path, payload, inject_error=inject_error)
        if new_best:
            write_checkpoint_file(self.best_path, payload)
            self._best_metric = float(metric)
        self._prune()
        return path

    def _check_free_space(self, path: Path, size: int) -> None:
        try:
            free = shutil.disk_usage(self.dir).free
        except OSError:
            return  # not measurable here: the write itself will tell
        need = size + (64 << 10)  # and 64 KiB to spare for the header, the directory entry and the logs
        if free < need:
            raise OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)} (checked before writing: {free / 2**20:.1f} MiB free, the checkpoint "
                f"needs {need / 2**20:.1f} MiB)",
                str(path),
            )

    def _prune(self) -> None:
        for old in self.checkpoints()[: -self.keep_last]:
            try:
                old.unlink()
            except OSError as e:
                log.warning("checkpoint: could not delete old checkpoint %s: %s", old, e)
        for tmp in self.dir.glob(".*.tmp-*"):  # leftovers of crashed saves, and of failed ones whose cleanup failed
            pid = tmp.name.rsplit("-", 1)[-1]
            if pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass

    # ----- load -----------------------------------------------------------------------------------------------
    def _load(self, path: Path) -> dict[str, Any] | None:
        try:
            return read_checkpoint_file(path, self.map_location)["state"]
        except Exception as e:
            log.warning("checkpoint: skipping unreadable checkpoint %s: %s", path, e)
            return None

    def load_latest(self) -> tuple[dict[str, Any], Path] | None:
        """The newest readable regular checkpoint as ``(state, path)``; unreadable ones are skipped with a warning.
        None when there is none."""
        for path in reversed(self.checkpoints()):
            state = self._load(path)
            if state is not None:
                return state, path
        return None

    def corrupt_files(self) -> list[Path]:
        """Files renamed aside as unreadable (``*.corrupt``, see ``load_resume``)."""
        return sorted(p for p in self.dir.iterdir() if ".corrupt" in p.name)

    def quarantine(self, path: Path, why: Exception) -> Path | None:
        """Rename an unreadable checkpoint to ``<name>.corrupt`` (``.corrupt-1``, ... if taken), with a warning, so
        it neither occupies one of the kept slots nor is tried again. Returns the new path (None if the rename
        failed: a read-only folder; then it is only skipped)."""
        dest = path.with_name(path.name + ".corrupt")
        i = 1
        while dest.exists():
            dest = path.with_name(f"{path.name}.corrupt-{i}")
            i += 1
        try:
            os.replace(path, dest)
        except OSError as e:
            log.warning(
                "checkpoint: %s is unreadable (%s) and could not be renamed aside (%s); skipping it", path, why, e
            )
            return None
        log.warning("checkpoint: %s is unreadable (%s); renamed it to %s and skipped it", path, why, dest.name)
        return dest

    def _read_or_quarantine(self, path: Path) -> dict[str, Any] | None:
        try:
            return read_checkpoint_file(path, self.map_location)
        except CheckpointError as e:  # truncated, corrupted, foreign: it will never read
            self.quarantine(path, e)
        except Exception as e:  # I/O trouble, an unpicklable payload: leave the file, skip it
            log.warning("checkpoint: skipping unreadable checkpoint %s: %s", path, e)
        return None

    def load_resume(self) -> tuple[dict[str, Any], Path] | None:
        """The newest intact state to resume from, ``best.pt`` included, as ``(state, path)``; None when there is
        none. Newest = the most env steps; a regular checkpoint wins a tie (the same state). Unreadable files are
        renamed aside (``quarantine``). Writes nothing else."""
        best_steps, best = -1, None
        if self.best_path.exists():
            best = self._read_or_quarantine(self.best_path)
            if best is not None:
                best_steps = int(best["meta"]["env_steps"])
            else:
                self._best_loaded, self._best_metric = True, None  # the next save with a metric writes a new one
        for path in reversed(self.checkpoints()):
            if int(_NAME_RE.match(path.name).group(1)) < best_steps:
                break
            data = self._read_or_quarantine(path)
            if data is not None:
                return data["state"], path
        if best is not None:
            log.warning(
                "checkpoint: resuming from %s (env step %d): no intact regular checkpoint is as recent",
                self.best_path, best_steps,
            )  # fmt: skip
            return best["state"], self.best_path
        return None

    def load_best(self) -> tuple[dict[str, Any], Path] | None:
        """``best.pt`` as ``(state, path)``; None (with a warning if the file is unreadable) when there is none."""
        if not self.best_path.exists():
            return None
        state = self._load(self.best_path)
        return None if state is None else (state, self.best_path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----- RNG --------------------------------------------------------------------------------------------------------
def rng_state() -> dict:
    """The main process's torch, numpy and Python RNG states, as a checkpoint stores them."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
