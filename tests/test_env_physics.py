"""envs.physics: skipping MuJoCo's constraint-island discovery for one-tree models changes no result."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
from sample_fast.envs import make
from sample_fast.envs.physics import build_model, skip_island_discovery
from sample_fast.envs.tasks import TASKS, resolve_options

ISLAND = int(mujoco.mjtDisableBit.mjDSBL_ISLAND)

TWO_FREE_BOXES = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body pos="0 0 1"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body pos="1 0 1"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  </worldbody>
</mujoco>
"""


ONE_SLEEPING_BOX = """
<mujoco>
  <option><flag sleep="enable"/></option>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body pos="0 0 1"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
  </worldbody>
</mujoco>
"""


def test_discovery_is_skipped_only_where_there_is_one_tree():
    for name, task in TASKS.items():
        model = build_model(task, resolve_options(task, {}, {}))
        assert model.ntree == 1 and model.opt.disableflags & ISLAND, name
    two = mujoco.MjModel.from_xml_string(TWO_FREE_BOXES)
    assert two.ntree == 2
    assert not skip_island_discovery(two) and not two.opt.disableflags & ISLAND  # two islands are possible: kept
    sleepy = mujoco.MjModel.from_xml_string(ONE_SLEEPING_BOX)
    assert sleepy.ntree == 1 and sleepy.opt.enableflags & int(mujoco.mjtEnableBit.mjENBL_SLEEP)
    assert not skip_island_discovery(sleepy) and not sleepy.opt.disableflags & ISLAND  # sleeping works per island
    with make("ant", 2, backend="mujoco") as env:  # what the backend steps
        assert env.model.opt.disableflags & ISLAND


def _trajectory(model: mujoco.MjModel, frame_skip: int, num_envs: int, num_steps: int) -> tuple[np.ndarray, ...]:
    """States and cfrc_ext after each agent step (mj_step x frame_skip, then mj_rnePostConstraint as gymnasium does)
    of ``num_envs`` perturbed initial states under uniform random controls (fixed seed)."""
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    d = mujoco.MjData(model)
    mujoco.mj_forward(model, d)
    s0 = np.zeros(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, d, s0, spec)
    rng = np.random.default_rng(7)
    rows = np.tile(s0, (num_envs, 1))
    rows[:, 1 : 1 + model.nq] += rng.uniform(-0.1, 0.1, (num_envs, model.nq))  # after the time entry: qpos
    lo, hi = model.actuator_ctrlrange.T
    states, forces = [], []
    for _ in range(num_steps):
        for i in range(num_envs):
            mujoco.mj_setState(model, d, rows[i], spec)
            d.ctrl[:] = rng.uniform(lo, hi)
            mujoco.mj_step(model, d, frame_skip)
            mujoco.mj_rnePostConstraint(model, d)
            mujoco.mj_getState(model, d, rows[i], spec)
            states.append(rows[i].copy())
            forces.append(d.cfrc_ext.copy())
    return np.array(states), np.array(forces)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_skipping_discovery_gives_bit_identical_physics(name):
    task = TASKS[name]
    fast = build_model(task, resolve_options(task, {}, {}))
    default = build_model(task, resolve_options(task, {}, {}))
    default.opt.disableflags &= ~ISLAND  # MuJoCo's default: discovery on
    a = _trajectory(fast, task.frame_skip, num_envs=8, num_steps=60)
    b = _trajectory(default, task.frame_skip, num_envs=8, num_steps=60)
    assert np.abs(b[1]).max() > 0  # contacts happened, so the constraint solver ran
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
