"""The planar two-link arm (no contacts, +-1 torque motors) that the adapter, per-env reset and client tests
register as a custom robot, with its task functions written against the array namespace ``xp``."""

ARM_XML = """
<mujoco model="arm">
  <option timestep="0.01"/>
  <worldbody>
    <body name="upper">
      <joint name="shoulder" type="hinge" axis="0 0 1" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" mass="1" contype="0" conaffinity="0"/>
      <body name="fore" pos="0.5 0 0">
        <joint name="elbow" type="hinge" axis="0 0 1" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" mass="1" contype="0" conaffinity="0"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" ctrlrange="-1 1" ctrllimited="true"/>
    <motor joint="elbow" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


def arm_obs(xp, p):
    return xp.concatenate([p.qpos, p.qvel], axis=-1)


def arm_reward(xp, p, a):
    return -xp.abs(p.qpos[..., 0] - 0.5) - 0.01 * xp.sum(a * a, axis=-1)
