"""Tests for the ``mujoco`` backend (envs/mujoco_env.py).

Independent expectations: gymnasium's own v5 envs stepped from the same state (observations, rewards and
terminations must agree to float32 rounding), reset states recomputed by hand from the documented seeding, a second
env without time limit as the non-resetting reference, and thread counts from ``threading.enumerate``.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch
from sample_fast.envs import EnvError, make
from sample_fast.envs.mujoco_env import MujocoEnv
from sample_fast.envs.tasks import ANT_V4_OPTIONS, TASKS

TASK_NAMES = sorted(TASKS)


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    """MuJoCo appends its warnings (humanoid.xml's deprecated settotalmass, blown-up states) to ./MUJOCO_LOG.TXT."""
    monkeypatch.chdir(tmp_path)


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mujoco-env-") and t.is_alive()]


def _actions(env: MujocoEnv, rng: np.random.Generator) -> torch.Tensor:
    lo, hi = env.action_spec.low.numpy(), env.action_spec.high.numpy()
    return torch.from_numpy(rng.uniform(lo, hi, (env.num_envs, *env.action_spec.shape)).astype(np.float32))


def _compare_with_gymnasium(task: str, gym_id: str, options: dict, num_steps: int):
    """Step gymnasium's env and env 1 of ours from the same states with the same actions; returns #terminations."""
    genv = gym.make(gym_id, **({} if gym_id.endswith("v4") else options))
    env = make(task, 2, backend="mujoco", seed=3, num_threads=2, **options)
    rng = np.random.default_rng(0)
    num_terminated = 0
    try:
        gobs, _ = genv.reset(seed=1)
        env.reset()
        data = genv.unwrapped.data
        # gymnasium's reset is mj_resetData + set_state + mj_forward; set_state does the same on ours.
        obs1 = env.set_state(1, data.qpos.copy(), data.qvel.copy())
        np.testing.assert_array_equal(obs1.numpy(), gobs.astype(np.float32))
        for t in range(num_steps):
            actions = _actions(env, rng)
            gobs, greward, gterm, gtrunc, _ = genv.step(actions[1].numpy())
            obs, reward, term, trunc, info = env.step(actions)
            assert not gtrunc and not bool(trunc[1])
            np.testing.assert_allclose(info["final_obs"][1].numpy(), gobs.astype(np.float32), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(float(reward[1]), greward, rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
            assert bool(term[1]) == gterm, f"step {t}"
            assert not bool(info["physics_reset"].any())
            if gterm:  # both reset; put ours in gymnasium's new initial state
                num_terminated += 1
                gobs, _ = genv.reset()
                env.set_state(1, data.qpos.copy(), data.qvel.copy())
    finally:
        genv.close()
        env.close()
    return num_terminated


@pytest.mark.timeout(60)
@pytest.mark.parametrize("task", TASK_NAMES)
def test_matches_gymnasium_v5(task):
    terminations = _compare_with_gymnasium(task, TASKS[task].gymnasium_id, {}, num_steps=150)
    if task != "halfcheetah":  # random actions topple the others: terminal steps and the resets after them are covered
        assert terminations >= 1


@pytest.mark.timeout(60)
def test_ant_v4_options_match_gymnasium_ant_v4():
    # Ant-v4 pays healthy_reward on the terminal step too; ANT_V4_OPTIONS reproduces that (healthy_reward_always).
    assert _compare_with_gymnasium("ant", "Ant-v4", dict(ANT_V4_OPTIONS), num_steps=40) >= 1  # terminal step covered


@pytest.mark.timeout(60)
def test_ant_without_contact_forces_matches_gymnasium_v5():
    options = {"include_cfrc_ext_in_observation": False, "contact_cost_weight": 0.0}
    _compare_with_gymnasium("ant", "Ant-v5", options, num_steps=30)


@pytest.mark.timeout(60)
def test_specs_shapes_dtypes():
    expected_obs = {"ant": 105, "halfcheetah": 17, "hopper": 11, "walker2d": 17, "humanoid": 348}
    expected_act = {"ant": 8, "halfcheetah": 6, "hopper": 3, "walker2d": 6, "humanoid": 17}
    for task in TASK_NAMES:
        with make(task, 3, backend="mujoco", num_threads=2) as env:
            genv = gym.make(TASKS[task].gymnasium_id)
            assert env.observation_spec.shape == (expected_obs[task],) == genv.observation_space.shape
            assert env.action_spec.shape == (expected_act[task],) == genv.action_space.shape
            np.testing.assert_array_equal(env.action_spec.low.numpy(), genv.action_space.low)
            np.testing.assert_array_equal(env.action_spec.high.numpy(), genv.action_space.high)
            genv.close()
            assert env.frame_skip == TASKS[task].frame_skip
            assert env.dt == pytest.approx(env.model.opt.timestep * env.frame_skip)
            obs, info = env.reset()
            assert obs.shape == (3, expected_obs[task]) and obs.dtype == torch.float32 and obs.device.type == "cpu"
            r = env.step(torch.zeros(3, expected_act[task]))
            assert r.obs.shape == (3, expected_obs[task]) and r.obs.dtype == torch.float32
            assert r.reward.shape == (3,) and r.reward.dtype == torch.float32
            assert r.terminated.dtype == torch.bool and r.truncated.dtype == torch.bool
            assert r.info["final_obs"].shape == r.obs.shape
            assert r.info["physics_reset"].dtype == torch.bool
            assert r.info["episode_length"].dtype == torch.int64


@pytest.mark.timeout(60)
def test_seeded_determinism_and_thread_count_independence():
    def rollout(seed, num_threads, num_steps=12, send_recv=False):
        with make("hopper", 5, backend="mujoco", seed=seed, num_threads=num_threads, max_episode_steps=7) as env:
            rng = np.random.default_rng(5)
            out = [env.reset()[0]]
            for _ in range(num_steps):
                if send_recv:  # all slices on worker threads
                    env.send(_actions(env, rng))
                    r = env.recv()
                else:  # the caller's thread steps the last slice
                    r = env.step(_actions(env, rng))
                out += [r.obs, r.reward, r.terminated, r.truncated, r.info["final_obs"]]
            out.append(env.reset(seed=seed)[0])  # reseeding restarts the reset noise
            return out

    a = rollout(0, 1)
    assert torch.equal(a[0], a[-1])
    for b in (rollout(0, 1), rollout(0, 2), rollout(0, 3), rollout(0, 2, send_recv=True)):  # 5 envs over 3: uneven
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = rollout(1, 2)
    assert not torch.equal(a[0], c[0])


@pytest.mark.timeout(60)
def test_returned_tensors_are_not_overwritten():
    with make("halfcheetah", 2, backend="mujoco", num_threads=1) as env:
        obs0, _ = env.reset()
        kept = obs0.clone()
        r1 = env.step(torch.ones(2, 6))
        kept1 = [r1.obs.clone(), r1.reward.clone(), r1.info["final_obs"].clone()]
        env.step(-torch.ones(2, 6))
        assert torch.equal(obs0, kept)
        assert all(torch.equal(x, y) for x, y in zip(kept1, [r1.obs, r1.reward, r1.info["final_obs"]], strict=True))


def _expected_halfcheetah_reset_obs(env: MujocoEnv, seed: int, env_idx: int, reset_number: int) -> np.ndarray:
    """Recompute by hand the documented reset: per-env PCG64 from SeedSequence(seed).spawn(N), qpos uniform and
    qvel normal noise (HalfCheetah-v5), observation = qpos[1:] ++ qvel."""
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(env.num_envs)[env_idx])
    scale, m = 0.1, env.model
    for _ in range(reset_number + 1):
        qpos = m.qpos0 + rng.uniform(-scale, scale, m.nq)
        qvel = scale * rng.standard_normal(m.nv)
    return np.concatenate([qpos[1:], qvel]).astype(np.float32)


@pytest.mark.timeout(60)
def test_truncation_autoreset_and_episode_stats():
    n, seed = 3, 7
    rng = np.random.default_rng(1)
    actions = [torch.from_numpy(rng.uniform(-1, 1, (n, 6)).astype(np.float32)) for _ in range(6)]
    with (
        make("halfcheetah", n, backend="mujoco", seed=seed, max_episode_steps=5) as env,
        make("halfcheetah", n, backend="mujoco", seed=seed, max_episode_steps=None) as ref,
    ):
        obs, _ = env.reset()
        ref_obs, _ = ref.reset()
        for i in range(n):
            np.testing.assert_array_equal(obs[i].numpy(), _expected_halfcheetah_reset_obs(env, seed, i, 0))
        rewards = []
        for t in range(5):
            r = env.step(actions[t])
            rr = ref.step(actions[t])
            rewards.append(r.reward)
            assert not r.terminated.any() and not rr.terminated.any() and not rr.truncated.any()
            # reward from the reported velocity: forward - 0.1 * |a|^2 (HalfCheetah-v5)
            expected = r.info["x_velocity"].double() - 0.1 * (actions[t].double() ** 2).sum(1)
            torch.testing.assert_close(r.reward.double(), expected, rtol=1e-5, atol=1e-5)
            if t < 4:
                assert not r.truncated.any()
                assert torch.equal(r.obs, rr.obs) and torch.equal(r.info["final_obs"], r.obs)
                assert (r.info["episode_length"] == 0).all() and (r.info["episode_return"] == 0).all()
        assert r.truncated.all() and not r.terminated.any()
        assert torch.equal(r.info["final_obs"], rr.obs)  # the true last observation of the episode
        for i in range(n):  # and obs is already the next episode's first observation
            np.testing.assert_array_equal(r.obs[i].numpy(), _expected_halfcheetah_reset_obs(env, seed, i, 1))
        assert (r.info["episode_length"] == 5).all()
        torch.testing.assert_close(r.info["episode_return"], sum(rewards[1:], rewards[0]))
        r = env.step(actions[5])  # counters restarted
        assert not r.truncated.any() and (r.info["episode_length"] == 0).all()


@pytest.mark.timeout(60)
def test_termination_is_not_truncation():
    # hopper starts at z = 1.25: with healthy_z_range (10, inf) the first step is unhealthy.
    with make("hopper", 2, backend="mujoco", healthy_z_range=(10.0, float("inf"))) as env:
        env.reset()
        a = torch.full((2, 3), 0.5)
        r = env.step(a)
        assert r.terminated.all() and not r.truncated.any()
        assert (r.info["episode_length"] == 1).all()
        # no healthy reward on the unhealthy step: reward = velocity - 1e-3 * |a|^2
        expected = r.info["x_velocity"].double() - 1e-3 * 0.75
        torch.testing.assert_close(r.reward.double(), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.info["episode_return"], r.reward)
        assert not torch.equal(r.obs, r.info["final_obs"])
    with make(
        "hopper", 2, backend="mujoco", healthy_z_range=(10.0, float("inf")), terminate_when_unhealthy=False
    ) as env:
        env.reset()
        r = env.step(torch.zeros(2, 3))
        assert not r.terminated.any() and not r.truncated.any()


@pytest.mark.timeout(60)
def test_non_finite_physics_resets_only_that_env():
    rng = np.random.default_rng(2)
    with (
        make("ant", 3, backend="mujoco", seed=4, num_threads=2) as env,
        make("ant", 3, backend="mujoco", seed=4, num_threads=2) as ref,
    ):
        env.reset()
        ref.reset()
        a = _actions(env, rng)
        env.step(a)
        ref.step(a)
        env.state_view("qpos")[1, 3] = np.nan  # a NaN quaternion
        env.state_view("qvel")[2, :] = 1e12  # beyond MuJoCo's mjMAXVAL
        a = _actions(env, rng)
        r = env.step(a)
        rr = ref.step(a)
        assert r.info["physics_reset"].tolist() == [False, True, True]
        assert r.terminated.tolist() == [False, True, True] and not r.truncated.any()
        assert torch.isfinite(r.obs).all() and torch.isfinite(r.reward).all()
        assert (r.info["final_obs"][1:] == 0).all() and (r.reward[1:] == 0).all()
        assert (r.info["episode_length"][1:] == 2).all()
        assert torch.equal(r.obs[0], rr.obs[0]) and torch.equal(r.reward[0], rr.reward[0])
        # the reset envs start a normal episode: fresh state, finite, and they keep stepping like everyone else
        r = env.step(_actions(env, rng))
        assert not r.info["physics_reset"].any() and torch.isfinite(r.obs).all()


@pytest.mark.timeout(60)
def test_bad_input_errors():
    with make("ant", 2, backend="mujoco", num_threads=1) as env:
        env.reset()
        with pytest.raises(EnvError, match=r"shape \(2, 8\)"):
            env.step(torch.zeros(2, 7))
        with pytest.raises(EnvError, match="torch.float32"):
            env.step(torch.zeros(2, 8, dtype=torch.float64))
        with pytest.raises(EnvError, match="device cpu"):
            env.step(torch.zeros(2, 8, device="meta"))
        with pytest.raises(EnvError, match="NaN"):
            env.step(torch.tensor([[0.0] * 8, [float("nan")] + [0.0] * 7]))
        with pytest.raises(EnvError, match="torch.Tensor"):
            env.step(np.zeros((2, 8), dtype=np.float32))
        r = env.step(torch.full((2, 8), 5.0))  # out of range: clipped to [-1, 1], so the cost is 0.5 * 8
        assert (env.state_view("ctrl") == 1.0).all()  # what the actuators received
        torch.testing.assert_close(r.info["x_velocity"] + 1.0 - 4.0, r.reward, atol=0.05, rtol=0)
    with pytest.raises(EnvError, match="unknown option.*valid options:.*ctrl_cost_weight.*num_threads"):
        make("ant", 2, backend="mujoco", ctrl_cost_wieght=0.1)
    with pytest.raises(EnvError, match="known envs: ant, halfcheetah, hopper, humanoid, .*walker2d"):
        make("antt", 2, backend="mujoco")  # (other tests may register custom robots in between)
    with pytest.raises(EnvError, match="known tasks: ant, halfcheetah"):
        MujocoEnv("antt", 2)
    with pytest.raises(EnvError, match="num_threads must be a positive int"):
        make("ant", 2, backend="mujoco", num_threads=0)
    with make("ant", 2, backend="mujoco") as env, pytest.raises(EnvError, match="reset"):
        env.step(torch.zeros(2, 8))
    with make("ant", 2, backend="mujoco") as env, pytest.raises(EnvError, match="qpos, qvel"):
        env.state_view("qpos_typo")


@pytest.mark.timeout(60)
def test_step_timeout_raises_and_env_still_closes():
    before = len(_worker_threads())
    env = make("humanoid", 64, backend="mujoco", num_threads=2, step_timeout_s=1e-9)
    try:
        env.reset()
        env.send(torch.zeros(64, 17))  # ~13 ms of physics on the workers; recv() gives them 1 ns
        with pytest.raises(EnvError, match="step_timeout_s"):
            env.recv()
        with pytest.raises(EnvError, match="step_timeout_s"):  # the env stays unusable, with the same explanation
            env.step(torch.zeros(64, 17))
        with pytest.raises(EnvError, match="step_timeout_s"):
            env.reset()
    finally:
        env.close()
    assert len(_worker_threads()) == before


@pytest.mark.timeout(60)
def test_no_threads_left_after_close():
    before = len(_worker_threads())
    env = make("hopper", 4, backend="mujoco", num_threads=2)
    assert len(_worker_threads()) == before + 2
    env.reset()
    env.step(torch.zeros(4, 3))
    env.close()
    assert len(_worker_threads()) == before
    with make("hopper", 4, backend="mujoco", num_threads=3) as env:
        assert len(_worker_threads()) == before + 3
        env.reset()
        env.send(torch.zeros(4, 3))  # closing with a step in flight
    assert len(_worker_threads()) == before
    with pytest.raises(EnvError, match="closed"):
        env.reset()
    env = make("hopper", 1, backend="mujoco", num_threads=4)  # never more threads than envs
    assert len(_worker_threads()) == before + 1
    del env  # dropped without close(): the workers hold no reference to it, so it is collected and stops them
    gc.collect()
    assert len(_worker_threads()) == before


@pytest.mark.timeout(60)
def test_send_returns_before_the_step_finishes():
    with make("humanoid", 256, backend="mujoco", num_threads=2) as env:
        env.reset()
        env.send(torch.zeros(256, 17))
        # 256 humanoid steps take ~50 ms of CPU: at least one worker is still busy right after send().
        still_running = any(not w.done.is_set() for w in env._workers)
        r = env.recv()
        assert still_running and r.obs.shape == (256, 348)


@pytest.mark.timeout(60)
def test_model_options_reach_the_model():
    with make("ant", 2, backend="mujoco", contacts="feet", solver_iterations=3, ls_iterations=2, frame_skip=2) as env:
        assert env.model.opt.iterations == 3 and env.model.opt.ls_iterations == 2
        assert env.model.npair == 4 and env.frame_skip == 2
        assert env.dt == pytest.approx(2 * env.model.opt.timestep)
        env.reset()
        r = env.step(torch.zeros(2, 8))
        assert torch.isfinite(r.obs).all()
    # gymnasium's ant.xml: pyramidal cone, RK4; the options switch both
    with make("ant", 1, backend="mujoco", cone="elliptic", integrator="euler") as env:
        assert env.model.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
        assert env.model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER
    with make("ant", 1, backend="mujoco") as env:
        assert env.model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
        assert env.model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4
    with pytest.raises(EnvError, match="cone must be one of"):
        make("ant", 1, backend="mujoco", cone="round")
    with pytest.raises(EnvError, match="integrator must be one of"):
        make("ant", 1, backend="mujoco", integrator="rk5")


@pytest.mark.gpu
@pytest.mark.timeout(60)
def test_cuda_device_outputs():
    with make("hopper", 4, backend="mujoco", device="cuda") as env:
        obs, _ = env.reset()
        r = env.step(torch.zeros(4, 3, device="cuda"))
        assert obs.device.type == "cuda" and r.obs.device.type == "cuda" and r.info["final_obs"].device.type == "cuda"
        assert r.reward.device.type == "cuda" and r.info["episode_return"].device.type == "cuda"


@pytest.mark.timeout(60)
def test_datas_snapshot_for_rendering():
    with make("hopper", 3, backend="mujoco", seed=2) as env:
        env.reset()
        r = env.step(torch.full((3, 3), 0.3))
        assert len(env.datas) == 3
        for i in range(3):
            d = env.datas[i]
            np.testing.assert_array_equal(d.qpos, env.state_view("qpos")[i])
            np.testing.assert_array_equal(d.qvel, env.state_view("qvel")[i])
            # hopper's observation is qpos[1:] ++ clip(qvel, -10, 10)
            expected = np.concatenate([d.qpos[1:], np.clip(d.qvel, -10, 10)]).astype(np.float32)
            np.testing.assert_array_equal(r.obs[i].numpy(), expected)
            assert d.xpos[1, 2] > 0  # kinematics computed (torso above the floor)
        with pytest.raises(IndexError):
            env.datas[3]


def _ant_rollout(
    num_threads: int,
    send_recv: bool,
    num_steps: int = 60,
    stall_worker_s: float = 0.0,
    caller_steps: bool = False,
    kernel: str = "compiled",
):
    """Ant, 10 envs, episodes cut at 25 steps; returns every output of every step, the reset counts and, per step,
    the envs each worker stepped (the threads', then the receiving caller's: 0 without caller_steps)."""
    with make(
        "ant",
        10,
        backend="mujoco",
        seed=11,
        num_threads=num_threads,
        max_episode_steps=25,
        caller_steps=caller_steps,
        kernel=kernel,
    ) as env:
        if stall_worker_s:  # the first worker thread starts every step late (a busy core, a slow wake-up)
            w0 = env._workers[0]
            step_slice = w0.step_slice

            def late_step_slice():
                time.sleep(stall_worker_s)
                step_slice()

            w0.step_slice = late_step_slice
        rng = np.random.default_rng(3)
        out = [env.reset()[0]]
        num_terminated = num_truncated = 0
        stepped = []
        for _ in range(num_steps):
            a = _actions(env, rng)
            if send_recv:
                env.send(a)
                r = env.recv()
            else:
                r = env.step(a)
            out += [r.obs, r.reward, r.terminated, r.truncated, *(r.info[k] for k in sorted(r.info))]
            num_terminated += int(r.terminated.sum())
            num_truncated += int((r.truncated & ~r.terminated).sum())
            stepped.append([w.num_stepped for w in env._workers] + [env._caller.num_stepped if env._caller else 0])
        out.append(env.reset()[0])  # continues every env's reset stream after the auto-resets
        return out, num_terminated, num_truncated, stepped


def _rollout(name: str, kernel: str, num_steps: int, **options):
    """Every output of a short rollout of task ``name`` (3 threads, 7 envs, episodes cut at 9 steps)."""
    rng = np.random.default_rng(5)
    with make(name, 7, backend="mujoco", seed=2, num_threads=3, max_episode_steps=9, kernel=kernel, **options) as env:
        out = [env.reset()[0]]
        for _ in range(num_steps):
            r = env.step(_actions(env, rng) * 3)  # beyond the ctrl range too: clipped, and more falls
            out += [r.obs, r.reward, r.terminated, r.truncated, *(r.info[k] for k in sorted(r.info))]
        return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(TASKS))
def test_compiled_kernel_gives_the_python_loops_bits(name):
    # envs.mujoco_kernel makes the same MuJoCo C calls as the Python loop, without the GIL in between: every
    # observation, reward, flag and info field must be identical, across auto-resets and terminations.
    num_steps = 12 if name == "humanoid" else 30
    ref = _rollout(name, "python", num_steps)
    out = _rollout(name, "compiled", num_steps)
    assert len(out) == len(ref) and all(torch.equal(x, y) for x, y in zip(ref, out, strict=True))


@pytest.mark.timeout(60)
def test_compiled_kernel_steps_each_envs_own_model():
    # Domain randomization gives every env its own MjModel; the kernel must step env i with model i (a halfcheetah
    # on ice runs differently from one on sandpaper), exactly as the Python loop does.
    friction = np.ones((7, 9, 3)) * np.array([0.4, 0.1, 0.1])
    friction[:, :, 0] = np.linspace(0.05, 2.0, 7)[:, None]
    ref = _rollout("halfcheetah", "python", 20, model_params={"geom_friction": friction})
    out = _rollout("halfcheetah", "compiled", 20, model_params={"geom_friction": friction})
    assert all(torch.equal(x, y) for x, y in zip(ref, out, strict=True))
    same = _rollout("halfcheetah", "compiled", 20)
    assert not all(torch.equal(x, y) for x, y in zip(out, same, strict=True))  # randomized physics do differ


@pytest.mark.timeout(60)
def test_ant_with_resets_is_identical_for_any_thread_count_and_schedule():
    # Each env is claimed by whichever thread is free and its next reset is prepared by whichever thread stepped it,
    # so the schedule changes from run to run; the results must not (per-env state and reset generator only).
    # The reference is the Python stepping loop on one thread; the compiled kernel (envs.mujoco_kernel) must give
    # the same bits under every schedule.
    ref, num_terminated, num_truncated, stepped = _ant_rollout(1, send_recv=False, kernel="python")
    assert num_terminated >= 1 and num_truncated >= 10  # both kinds of auto-reset happened (10 envs cut at 25)
    assert all(s == [10, 0] for s in stepped)  # step(): the caller steps inline in send(), none are left for recv()
    cases = ((1, False, 0.0, False), (2, False, 0.0, False), (2, True, 0.0, False), (3, False, 0.0, False),
             (2, False, 0.02, False), (2, True, 0.02, True), (2, True, 0.0, True))  # fmt: skip
    for kernel in ("python", "compiled"):
        for num_threads, send_recv, stall, caller_steps in cases:
            out, _, _, stepped = _ant_rollout(num_threads, send_recv, stall_worker_s=stall, caller_steps=caller_steps,
                                              kernel=kernel)  # fmt: skip
            assert len(out) == len(ref) and all(torch.equal(x, y) for x, y in zip(ref, out, strict=True))
            assert all(sum(s) == 10 for s in stepped)  # every env stepped exactly once per step
            if stall and not send_recv:  # step(): the caller did not wait for the late worker, it stepped (nearly)
                assert np.median([s[-2] for s in stepped]) >= 9  # every env inline (as workers[-1])
            if stall and send_recv:  # recv() stepped envs the late worker had not claimed, beside worker 1
                # (the compiled kernel's worker 1 often finishes all 10 before recv() claims: at least once in 60)
                assert np.median([s[0] for s in stepped]) <= 1 and sum(s[-1] for s in stepped) >= 1
            if not caller_steps:
                assert all(s[-1] == 0 for s in stepped)


@pytest.mark.timeout(60)
def test_reset_continues_each_envs_reset_stream_after_auto_resets():
    # Resets are prepared ahead (draw k+1 while episode k runs); reset() and auto-resets must use exactly the next
    # draw of each env's generator, prepared or not.
    n, seed = 3, 7

    def expect(obs, reset_number):
        for i in range(n):
            np.testing.assert_array_equal(obs[i].numpy(), _expected_halfcheetah_reset_obs(env, seed, i, reset_number))

    with make("halfcheetah", n, backend="mujoco", seed=seed, max_episode_steps=2) as env:
        expect(env.reset()[0], 0)
        env.step(torch.zeros(n, 6))  # the workers prepare draw 1
        expect(env.reset()[0], 1)  # the prepared draw
        env.step(torch.zeros(n, 6))
        r = env.step(torch.zeros(n, 6))
        assert r.truncated.all()
        expect(r.obs, 2)  # auto-reset
        expect(env.reset()[0], 3)  # nothing prepared since: drawn now
        expect(env.reset(seed=seed)[0], 0)  # reseeded


@pytest.mark.timeout(60)
def test_action_check_fast_path_keeps_the_errors():
    with make("hopper", 2, backend="mujoco", num_threads=1) as env:
        env.reset()
        with pytest.raises(EnvError, match="NaN or inf"):
            env.step(torch.tensor([[0.0, 0.0, 0.0], [0.0, float("inf"), 0.0]]))
        with pytest.raises(EnvError, match="NaN or inf"):
            env.step(torch.full((2, 3), float("-inf")))
        with pytest.raises(EnvError, match=r"shape \(2, 3\)"):
            env.step(torch.zeros(3, 2))
        # the largest float32 values sum to more than float32 can hold, but they are finite: accepted, clipped
        env.step(torch.full((2, 3), 3.4e38))
        assert (env.state_view("ctrl") == 1.0).all()
        a = torch.zeros(2, 3, requires_grad=True)  # a policy output that still tracks gradients is accepted
        env.step(a * 2)
        assert (env.state_view("ctrl") == 0.0).all()


_KERNEL_ERROR_SCRIPT = """
import numpy as np, mujoco
from sample_fast.envs.mujoco_kernel import step_kernel
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><body><freejoint/><geom size=".1"/></body></worldbody></mujoco>')
d = mujoco.MjData(m)
state, warn, none = np.zeros((1, 64)), np.zeros((1, len(d.warning)), np.int32), np.zeros(0, np.int64)
step_kernel()(np.zeros(1, np.int64), np.array([m._address]), d._address, state, 1, False, 1 << 30, none, none, none,
              d.warning.number.ctypes.data, warn)  # an invalid state signature: mju_error inside mj_setState
print("returned")
"""


@pytest.mark.timeout(60)
def test_a_mujoco_error_in_the_compiled_kernel_exits_with_its_message():
    # What envs.mujoco_kernel documents: outside the bindings' error interception, MuJoCo's default handler prints
    # the error and exits with status 1 (a sampler crash the runner handles), not an abort or a hang.
    proc = subprocess.run([sys.executable, "-c", _KERNEL_ERROR_SCRIPT], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-500:])
    assert "ERROR" in proc.stdout + proc.stderr and "invalid state signature" in proc.stdout + proc.stderr
    assert "returned" not in proc.stdout


@pytest.mark.timeout(60)
def test_worker_nice_lowers_only_the_stepping_threads_priority():
    def nice_of(tid: int) -> int:
        return os.getpriority(os.PRIO_PROCESS, tid)

    base = nice_of(threading.get_native_id())
    with make("hopper", 4, backend="mujoco", num_threads=2, worker_nice=7) as env:
        env.reset()
        env.step(torch.zeros(4, 3))
        tids = [t.native_id for t in env._threads]
        assert [nice_of(t) for t in tids] == [min(19, base + 7)] * 2
        assert nice_of(threading.get_native_id()) == base  # the caller's thread keeps its own


@pytest.mark.timeout(60)
def test_pin_workers_pins_each_stepping_thread_to_one_core_in_turn():
    cores = sorted(os.sched_getaffinity(0))
    with make("hopper", 4, backend="mujoco", num_threads=3, pin_workers=True) as env:
        env.reset()
        env.step(torch.zeros(4, 3))
        pinned = [os.sched_getaffinity(t.native_id) for t in env._threads]
        assert pinned == [{cores[k % len(cores)]} for k in range(3)]
        assert sorted(os.sched_getaffinity(0)) == cores  # the caller's thread (and so the process) is not pinned
    with make("hopper", 4, backend="mujoco", num_threads=2) as env:  # the default leaves them free
        env.reset()
        assert [sorted(os.sched_getaffinity(t.native_id)) for t in env._threads] == [cores, cores]


@pytest.mark.timeout(60)
def test_pin_workers_failure_is_reported_with_the_fix(monkeypatch):
    def forbidden(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", forbidden)  # as a cgroup that forbids the CPU would
    with make("hopper", 4, backend="mujoco", num_threads=2, pin_workers=True) as env:
        with pytest.raises(EnvError, match="could not pin mujoco-env-0 to CPU .*set pin_workers=false"):
            env.reset()
            env.step(torch.zeros(4, 3))
