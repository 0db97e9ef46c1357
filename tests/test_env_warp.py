"""Tests of the ``warp`` backend (envs/warp_env.py, MuJoCo Warp on Warp's CPU device): zero-copy torch views,
agreement with the ``mujoco`` backend (MuJoCo C, float64) from the same state and actions, the episode convention
(auto-reset, terminated vs truncated, final_obs, seeded determinism, per-world reset), buffer overflow errors, bad
input, and the ``auto`` backend choice.

Building a Warp env compiles its kernels (~5-30 s per model on 2 cores the first time) into the kernel cache under
.cache/warp, which later runs (and CI, which keeps that folder) load in a second or two: with a warm cache the
agreement tests take 1-6 s each. More envs of an already built model in one process reuse the loaded kernels.
"""

from __future__ import annotations

import os
import sys

import mujoco
import numpy as np
import pytest
import torch
import warp as wp
from sample_fast.envs import TASKS, EnvError, make, resolve_backend, warp_env
from sample_fast.envs.custom import register_robot

#: every test here builds or loads MuJoCo Warp's kernels: one worker runs them all (tests/conftest.py), so a fresh
#: clone compiles the kernels once, not once per worker at the same time
pytestmark = pytest.mark.xdist_group("warp-kernels")
CACHE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, ".cache", "warp"))
NUM_ENVS = 3
MAX_STEPS = 25


def make_warp(name: str, num_envs: int = NUM_ENVS, **options):
    return make(name, num_envs, backend="warp", device="cpu", kernel_cache_dir=CACHE_DIR, **options)


def random_actions(num_steps: int, num_envs: int, nu: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(num_steps, num_envs, nu, generator=gen) * 2 - 1


@pytest.fixture(scope="module")
def hopper():
    env = make_warp("hopper", max_episode_steps=MAX_STEPS, seed=1)
    yield env
    env.close()


def compare_with_mujoco_backend(env, actions, seed, obs_atol, obs_rtol, rew_atol, newton=False):
    """Step the ``mujoco`` backend from the warp env's reset state with the same actions; compare every step.
    Returns the per-step max |obs difference|."""
    user = {k: v for k, v in env.options.items() if k not in warp_env.WARP_OPTIONS}
    diffs, rew_diffs = [], []
    with make(env.name, env.num_envs, backend="mujoco", seed=0, num_threads=1, **user) as ref:
        if newton:  # humanoid.xml's PGS: the warp backend runs Newton (env.deviations); so does the reference
            ref.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        ref.reset(seed=0)
        obs0, _ = env.reset(seed=seed)
        qpos, qvel = (x.double().numpy() for x in env.physics_state())
        ref_obs0 = torch.stack([ref.set_state(i, qpos[i], qvel[i]) for i in range(env.num_envs)])
        np.testing.assert_allclose(obs0.numpy(), ref_obs0.numpy(), atol=1e-5, rtol=1e-5)  # reset obs: same state
        for t, a in enumerate(actions):
            r, r_ref = env.step(a), ref.step(a)
            diffs.append(float((r.obs - r_ref.obs).abs().max()))
            rew_diffs.append(float((r.reward - r_ref.reward).abs().max()))
            np.testing.assert_allclose(
                r.obs.numpy(), r_ref.obs.numpy(), atol=obs_atol, rtol=obs_rtol, err_msg=f"step {t}"
            )
            np.testing.assert_allclose(
                r.reward.numpy(), r_ref.reward.numpy(), atol=rew_atol, rtol=0, err_msg=f"step {t}"
            )
            assert torch.equal(r.terminated, r_ref.terminated) and torch.equal(r.truncated, r_ref.truncated)
            assert not (r.terminated | r.truncated).any(), "the window must stay inside one episode"
    print(env.name, "max |obs diff| per step", np.array(diffs), "max |reward diff|", max(rew_diffs))
    return diffs


# ----- zero copy, specs ----------------------------------------------------------------------------------------
def test_torch_views_share_storage_with_warp_arrays(hopper):
    env = hopper
    d = env.mjw_data
    for name in ("qpos", "qvel", "ctrl"):
        arr = getattr(d, name)
        view = wp.to_torch(arr)
        assert view.data_ptr() == arr.ptr and view.shape == arr.shape
    assert env._qpos.data_ptr() == d.qpos.ptr and env._views["qpos"].data_ptr() == d.qpos.ptr
    env.reset(seed=0)
    before = d.qvel.numpy().copy()
    env._qvel[1, 2] = 12.5  # a write through the torch view is the Warp array's value
    assert d.qvel.numpy()[1, 2] == np.float32(12.5)
    d.qvel.fill_(0.25)  # and a Warp write is seen by torch
    assert bool((env._qvel == 0.25).all())
    wp.copy(d.qvel, wp.array(before, dtype=wp.float32, device="cpu"))


def test_specs_and_sizes(hopper):
    env = hopper
    assert env.backend == "warp" and env.compile_s > 0 and env.kernel_cache_dir.startswith(CACHE_DIR)
    assert os.listdir(env.kernel_cache_dir)  # the compiled kernels landed in the configured cache
    assert env.observation_spec.shape == (11,) and env.action_spec.shape == (3,)
    assert env.frame_skip == 4 and env.dt == pytest.approx(0.008)
    # buffers: headroom over what the probe saw, never below MJWarp's own guess
    assert env.nconmax >= warp_env.SIZE_HEADROOM * env.probe_ncon and env.probe_ncon >= 1
    assert env.njmax >= warp_env.SIZE_HEADROOM * env.probe_nefc and env.probe_nefc >= 1
    assert env.mjw_data.naconmax == env.nconmax * NUM_ENVS and env.mjw_data.njmax == env.njmax
    assert env.versions == warp_env.PINNED_VERSIONS


# ----- agreement with the mujoco backend ------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_hopper_agrees_with_mujoco_backend():
    # Hopper (RK4, planar, foot contacts): float32 MJWarp vs float64 MuJoCo C, the same Newton solver. Measured
    # over 24 steps: max |obs diff| 1.2e-7 at step 1, <= 1.6e-5 by step 24 (obs up to ~10: clipped qvel); reward
    # diff <= 1.6e-6. Bounds ~10x that: float32 roundoff through 96 physics steps; a semantic error (frame_skip, dt, obs
    # slice, reward term) moves values by >= 1e-2 from the first steps.
    env = make_warp("hopper", terminate_when_unhealthy=False, max_episode_steps=100)
    try:
        diffs = compare_with_mujoco_backend(env, random_actions(24, NUM_ENVS, 3, seed=5), 21, 2e-4, 1e-5, 2e-5)
        assert diffs[0] < 1e-5
    finally:
        env.close()


@pytest.mark.timeout(600)
def test_ant_elliptic_agrees_with_mujoco_backend():
    # Ant (RK4, free joint, cfrc_ext in the obs, contacts of all geoms). The elliptic cone, as for MJX: a pyramidal
    # cone's edges follow each contact's tangent frame, which MJWarp builds differently from MuJoCo C for
    # capsule-plane contacts (test_ant_default_pyramidal_cone_differs). 20 steps through the first foot contacts
    # (step 4 on). Measured: max |obs diff| 2.9e-6 at step 1, <= 1.8e-3 through step 20 (obs: qpos[2:], qvel up to
    # ~10, clipped cfrc_ext); reward diff <= 8.3e-5. Bounds ~10x.
    env = make_warp("ant", cone="elliptic", terminate_when_unhealthy=False, max_episode_steps=100, seed=2)
    try:
        compare_with_mujoco_backend(env, random_actions(20, NUM_ENVS, 8, seed=5), 21, 2e-2, 1e-3, 1e-3)
    finally:
        env.close()


@pytest.mark.timeout(600)
def test_humanoid_agrees_with_mujoco_backend():
    # Humanoid (348-dim obs with cinert, cvel, qfrc_actuator, cfrc_ext; values up to ~1e3). MJWarp has no PGS, so
    # both run Newton. Measured over 20 steps: max |obs diff| 1.1e-5 at step 1, <= 1.0e-2 (a cfrc_ext entry) through
    # step 20; reward diff <= 1.5e-5. Bounds ~5-10x.
    env = make_warp("humanoid", 2, terminate_when_unhealthy=False, max_episode_steps=100, seed=2)
    try:
        assert env.deviations and "PGS -> Newton" in env.deviations[0]
        compare_with_mujoco_backend(env, random_actions(20, 2, 17, seed=5), 21, 5e-2, 1e-3, 2e-4, newton=True)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="default Ant model (pyramidal friction cone): as MJX, MJWarp builds a capsule-plane contact's tangent frame "
    "differently from MuJoCo C, and the pyramid's edges follow those tangents, so the feet's friction forces differ "
    "from the first foot contact on. Measured (seed 21, 3 worlds): obs agree to 5e-6 for steps 1-3 (no contact), then "
    "differ by 0.69 at step 4 and O(1-5) later; reward by up to 1.6. With cone='elliptic' the same 20 steps agree "
    "to <= 1.8e-3 (test_ant_elliptic_agrees_with_mujoco_backend).",
)
def test_ant_default_pyramidal_cone_differs():
    env = make_warp("ant", terminate_when_unhealthy=False, max_episode_steps=100, seed=2)
    try:
        compare_with_mujoco_backend(env, random_actions(20, NUM_ENVS, 8, seed=5), 21, 2e-2, 1e-3, 1e-2)
    finally:
        env.close()


ARM_XML = """
<mujoco model="warp_arm">
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1" pos="0 0 -0.3"/>
    <body name="upper">
      <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" mass="1"/>
      <body name="fore" pos="0.5 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.04" mass="1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" gear="4" ctrlrange="-1 1" ctrllimited="true"/>
    <motor joint="elbow" gear="4" ctrlrange="-1 1" ctrllimited="true"/>
  </actuator>
</mujoco>
"""


class SwingTask:
    """A two-link arm under gravity that can hit the floor: reward the forearm's height."""

    fields = ("qpos", "qvel", "xpos")

    def observation(self, xp, p):
        return xp.concatenate([xp.cos(p.qpos), xp.sin(p.qpos), p.qvel, p.xpos[..., 2, :] - xp.asarray((0.5, 0.0, 0.0))],
                              axis=-1)  # fmt: skip

    def reward(self, xp, p, action):
        return p.xpos[..., 2, 2] - 0.01 * xp.sum(action * action, axis=-1)


@pytest.mark.timeout(300)
def test_custom_robot_with_domain_randomization_agrees_with_mujoco_backend():
    register_robot("warp_arm", ARM_XML, task=SwingTask(), frame_skip=2, max_episode_steps=100, check_jax=False,
                   reset_noise_scale=0.1, overwrite=True)  # fmt: skip
    try:
        model = mujoco.MjModel.from_xml_string(ARM_XML)
        mass = np.repeat(model.body_mass[None], NUM_ENVS, axis=0)
        damping = np.repeat(model.dof_damping[None], NUM_ENVS, axis=0)
        mass[2, 2] *= 3.0  # world 2: forearm 3x heavier, elbow 5x more damped
        damping[2, 1] *= 5.0
        params = {"body_mass": mass, "dof_damping": damping}
        env = make_warp("warp_arm", model_params=params)
        try:
            assert tuple(wp.to_torch(env.mjw_model.body_mass).shape) == (NUM_ENVS, model.nbody)  # batched per world
            actions = random_actions(25, NUM_ENVS, 2, seed=3)
            actions[:, 2] = actions[:, 0]  # worlds 0 and 2: same actions, different models
            user = {k: v for k, v in env.options.items() if k not in warp_env.WARP_OPTIONS}
            with make("warp_arm", NUM_ENVS, backend="mujoco", num_threads=1, model_params=params, **user) as ref:
                ref.reset(seed=0)
                env.reset(seed=4)
                qpos, qvel = (x.double().numpy() for x in env.physics_state())
                qpos[2], qvel[2] = qpos[0], qvel[0]  # world 2 starts where world 0 does
                for i in range(NUM_ENVS):
                    ref.set_state(i, qpos[i], qvel[i])
                env._qpos.copy_(torch.as_tensor(qpos)), env._qvel.copy_(torch.as_tensor(qvel))
                env._position.copy_(torch.as_tensor(qpos[:, :1]))
                out, out_ref = [], []
                for a in actions:
                    r, rr = env.step(a), ref.step(a)
                    out.append(r.obs), out_ref.append(rr.obs)
                    np.testing.assert_allclose(r.reward.numpy(), rr.reward.numpy(), atol=2e-3, rtol=0)
                obs, obs_ref = torch.stack(out), torch.stack(out_ref)
            print("arm max |obs diff|", float((obs - obs_ref).abs().max()), "contacts", env.mjw_data.nacon.numpy())
            # measured max |obs diff| 1.3e-4 (qvel up to ~10; 8 floor contacts at the end); bound ~75x
            np.testing.assert_allclose(obs.numpy(), obs_ref.numpy(), atol=1e-2, rtol=1e-2)
            assert (obs[:, 2] - obs[:, 0]).abs().max() > 0.05  # the randomized world really moved differently
        finally:
            env.close()
    finally:
        TASKS.pop("warp_arm", None)


# ----- episode convention ---------------------------------------------------------------------------------------
def test_seeded_reset_is_deterministic_and_noise_follows_the_task(hopper):
    env = hopper
    actions = random_actions(3, NUM_ENVS, 3, seed=0)
    runs = []
    for seed in (7, 7, 8):
        obs, _ = env.reset(seed=seed)
        qpos, qvel = env.physics_state()
        steps = [env.step(a).obs.clone() for a in actions]
        runs.append((obs.clone(), qpos, qvel, torch.stack(steps)))
    for a, b in zip(runs[0], runs[1], strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(runs[0][0], runs[2][0])
    # Hopper reset (gymnasium hopper_v5): qpos = qpos0 + U(-5e-3, 5e-3), qvel = U(-5e-3, 5e-3)
    _, qpos, qvel, _ = runs[0]
    qpos0 = torch.as_tensor(env.mj_model.qpos0, dtype=torch.float32)
    assert ((qpos - qpos0).abs() <= 5e-3 + 1e-6).all() and (qpos - qpos0).abs().max() > 1e-3
    assert (qvel.abs() <= 5e-3 + 1e-7).all() and qvel.abs().max() > 1e-3
    assert not torch.equal(qpos[0], qpos[1])  # worlds draw from their own streams


def test_truncation_final_obs_and_episode_stats(hopper):
    env = hopper
    env.reset(seed=5)
    actions = random_actions(MAX_STEPS + 2, NUM_ENVS, 3, seed=2) * 0.05  # small actions: hopper stays healthy
    total = torch.zeros(NUM_ENVS)
    for t, a in enumerate(actions, start=1):
        r = env.step(a)
        assert not r.terminated.any()
        if t < MAX_STEPS:
            total += r.reward
            assert not r.truncated.any() and torch.equal(r.info["final_obs"], r.obs)
            assert (r.info["episode_length"] == 0).all() and (r.info["episode_return"] == 0).all()
        elif t == MAX_STEPS:
            total += r.reward
            assert r.truncated.all() and (r.info["episode_length"] == MAX_STEPS).all()
            torch.testing.assert_close(r.info["episode_return"], total, atol=1e-4, rtol=1e-5)
            qpos, qvel = env.physics_state()  # obs is the next episode's first observation
            assert ((qpos - torch.as_tensor(env.mj_model.qpos0, dtype=torch.float32)).abs() <= 5e-3 + 1e-6).all()
            torch.testing.assert_close(r.obs, torch.cat([qpos[:, 1:], qvel.clamp(-10, 10)], 1))
            assert not torch.allclose(r.info["final_obs"], r.obs)
        else:
            assert not r.truncated.any() and (r.info["episode_length"] == 0).all()


def test_termination_resets_only_that_world(hopper):
    env = hopper
    env.reset(seed=1)
    ever = torch.zeros(NUM_ENVS, dtype=torch.bool)
    push = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # world 1 stays still
    for _ in range(MAX_STEPS - 1):
        before = env.physics_state()[0].clone()
        r = env.step(push)
        if r.terminated.any():
            f = r.info["final_obs"][r.terminated]
            assert ((f[:, 1].abs() > 0.2) | (f[:, 0] < 0.7)).all()  # unhealthy: torso angle or height
            assert (r.obs[r.terminated][:, 1].abs() < 0.01).all()  # reset: angle back within the noise
            assert (r.info["episode_length"][r.terminated] > 0).all()
            qpos0 = torch.as_tensor(env.mj_model.qpos0, dtype=torch.float32)
            qpos = env.physics_state()[0]
            assert ((qpos[r.terminated] - qpos0).abs() <= 5e-3 + 1e-6).all()
            assert ((qpos[~r.terminated] - before[~r.terminated]).abs().max() > 0) or not (~r.terminated).any()
        ever |= r.terminated
    assert ever[0] and ever[2] and not ever[1] and not r.info["physics_reset"].any()


def test_non_finite_physics_resets_world_and_reports_terminated(hopper):
    env = hopper
    env.reset(seed=3)
    for a in random_actions(2, NUM_ENVS, 3, seed=3) * 0.05:
        env.step(a)
    env._poison_physics(1)
    r = env.step(torch.zeros(NUM_ENVS, 3))
    assert r.info["physics_reset"].tolist() == [False, True, False]
    assert r.terminated.tolist() == [False, True, False] and not r.truncated.any()
    assert torch.equal(r.info["final_obs"][1], torch.zeros(11))
    assert torch.isfinite(r.obs).all() and r.reward[1] == 0
    assert r.info["episode_length"].tolist() == [0, 3, 0]
    qpos, qvel = env.physics_state()
    assert torch.isfinite(qpos).all() and torch.isfinite(qvel).all()
    r = env.step(torch.zeros(NUM_ENVS, 3))
    assert not r.info["physics_reset"].any() and not r.terminated.any()


def test_reset_envs_resets_only_the_masked_worlds(hopper):
    env = hopper
    obs0, _ = env.reset(seed=9)
    for a in random_actions(3, NUM_ENVS, 3, seed=9) * 0.2:
        r = env.step(a)
    qpos_before = env.physics_state()[0]
    obs, info = env._reset_envs(torch.tensor([False, True, False]))
    qpos = env.physics_state()[0]
    assert isinstance(info, dict) and obs.shape == (NUM_ENVS, 11)
    assert torch.equal(obs[[0, 2]], r.obs[[0, 2]]) and torch.equal(qpos[[0, 2]], qpos_before[[0, 2]])  # untouched
    qpos0 = torch.as_tensor(env.mj_model.qpos0, dtype=torch.float32)
    assert ((qpos[1] - qpos0).abs() <= 5e-3 + 1e-6).all()  # world 1 is a fresh episode
    assert not torch.equal(obs[1], obs0[1])  # from its stream's next draw, not a replay of the seeded reset
    r = env.step(torch.zeros(NUM_ENVS, 3))
    assert not r.truncated.any()
    for _ in range(MAX_STEPS - 4):  # 3 + 1 + 21 = MAX_STEPS steps for worlds 0 and 2
        r = env.step(torch.zeros(NUM_ENVS, 3))
    assert r.truncated.tolist() == [True, False, True]  # world 1's episode counter restarted at its reset
    with pytest.raises(EnvError, match="bool tensor of shape"):
        env._reset_envs(torch.ones(NUM_ENVS))


@pytest.mark.timeout(300)
def test_cuda_style_reset_on_every_step_equals_reset_when_done(monkeypatch):
    """On CUDA the step always runs the reset (reset_data, noise, kinematics on EVERY world) and selects it per row; on
    the CPU only when some world is done. Run the CUDA variant on the CPU through partial resets (world 1's physics
    poisoned at step 4; time limits) and steps with no reset: every output and the physics state must be the same.
    Ant: its reward reads xpos, which the reset's kinematics rewrites in the worlds that do not reset."""
    env = make_warp("ant", cone="elliptic", terminate_when_unhealthy=False, max_episode_steps=MAX_STEPS, seed=1)
    actions = random_actions(MAX_STEPS + 4, NUM_ENVS, 8, seed=7)
    runs = []
    for every_step in (False, True):
        monkeypatch.setattr(warp_env, "resets_every_step", lambda device, v=every_step: v)
        obs, _ = env.reset(seed=13)
        outs = [obs.clone()]
        for t, a in enumerate(actions):
            if t == 3:
                env._poison_physics(1)
            r = env.step(a)
            outs += [r.obs, r.reward, r.terminated, r.truncated, *(r.info[k] for k in sorted(r.info))]
        runs.append((outs, env.physics_state()))
    env.close()
    (outs_a, state_a), (outs_b, state_b) = runs
    terminated, truncated = torch.stack(outs_a[3::8]), torch.stack(outs_a[4::8])
    assert terminated[3].tolist() == [False, True, False] and terminated.sum() == 1  # a partial reset
    assert (torch.stack(outs_a[2::8]).abs() > 0.1).any()  # rewards carry the xpos velocity term
    assert truncated[MAX_STEPS - 1].tolist() == [True, False, True] and truncated.sum() == NUM_ENVS
    for i, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
        torch.testing.assert_close(y, x, rtol=0, atol=0, msg=f"output {i}")
    for x, y in zip(state_a, state_b, strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=0)


# ----- overflow ---------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("option", ["nconmax", "njmax"])
def test_buffer_overflow_raises_naming_the_option(option):
    env = make_warp("hopper", **{option: 1})
    try:
        env.reset(seed=0)
        with pytest.raises(EnvError, match=rf"Raise the option {option} \(make\(\.\.\., {option}=2\)"):
            for _ in range(40):  # the foot lands within a few steps: 2 contacts (and their rows) for 1 slot
                env.step(torch.zeros(NUM_ENVS, 3))
        with pytest.raises(EnvError, match="call reset"):  # a step after an overflow is refused until a reset
            env.step(torch.zeros(NUM_ENVS, 3))
    finally:
        env.close()


# ----- bad input, backend choice, cache -----------------------------------------------------------------------------
def test_missing_warp_gives_the_pinned_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # makes `import mujoco_warp` raise ImportError
    monkeypatch.delitem(sys.modules, "sample_fast.envs.warp_env", raising=False)
    with pytest.raises(EnvError, match=r"install with: pip install mujoco-warp==4\.0\.0 warp-lang==1\.19\.0"):
        make("hopper", 2, backend="warp", device="cpu")


def test_missing_cuda_device_lists_warp_devices():
    names = [str(d) for d in wp.get_devices()]
    with pytest.raises(EnvError, match=r"Warp has no device 'cuda:7'; Warp sees \['cpu'") as info:
        warp_env.warp_device_for(torch.device("cuda:7"))
    assert all(n in str(info.value) for n in names)
    with pytest.raises(EnvError, match="not mps"):
        warp_env.warp_device_for(torch.device("mps"))


def test_unsupported_mjcf_feature_is_named():
    xml = ARM_XML.replace('<option timestep="0.01"/>', '<option timestep="0.01"><flag override="enable"/></option>')
    register_robot("warp_bad", xml, task=SwingTask(), check_jax=False, overwrite=True)
    try:
        with pytest.raises(EnvError, match=r"MuJoCo feature MuJoCo Warp 4\.0\.0 does not implement: mjENBL_OVERRIDE"):
            make_warp("warp_bad")
    finally:
        TASKS.pop("warp_bad", None)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"no_such_option": 1}, "unknown option"),
        ({"nconmax": 0}, "nconmax=0 must be an int >= 1"),
        ({"njmax": "big"}, "njmax='big' must be an int >= 1"),
        ({"solver": "pgs"}, "solver"),
        ({"cuda_graph": "yes"}, "cuda_graph"),
        ({"xla_opt_level": 0}, "option of backend 'mjx'"),
    ],
)
def test_bad_options_raise_before_building(kwargs, match):
    with pytest.raises(EnvError, match=match):
        make("hopper", 2, backend="warp", device="cpu", **kwargs)


def test_auto_backend_picks_warp_on_cuda_only(monkeypatch):
    from sample_fast import envs

    assert resolve_backend("ant", "auto", torch.device("cpu")) == "mujoco"
    assert resolve_backend("ant", "auto", torch.device("cuda")) == "warp"  # warp imports here (a pinned dependency)
    monkeypatch.setattr(envs, "_WARP_IMPORTS", False)  # as on a machine where it does not import
    assert resolve_backend("ant", "auto", torch.device("cuda")) == "mjx"
    assert resolve_backend("ant", "warp", torch.device("cpu")) == "warp"


# ----- the trainer ---------------------------------------------------------------------------------------------------
def test_trainer_config_resolves_warp_like_mjx():
    from hydra import compose, initialize_config_module

    from sample_fast.config import resolve
    from sample_fast.wiring import on_cpu_simulator

    with initialize_config_module("sample_fast.configs", version_base="1.3"):
        cfg = compose("train", overrides=["env=hopper", "env.backend=warp", "+env.options.nconmax=64"])
    cpu = resolve(cfg, num_cores=2, cuda=False)  # the simulator on the CPU: async, as mjx there
    assert (cpu.env.backend, cpu.env.device, cpu.run.mode) == ("warp", "cpu", "async")
    gpu = resolve(cfg, num_cores=8, cuda=True)  # on the GPU: serial, sim, inference and learning on one device
    assert (gpu.env.backend, gpu.env.device, gpu.run.mode, gpu.env.num_envs) == ("warp", "cuda", "serial", 4096)
    probe = on_cpu_simulator(cpu.env)  # the spec probe runs MuJoCo C without the warp-only options
    assert probe.backend == "mujoco" and "nconmax" not in probe.options


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trainer_runs_with_the_warp_backend(tmp_path):
    import subprocess

    from sample_fast.logger import read_csv

    env = {**os.environ, "WARP_CACHE_PATH": CACHE_DIR}
    # Two updates, one per split's slot of 16 steps x 4 envs: MJWarp on the CPU is launch-bound (~0.15 s per Hopper
    # physics step on a slow 2-core host, ~370 kernel launches: ~90 per forward pass, 4 forwards per RK4 step), so
    # the time follows the env steps (256 env steps and four updates took 39-52 s in the suite, 128 take ~22 s alone).
    proc = subprocess.run(
        [sys.executable, "-m", "sample_fast.train", "env=hopper", "env.backend=warp", "env.num_envs=8",
         "run.total_env_steps=128", "sampler.rollout_len=16", "run.mode=serial", f"run.dir={tmp_path}",
         "logging.progress=plain"],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_csv(str(tmp_path / "progress.csv"))
    # It trained through the last step. How many rows the 5 s log interval gives depends on the host's speed (one on
    # a slow host), so the learner's update count is checked, not the number of rows.
    assert rows[-1]["env_steps"] >= 128 and rows[-1]["num_updates"] >= 2, rows
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(tmp_path / "config.yaml")
    assert (cfg.env.backend, cfg.env.device, cfg.run.mode) == ("warp", "cpu", "serial")
