"""Training logs: a live terminal line, TensorBoard events, ``progress.csv`` and ``learning_curve.png``.

Owns everything the trainer writes for humans in the run directory except checkpoints and the config. It is fed by
the runner hooks in the main (learner) process: ``add_episodes`` with finished episodes, ``add_train`` with the
learner's metrics; it writes one row every ``LogConfig.interval_s`` seconds. On resume the CSV continues: rows past
the checkpoint's env step are dropped (they were logged after the state that is being resumed) and TensorBoard
purges them too; the counters (episodes, updates) and the return window continue from the checkpoint
(``state_dict``). Logs never stop training: a sink that fails (full disk, read-only file system) is reported in one
warning line; the CSV is retried with the next row, TensorBoard is switched off for the rest of the run.
"""

from __future__ import annotations

import collections
import csv
import logging
import math
import os
import sys
import threading
import time
from typing import Any

import torch

from .config import LogConfig

#: CSV columns written first, in this order; the learner's metrics follow, sorted by name.
BASE_COLUMNS = (
    "env_steps",
    "wall_s",
    "fps",
    "episode_return_mean",
    "episode_return_max",
    "episode_length_mean",
    "num_episodes",
    "num_updates",
)
#: Values that persist between rows (the latest measurement), written in every row from the first on so that the CSV
#: header (fixed by the first row) has them: seconds the last checkpoint save took (0 before the first), and the
#: sampler processes replaced so far (the elastic sampler; it continues on resume).
GAUGES = ("checkpoint_s", "sampler_restarts")
CSV_NAME = "progress.csv"
log = logging.getLogger(__name__)
PLOT_NAME = "learning_curve.png"


def read_csv(path: str) -> list[dict[str, float]]:
    """Rows of a progress.csv as floats (empty cells become NaN)."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: _float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _float(v: str | None) -> float:
    try:
        return float(v) if v not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.1f}k"
    if a >= 100 or float(v).is_integer():
        return f"{v:.0f}"
    return f"{v:.3g}"


class ProgressLogger:
    """Collects episodes and learner metrics; writes terminal/CSV/TensorBoard rows every ``cfg.interval_s``.

    Args:
        run_dir: the run directory (must exist).
        cfg: the logging section.
        total_env_steps: the run's target, for the progress bar.
        start_env_steps, start_wall_s: counters to continue from on resume (0 for a fresh run).
        start_state: ``state_dict()`` of the run being resumed (episode and update counts, the return window).
    """

    def __init__(
        self,
        run_dir: str,
        cfg: LogConfig,
        total_env_steps: int,
        start_env_steps: int = 0,
        start_wall_s: float = 0.0,
        start_state: dict[str, Any] | None = None,
    ):
        self.run_dir, self.cfg, self.total_env_steps = run_dir, cfg, total_env_steps
        self.start_wall_s = start_wall_s
        self._t0 = time.monotonic()
        self._returns: collections.deque[float] = collections.deque(maxlen=cfg.return_window)
        self._lengths: collections.deque[float] = collections.deque(maxlen=cfg.return_window)
        self._num_episodes = 0
        self._num_updates = 0
        self._updates_here = 0  # this process's updates (FPS is measured from its first)
        self._gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)  # 0 until measured (no empty CSV cells)
        self._failed: set[str] = set()  # sinks whose last write failed (warned once per failure streak)
        if start_state:
            self._num_episodes = int(start_state.get("num_episodes", 0))
            self._num_updates = int(start_state.get("num_updates", 0))
            self._gauges["sampler_restarts"] = float(start_state.get("sampler_restarts", 0))
            self._returns.extend(start_state.get("returns", []))
            self._lengths.extend(start_state.get("lengths", []))
        self._metric_sums: dict[str, float] = {}
        self._metric_counts: dict[str, int] = {}
        self._last_row_t = self._t0
        self._last_row_steps = start_env_steps
        self.env_steps = start_env_steps
        self.last_row: dict[str, float] = {}
        self._csv_columns: list[str] | None = None
        self.csv_path = os.path.join(run_dir, CSV_NAME)
        self._closed = False

        if cfg.csv:
            self._guard("csv", self._truncate_csv, start_env_steps)
        self._tb = None
        self._old_excepthook = None
        if cfg.tensorboard:
            self._guard("tensorboard", self._open_tb, start_env_steps)
        mode = cfg.progress
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode = mode
        self._live = None
        if mode == "rich":
            self._start_rich(start_env_steps)

    # ----- inputs from the runner hooks ---------------------------------------------------------------------
    def add_episodes(self, returns: torch.Tensor, lengths: torch.Tensor) -> None:
        """Finished episodes: returns ``[E]`` float, lengths ``[E]`` int."""
        r = returns.detach().float().cpu().tolist()
        n = lengths.detach().float().cpu().tolist()
        self._returns.extend(r)
        self._lengths.extend(n)
        self._num_episodes += len(r)

    def add_train(self, env_steps: int, metrics: dict[str, float]) -> None:
        """One learner update's scalar metrics; writes a row when ``interval_s`` has passed."""
        if self._updates_here == 0:
            # FPS is measured from the first update on: start-up (process spawn, env build, JIT) is not throughput
            self._last_row_t, self._last_row_steps = time.monotonic(), env_steps
        self.env_steps = env_steps
        self._num_updates += 1
        self._updates_here += 1
        for k, v in metrics.items():
            try:
                v = float(v)
            except (TypeError, ValueError):
                continue
            self._metric_sums[k] = self._metric_sums.get(k, 0.0) + v
            self._metric_counts[k] = self._metric_counts.get(k, 0) + 1
        now = time.monotonic()
        if now - self._last_row_t >= self.cfg.interval_s:
            self.write_row(env_steps)
        elif self._live is not None:
            self._update_rich(env_steps, None)

    @property
    def wall_s(self) -> float:
        """Training seconds so far, including those of the runs this one resumes."""
        return self.start_wall_s + (time.monotonic() - self._t0)

    def episode_return_mean(self) -> float:
        return sum(self._returns) / len(self._returns) if self._returns else math.nan

    def add_sampler_restart(self) -> int:
        """Count one replaced sampler process (the ``sampler_restarts`` column); returns the count so far."""
        self._gauges["sampler_restarts"] += 1
        return int(self._gauges["sampler_restarts"])

    def set_gauge(self, name: str, value: float) -> None:
        """A value reported in every row from now on (one of GAUGES), e.g. ``checkpoint_s``."""
        self._gauges[name] = float(value)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed run's counters continue (``start_state``)."""
        return {
            "num_episodes": self._num_episodes,
            "num_updates": self._num_updates,
            "sampler_restarts": int(self._gauges["sampler_restarts"]),
            "returns": list(self._returns),
            "lengths": list(self._lengths),
        }

    # ----- sinks that never stop training -------------------------------------------------------------------
    def _guard(self, sink: str, fn, *args: Any) -> Any:
        """Run one sink's write; on failure warn once (until it works again) and return None."""
        try:
            out = fn(*args)
        except Exception as e:  # OSError mostly (full disk, read-only), whatever a library wraps it in
            if sink not in self._failed:
                self._failed.add(sink)
                where = {"csv": self.csv_path, "tensorboard": os.path.join(self.run_dir, "tb")}.get(sink, self.run_dir)
                then = {
                    "csv": "retrying with the next row",
                    "tensorboard": "TensorBoard logging is off for the rest of this run",
                }.get(sink, "going on without it")
                log.warning("logging: could not write %s (%s: %s); %s; training goes on", where,
                            type(e).__name__, e, then)  # fmt: skip
            if sink == "tensorboard":
                self._close_tb()
            return None
        if sink in self._failed and sink != "tensorboard":
            self._failed.discard(sink)
            log.warning("logging: %s is written again", sink)
        return out

    def _open_tb(self, start_env_steps: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events at steps >= it: those logged after the checkpoint we resume from. The checkpoint's
        # own step (the previous run's last row) is kept: + 1.
        self._tb = SummaryWriter(
            os.path.join(self.run_dir, "tb"), purge_step=start_env_steps + 1 if start_env_steps else None
        )
        # TensorBoard writes from a thread that, when a write fails, re-raises there (a traceback on stderr) and
        # then in the next add_scalar/flush here, where _guard reports it once: keep the thread's traceback quiet.
        self._old_excepthook = threading.excepthook
        threading.excepthook = _quiet_tensorboard_thread(self._old_excepthook)

    def _write_tb(self, row: dict[str, float]) -> None:
        step = int(row["env_steps"])
        for k, v in row.items():
            if k != "env_steps" and not math.isnan(v):
                group = "charts" if k in BASE_COLUMNS else "learner"
                self._tb.add_scalar(f"{group}/{k}", v, step)
        self._tb.flush()

    def _close_tb(self) -> None:
        tb, self._tb = self._tb, None
        if tb is not None:
            try:
                tb.close()
            except Exception:  # already reported by _guard; a second failure is not news
                pass
        if self._old_excepthook is not None:
            threading.excepthook, self._old_excepthook = self._old_excepthook, None

    # ----- outputs ------------------------------------------------------------------------------------------
    def write_row(self, env_steps: int) -> dict[str, float]:
        """Average what arrived since the last row and write it to every sink. Returns the row."""
        now = time.monotonic()
        dt = max(now - self._last_row_t, 1e-9)
        row: dict[str, float] = {
            "env_steps": float(env_steps),
            "wall_s": round(self.wall_s, 3),
            "fps": (env_steps - self._last_row_steps) / dt,
            "episode_return_mean": self.episode_return_mean(),
            "episode_return_max": max(self._returns) if self._returns else math.nan,
            "episode_length_mean": sum(self._lengths) / len(self._lengths) if self._lengths else math.nan,
            "num_episodes": float(self._num_episodes),
            "num_updates": float(self._num_updates),
        }
        row.update(self._gauges)
        for k in sorted(self._metric_sums):
            if k not in row:
                row[k] = self._metric_sums[k] / self._metric_counts[k]
        self._metric_sums.clear()
        self._metric_counts.clear()
        self._last_row_t, self._last_row_steps = now, env_steps
        self.last_row = row
        if self.cfg.csv:
            self._guard("csv", self._write_csv, row)
        if self._tb is not None:
            self._guard("tensorboard", self._write_tb, row)
        self._print_row(row)
        return row

    def close(self, env_steps: int | None = None, plot: bool = True) -> None:
        """Write a last row, close the sinks and draw ``learning_curve.png`` (unless ``plot`` is False)."""
        if self._closed:
            return
        self._closed = True
        try:
            if env_steps is not None and (env_steps != self._last_row_steps or not self.last_row):
                self.write_row(env_steps)
        finally:
            if self._live is not None:
                try:
                    self._live.stop()
                except OSError:
                    pass
                self._live = None
            if self._tb is not None:
                self._guard("tensorboard", self._tb.close)
                self._close_tb()
        if plot and self.cfg.plot and self.cfg.csv and "csv" not in self._failed:
            self._guard("plot", plot_learning_curve, self.csv_path, os.path.join(self.run_dir, PLOT_NAME))

    # ----- CSV ----------------------------------------------------------------------------------------------
    def _truncate_csv(self, start_env_steps: int) -> None:
        """Keep the existing header and the rows up to the resumed env step (a fresh run removes nothing: the
        directory is new)."""
        if not os.path.exists(self.csv_path):
            return
        with open(self.csv_path, newline="") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            rows = [r for r in reader if _float(r.get("env_steps")) <= start_env_steps]
        if not columns:
            return
        self._csv_columns = columns
        tmp = self.csv_path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.csv_path)

    def _write_csv(self, row: dict[str, float]) -> None:
        new = self._csv_columns is None
        # the header is fixed by the first row; metrics that appear later go to TensorBoard only
        columns = list(row) if new else self._csv_columns
        with open(self.csv_path, "a" if not new else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
        self._csv_columns = columns  # only once the header is on disk: a failed first write is retried whole

    # ----- terminal -----------------------------------------------------------------------------------------
    def _summary(self, row: dict[str, float]) -> str:
        parts = [
            f"steps {_fmt(row['env_steps'])}/{_fmt(float(self.total_env_steps))}",
            f"fps {_fmt(row['fps'])}",
            f"return {_fmt(row['episode_return_mean'])}",
        ]
        ranks = [row[k] for k in sorted((k for k in row if k.startswith("fps_rank")), key=lambda k: int(k[8:]))]
        if ranks and sum(ranks) > 0:  # distributed: each rank's share of the env steps/s
            parts.append("ranks " + "/".join(f"{100 * f / sum(ranks):.0f}%" for f in ranks))
        if "policy_lag_mean" in row:
            parts.append(f"lag {_fmt(row['policy_lag_mean'])}/{_fmt(row.get('policy_lag_max', math.nan))}")
        for k in ("policy_loss", "value_loss", "entropy", "kl"):  # the learner's metric names (Learner.update)
            if k in row:
                parts.append(f"{k} {_fmt(row[k])}")
        parts.append(f"{row['wall_s']:.0f}s")
        return "  ".join(parts)

    def _print_row(self, row: dict[str, float]) -> None:
        if self.mode == "off":
            return
        text = self._summary(row)
        try:
            if self._live is not None:
                self._live.console.print(text, highlight=False)
                self._update_rich(int(row["env_steps"]), row)
            else:
                print(text, flush=True)
        except (OSError, ValueError):  # the terminal is gone (SIGHUP) or the pipe closed: the files still get it
            pass

    def _start_rich(self, start_env_steps: int) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

        self._live = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            refresh_per_second=2,
        )
        self._task = self._live.add_task("train", total=self.total_env_steps, completed=start_env_steps, stats="")
        self._live.start()

    def _update_rich(self, env_steps: int, row: dict[str, Any] | None) -> None:
        # the bar line stays short (narrow terminals); the full row is printed above it by _print_row
        short = f"fps {_fmt(row['fps'])}  return {_fmt(row['episode_return_mean'])}" if row is not None else None
        fields = {"stats": short} if short is not None else {}
        self._live.update(self._task, completed=min(env_steps, self.total_env_steps), **fields)


def _quiet_tensorboard_thread(previous):
    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread":  # tensorboard.summary.writer.event_file_writer
            return
        previous(args)

    return hook


def plot_learning_curve(csv_path: str, png_path: str) -> str | None:
    """Plot mean episode return (and FPS) against env steps from ``csv_path``; returns ``png_path`` or None when
    there is nothing to plot."""
    rows = read_csv(csv_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")  # headless: never opens a window
    import matplotlib.pyplot as plt

    steps = [r["env_steps"] for r in rows]
    returns = [r.get("episode_return_mean", math.nan) for r in rows]
    fps = [r.get("fps", math.nan) for r in rows]
    fig, (ax_r, ax_f) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 1])
    ax_r.plot(steps, returns, color="tab:blue")
    ax_r.set_ylabel("mean episode return")
    ax_r.grid(alpha=0.3)
    ax_r.set_title(os.path.basename(os.path.dirname(os.path.abspath(csv_path))) or "learning curve")
    ax_f.plot(steps, fps, color="tab:gray")
    ax_f.set_ylabel("env steps/s")
    ax_f.set_xlabel("env steps")
    ax_f.grid(alpha=0.3)
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)
    return png_path
