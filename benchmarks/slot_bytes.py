"""Slot bytes per env step: the TrajectoryStore layout (obs ``[T + 1, B]`` + truncation side table, no ``values``)
against the layout it replaced (dense ``obs`` and ``next_obs`` ``[T, B]``, float32 observations, ``values``).

Deterministic: it allocates the stores and counts bytes (no timing), so the figures depend only on the shapes.
Tasks: MuJoCo Ant (specs from ``make("ant")``: obs 105 float32, 8 actions, time limit 1000) and an Atari-like
84x84x4 uint8 pixel task (18 discrete actions, time limit 27000 agent steps = 108000 frames / frame skip 4).

    python benchmarks/slot_bytes.py [--rollout-len 64] [--num-envs 64] [--out benchmarks/results/slot_bytes.md]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from sample_fast.envs import Spec

from sample_fast.benchmark import harness
from sample_fast.trajectory_store import TrajectoryStore


def old_layout_bytes_per_step(observation_spec: Spec, action_spec: Spec) -> int:
    """Bytes per env step of the replaced layout, from its spec formula (every key ``[T, B, ...]``; observations
    always float32)."""
    act_dtype = torch.int64 if action_spec.is_discrete else torch.float32
    obs_shape = tuple(observation_spec.shape)
    old_spec = {
        "obs": (obs_shape, torch.float32),
        "actions": (tuple(action_spec.shape), act_dtype),
        "behavior_logp": ((), torch.float32),
        "values": ((), torch.float32),
        "rewards": ((), torch.float32),
        "terminated": ((), torch.bool),
        "truncated": ((), torch.bool),
        "next_obs": (obs_shape, torch.float32),
        "policy_version": ((), torch.int64),
    }
    return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in old_spec.values())


def ant_specs() -> tuple[Spec, Spec, int | None]:
    from sample_fast.envs import make

    env = make("ant", 1)
    try:
        return env.observation_spec, env.action_spec, env.max_episode_steps
    finally:
        env.close()


def rows(rollout_len: int, num_envs: int) -> list[dict]:
    pixels = Spec(shape=(84, 84, 4), dtype=torch.uint8)
    atari_actions = Spec(shape=(), dtype=torch.int64, num_actions=18)
    ant_obs, ant_act, ant_limit = ant_specs()
    cases = [
        ("Ant (obs 105 float32)", ant_obs, ant_act, ant_limit),
        # an env that reports no time limit gets the worst case, T rows per env: the side table then costs more
        # than the dense next_obs it replaced (the two int64 indices per row)
        ("Ant, time limit unknown", ant_obs, ant_act, None),
        ("pixels 84x84x4 uint8", pixels, atari_actions, 27_000),
    ]
    out = []
    for name, obs_spec, act_spec, max_episode_steps in cases:
        store = TrajectoryStore(obs_spec, act_spec, rollout_len, num_envs, 1, max_episode_steps=max_episode_steps)
        steps = rollout_len * num_envs
        old = old_layout_bytes_per_step(obs_spec, act_spec)
        new = store.bytes_per_slot() / steps
        out.append({"task": name, "old": old, "new": new, "ratio": new / old, "final_rows": store.final_capacity,
                    "max_episode_steps": max_episode_steps})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout-len", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "slot_bytes.md")
    args = parser.parse_args()
    table = rows(args.rollout_len, args.num_envs)
    lines = [
        "# Slot bytes per env step",
        "",
        f"`python benchmarks/slot_bytes.py` (T = {args.rollout_len}, B = {args.num_envs}; counted, not timed). "
        "Old: dense `obs` + `next_obs` `[T, B]` (float32 always) + `values`. New: `obs [T + 1, B]` in the env's "
        "dtype, the truncation side table sized `B * ceil(T / max_episode_steps)` rows, no `values`.",
        "",
        "| task | old B/step | new B/step | new / old | side-table rows | max_episode_steps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in table:
        lines.append(
            f"| {r['task']} | {r['old']:,} | {r['new']:,.1f} | {r['ratio']:.3f} | {r['final_rows']} | "
            f"{r['max_episode_steps']} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    harness.write_text(args.out, text)  # counted, not timed: no quiet check or machine record to keep
    print(text)


if __name__ == "__main__":
    main()
