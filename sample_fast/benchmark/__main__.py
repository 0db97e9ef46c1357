"""``python -m sample_fast.benchmark [overrides]``: the Hydra entry of the FPS suite.

Composes ``configs/benchmark.yaml`` (schema: ``BenchmarkConfig``) with command-line overrides, e.g.
``python -m sample_fast.benchmark backends=[mujoco,envpool] num_envs=[64,256] stages=[env] envs=[ant] repeats=3
seconds_per_repeat=2 out_dir=benchmarks/results/mine`` or a preset: ``preset=quick``. Bad settings exit with
status 2 and a message listing the valid choices.
"""

from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from .config import BenchmarkConfig, BenchmarkConfigError, register_configs

register_configs()


def to_config(cfg: DictConfig) -> BenchmarkConfig:
    """The composed Hydra config as a BenchmarkConfig dataclass (Hydra's own ``hydra`` node dropped)."""
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, dict):  # composed without the structured schema (should not happen via the yaml)
        obj = BenchmarkConfig(**{k: v for k, v in obj.items() if k != "preset"})
    return obj


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@hydra.main(version_base=None, config_path="pkg://sample_fast.configs", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    from .suite import run_suite  # after Hydra parsed the command line: `--help` stays fast

    # SIGTERM (e.g. `timeout`, a batch system) ends the run like Ctrl-C: the results measured so far are written.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        run_suite(to_config(cfg))
    except BenchmarkConfigError as e:
        print(f"sample_fast.benchmark: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
