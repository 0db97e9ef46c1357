"""Tests of envs/adapters.py: each adapter through its ecosystem's own checker, plus behaviour against an
independent expectation (gymnasium's own SyncVectorEnv in SAME_STEP mode; a manual loop on a twin BatchedEnv with
the same seed for TorchRL; an rl_games-style driver loop for the VecTask interface).

Gymnasium 1.4 ships no checker for vector envs (``gymnasium.utils.env_checker.check_env`` takes a single
``gymnasium.Env``), so the vector adapter is checked against ``SyncVectorEnv(autoreset_mode=SAME_STEP)`` built from
single-env views (which themselves pass ``check_env``), value for value, on a deterministic custom MuJoCo arm.
"""

from __future__ import annotations

import os
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from arm_robot import ARM_XML, arm_obs, arm_reward
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from sample_fast.envs import TASKS, BatchedEnv, EnvError, make
from sample_fast.envs.adapters import GymnasiumSingleEnv, GymnasiumVectorEnv, TorchRLEnv, VecTaskEnv
from sample_fast.envs.base import StepResult
from sample_fast.envs.custom import register_robot

# A planar two-link arm with no contacts and no reset noise: fully deterministic on the mujoco backend.


def _arm_terminated(xp, p):
    return p.qpos[..., 0] > 0.3  # the shoulder passes 0.3 rad: reached within a few steps under +1 torque


@pytest.fixture(scope="module")
def arm_name():
    register_robot(
        "adapter_arm",
        ARM_XML,
        arm_obs,
        arm_reward,
        _arm_terminated,
        max_episode_steps=7,
        check_jax=False,
        overwrite=True,
    )
    yield "adapter_arm"
    TASKS.pop("adapter_arm", None)  # tests elsewhere walk TASKS (the built-in tasks) at run time


# ----- gymnasium ----------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["continuous", "discrete"])
def test_gymnasium_single_env_passes_check_env(kind):
    env = GymnasiumSingleEnv(make("toy", 1, kind=kind, terminate_on_miss=True))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*infinity.*")  # toy observations are unbounded by design
        check_env(env, skip_render_check=True)
    assert isinstance(env.action_space, gym.spaces.Discrete if kind == "discrete" else gym.spaces.Box)


@pytest.mark.timeout(60)
def test_gymnasium_single_env_check_env_custom_arm(arm_name):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*infinity.*")
        check_env(GymnasiumSingleEnv(make(arm_name, 1, backend="mujoco")), skip_render_check=True)


@pytest.mark.timeout(60)
def test_gymnasium_vector_matches_sync_vector_env_same_step(arm_name):
    """Our VectorEnv equals gymnasium's own SyncVectorEnv(SAME_STEP) over single-env views, step for step,
    including the object-array final_obs and its masks, through terminations and time-limit truncations."""
    num_envs, num_steps = 3, 20
    ours = GymnasiumVectorEnv(make(arm_name, num_envs, backend="mujoco", num_threads=1))
    ref = SyncVectorEnv(
        [lambda: GymnasiumSingleEnv(make(arm_name, 1, backend="mujoco", num_threads=1)) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    assert ours.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.single_action_space == ref.single_action_space
    assert ours.observation_space == ref.observation_space and ours.action_space == ref.action_space
    o1, _ = ours.reset(seed=0)
    o2, _ = ref.reset(seed=0)
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(0)
    # env 0 pushes the shoulder to termination, env 1 idles into the time limit, env 2 acts randomly
    num_done = 0
    for _ in range(num_steps):
        actions = np.stack([[1.0, 0.0], [0.0, 0.0], rng.uniform(-1, 1, 2)]).astype(np.float32)
        r1, r2 = ours.step(actions), ref.step(actions)
        for a, b in zip(r1[:4], r2[:4], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        assert r1[0].dtype == r2[0].dtype == np.float32 and r1[2].dtype == r2[2].dtype == np.bool_
        assert r1[1].dtype == np.float32  # SyncVectorEnv's reward buffer is float64; our rewards are float32
        i1, i2 = r1[4], r2[4]
        assert ours.observation_space.contains(r1[0])
        done = r1[2] | r1[3]
        num_done += int(done.sum())
        if done.any():
            np.testing.assert_array_equal(i1["_final_obs"], i2["_final_obs"])
            np.testing.assert_array_equal(i1["_final_info"], i2["_final_info"])
            for i in np.flatnonzero(done):
                np.testing.assert_allclose(i1["final_obs"][i], i2["final_obs"][i], atol=1e-6)
                assert i1["final_obs"][i].dtype == np.float32
            assert all(i1["final_obs"][i] is None for i in np.flatnonzero(~done))
        else:
            assert "final_obs" not in i1 and "final_obs" not in i2
    assert num_done >= 3  # both the terminated and the truncated paths were exercised
    ours.close()
    ref.close()


@pytest.mark.timeout(60)
def test_gymnasium_vector_episode_stats_match_record_episode_statistics():
    """gymnasium's own RecordEpisodeStatistics vector wrapper sees the same returns we report in final_info."""
    env = gym.wrappers.vector.RecordEpisodeStatistics(GymnasiumVectorEnv(make("toy", 4, max_episode_steps=5)))
    env.reset(seed=3)
    seen = 0
    for _ in range(12):
        _, _, term, trunc, info = env.step(env.action_space.sample())
        if "episode" in info:
            mask = info["_episode"]
            np.testing.assert_allclose(info["episode"]["r"][mask], info["final_info"]["episode_return"][mask], 1e-5)
            np.testing.assert_array_equal(info["episode"]["l"][mask], info["final_info"]["episode_length"][mask])
            np.testing.assert_array_equal(info["episode"]["l"][mask], 5)  # toy: every episode is truncated at 5
            seen += int(mask.sum())
    assert seen == 8  # steps 5 and 10, four envs each
    env.close()


def _assert_info_equal(ours: dict, ref: dict, path: str = "info") -> None:
    """Two gymnasium vector info dicts hold the same keys, masks and (masked) values, recursively."""
    assert sorted(ours) == sorted(ref), f"{path}: {sorted(ours)} != {sorted(ref)}"
    for key in ref:
        a, b = ours[key], ref[key]
        if isinstance(b, dict):
            _assert_info_equal(a, b, f"{path}[{key!r}]")
        elif key.startswith("_"):
            np.testing.assert_array_equal(a, b, err_msg=f"{path}[{key!r}]")
        elif key == "final_obs":  # one array per env, None elsewhere
            assert a.dtype == b.dtype == object, path
            assert [x is None for x in a] == [x is None for x in b], f"{path}[{key!r}]"
            for x, y in zip(a, b, strict=True):
                if y is not None:
                    np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg=f"{path}[{key!r}]")
        elif b.dtype == object:
            # SyncVectorEnv keeps np.bool_ scalars (not np.number) in an object array, None where masked out; ours is
            # a bool array, False there. The values under the mask agree.
            mask = ref[f"_{key}"]
            assert a.dtype == np.bool_ and list(a[mask]) == list(b[mask]), f"{path}[{key!r}]"
        else:
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"{path}[{key!r}]")
            assert a.dtype == b.dtype, f"{path}[{key!r}]: {a.dtype} != {b.dtype}"


def _arm_actions(rng: np.random.Generator) -> np.ndarray:
    # env 0 pushes the shoulder to termination, env 1 idles into the time limit, env 2 acts randomly
    return np.stack([[1.0, 0.0], [0.0, 0.0], rng.uniform(-1, 1, 2)]).astype(np.float32)


def _arm_pair(arm_name: str, mode: AutoresetMode, limit: int = 7) -> tuple[GymnasiumVectorEnv, SyncVectorEnv]:
    opts = {"backend": "mujoco", "num_threads": 1, "max_episode_steps": limit}
    ours = GymnasiumVectorEnv(make(arm_name, 3, **opts), autoreset_mode=mode)
    ref = SyncVectorEnv([lambda: GymnasiumSingleEnv(make(arm_name, 1, **opts)) for _ in range(3)], autoreset_mode=mode)
    return ours, ref


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_gymnasium_vector_info_matches_sync_vector_env(arm_name, mode):
    """Both auto-reset modes equal gymnasium's own SyncVectorEnv in that mode, step for step through terminations
    and truncations: observations, rewards, flags and the whole info dict (final_obs, final_info, every mask).
    (The arm has no reset noise: NEXT_STEP's extra reset per episode draws nothing that could differ.)"""
    ours, ref = _arm_pair(arm_name, mode, limit=45)  # the pushed shoulder passes 0.3 rad at step ~36
    assert ours.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"] == mode
    o1, i1 = ours.reset(seed=0)
    o2, i2 = ref.reset(seed=0)
    np.testing.assert_array_equal(o1, o2)
    rng = np.random.default_rng(0)
    flags = np.zeros(2, dtype=int)
    for _ in range(95):
        actions = _arm_actions(rng)
        r1, r2 = ours.step(actions), ref.step(actions)
        for a, b in zip(r1[:4], r2[:4], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        assert r1[0].dtype == r2[0].dtype == np.float32 and r1[2].dtype == r2[2].dtype == np.bool_
        _assert_info_equal(r1[4], r2[4])
        flags += [int(r1[2].sum()), int(r1[3].sum())]
    assert (flags >= 2).all()  # terminations and truncations both
    ours.close()
    ref.close()


@pytest.mark.timeout(60)
def test_gymnasium_reset_mask_matches_sync_vector_env(arm_name):
    """reset(options={"reset_mask": ...}) resets only the chosen envs, in both modes, as SyncVectorEnv does."""
    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
        ours, ref = _arm_pair(arm_name, mode)
        ours.reset(seed=0)
        ref.reset(seed=0)
        rng = np.random.default_rng(1)
        for t in range(12):
            actions = _arm_actions(rng)
            r1, r2 = ours.step(actions), ref.step(actions)
            np.testing.assert_allclose(r1[0], r2[0], rtol=0, atol=1e-6)
            if t in (2, 8):
                mask = np.array([False, True, True])
                o1, _ = ours.reset(options={"reset_mask": mask})
                o2, _ = ref.reset(options={"reset_mask": mask})
                np.testing.assert_allclose(o1, o2, rtol=0, atol=1e-6)
                np.testing.assert_array_equal(o1[0], r1[0][0])  # env 0 keeps its observation
        ours.close()
        ref.close()
    env = GymnasiumVectorEnv(make("toy", 2))
    env.reset()
    with pytest.raises(EnvError, match="at least one True"):
        env.reset(options={"reset_mask": np.zeros(2, dtype=bool)})
    with pytest.raises(EnvError, match="numpy bool array of shape \\(2,\\)"):
        env.reset(options={"reset_mask": np.ones(3, dtype=bool)})
    with pytest.raises(EnvError, match="only option is 'reset_mask'"):
        env.reset(options={"difficulty": 3})


@pytest.mark.timeout(60)
def test_gymnasium_observation_wrappers_on_next_step(arm_name):
    """gymnasium's vector observation wrappers refuse SAME_STEP envs and work on NEXT_STEP ones exactly as on its own
    SyncVectorEnv: NormalizeObservation's running statistics and outputs agree step for step."""
    from gymnasium.wrappers.vector import NormalizeObservation, TransformObservation

    same, _ = _arm_pair(arm_name, AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP"):
        NormalizeObservation(same)
    ours, ref = (NormalizeObservation(e) for e in _arm_pair(arm_name, AutoresetMode.NEXT_STEP))
    ours.reset(seed=0)
    ref.reset(seed=0)
    rng = np.random.default_rng(2)
    for _ in range(15):
        actions = _arm_actions(rng)
        o1, *_ = ours.step(actions)
        o2, *_ = ref.step(actions)
        np.testing.assert_allclose(o1, o2, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ours.obs_rms.mean, ref.obs_rms.mean, rtol=0, atol=1e-6)
    doubled = TransformObservation(
        GymnasiumVectorEnv(make("toy", 2), autoreset_mode="next_step"), lambda o: 2 * o, None
    )
    obs, _ = doubled.reset(seed=0)
    np.testing.assert_array_equal(obs, 2 * GymnasiumVectorEnv(make("toy", 2)).reset(seed=0)[0])
    with pytest.raises(EnvError, match="autoreset_mode='bogus' is not supported"):
        GymnasiumVectorEnv(make("toy", 2), autoreset_mode="bogus")


@pytest.mark.timeout(60)
def test_gymnasium_numpy_to_torch_wrapper():
    """gymnasium.wrappers.vector.NumpyToTorch (which needs array-api-compat, a dependency now) wraps the adapter."""
    from gymnasium.wrappers.vector import NumpyToTorch

    env = NumpyToTorch(GymnasiumVectorEnv(make("toy", 3, max_episode_steps=4)))
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.shape == (3, 3)
    obs, reward, terminated, truncated, _ = env.step(torch.zeros(3, 2))
    assert isinstance(reward, torch.Tensor) and reward.shape == (3,) and truncated.dtype == torch.bool
    env.close()


@pytest.mark.timeout(60)
def test_gymnasium_make_vec_on_registered_ids():
    """gymnasium.make_vec / gymnasium.make build our envs from the registered sample_fast/* ids."""
    import sample_fast.envs.registration as registration
    from sample_fast.envs.mujoco_env import MujocoEnv

    ids = registration.registered_ids()
    for name in ("Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Humanoid-v5", "Toy-v0", "Pong-v5"):
        assert f"sample_fast/{name}" in gym.registry and f"sample_fast/{name}" in ids
    assert sum(k.endswith("-v5") for k in ids) > 100  # every Atari game ale-py ships, and the five MuJoCo tasks
    vec = gym.make_vec("sample_fast/Hopper-v5", num_envs=3, backend="mujoco", num_threads=1, max_episode_steps=6)
    assert isinstance(vec, GymnasiumVectorEnv) and isinstance(vec.env, MujocoEnv) and vec.num_envs == 3
    assert vec.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # gymnasium's default
    assert vec.spec.id == "sample_fast/Hopper-v5"
    twin = GymnasiumVectorEnv(make("hopper", 3, backend="mujoco", num_threads=1, max_episode_steps=6), "next_step")
    np.testing.assert_array_equal(vec.reset(seed=5)[0], twin.reset(seed=5)[0])
    actions = np.zeros((3, 3), np.float32)
    for _ in range(8):
        r1, r2 = vec.step(actions), twin.step(actions)
        for a, b in zip(r1[:4], r2[:4], strict=True):
            np.testing.assert_array_equal(a, b)
    assert not (r1[2] | r1[3]).any()  # step 8 of 6-step episodes: the restart step after the time limit
    vec.close()
    twin.close()
    same = gym.make_vec("sample_fast/Toy-v0", num_envs=2, autoreset_mode="same_step", kind="discrete")
    assert same.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP and same.single_action_space.n == 4
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*infinity.*")
        single = gym.make("sample_fast/Hopper-v5", backend="mujoco", num_threads=1)
        check_env(single.unwrapped, skip_render_check=True)
    # unseeded single envs built one by one are not clones; seeded ones are reproducible
    a, b = (gym.make("sample_fast/Toy-v0") for _ in range(2))
    assert not np.array_equal(a.reset()[0], b.reset()[0])
    np.testing.assert_array_equal(a.reset(seed=1)[0], b.reset(seed=1)[0])


def test_gymnasium_rejects_bad_input():
    with pytest.raises(EnvError, match="num_envs=1"):
        GymnasiumSingleEnv(make("toy", 2))
    v = GymnasiumVectorEnv(make("toy", 2))
    with pytest.raises(EnvError, match="seed must be an int"):
        v.reset(seed=[1, 2])
    single = GymnasiumSingleEnv(make("toy", 1))
    with pytest.raises(EnvError, match="call reset"):
        single.step(np.zeros(2, np.float32))


# ----- TorchRL ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("options", [{"terminate_on_miss": True}, {"kind": "discrete", "max_episode_steps": 4}])
def test_torchrl_check_env_specs_toy(options):
    from torchrl.envs.utils import check_env_specs

    env = TorchRLEnv(make("toy", 3, **options))
    assert env.batch_size == torch.Size([3])
    check_env_specs(env, break_when_any_done="both")


@pytest.mark.timeout(60)
def test_torchrl_check_env_specs_custom_arm(arm_name):
    from torchrl.envs.utils import check_env_specs

    check_env_specs(TorchRLEnv(make(arm_name, 2, backend="mujoco", num_threads=1)), break_when_any_done="both")


@pytest.mark.timeout(60)
def test_torchrl_rollout_equals_batched_env_loop():
    """A TorchRL rollout through episode ends (partial "_reset" masks) equals a hand loop on a twin env: the
    ("next", "observation") of a done step is the ended episode's last obs, the next "observation" the new first."""
    num_envs, num_steps = 3, 13
    env = TorchRLEnv(make("toy", num_envs, seed=5, max_episode_steps=4, terminate_on_miss=True))
    env.set_seed(7)
    td = env.rollout(num_steps, break_when_any_done=False)
    twin = make("toy", num_envs, seed=5, max_episode_steps=4, terminate_on_miss=True)
    obs, _ = twin.reset(seed=7)
    num_done = 0
    for t in range(num_steps):
        torch.testing.assert_close(td["observation"][:, t], obs)
        res = twin.step(td["action"][:, t])
        torch.testing.assert_close(td["next", "observation"][:, t], res.info["final_obs"])
        torch.testing.assert_close(td["next", "reward"][:, t, 0], res.reward)
        assert torch.equal(td["next", "terminated"][:, t, 0], res.terminated)
        assert torch.equal(td["next", "truncated"][:, t, 0], res.truncated)
        assert torch.equal(td["next", "done"][:, t, 0], res.terminated | res.truncated)
        num_done += int((res.terminated | res.truncated).sum())
        obs = res.obs
    assert num_done > 0


def test_torchrl_partial_reset_of_running_envs():
    """A "_reset" mask on envs whose episodes go on resets exactly those (the others keep their observations)."""
    from tensordict import TensorDict

    env = TorchRLEnv(make("toy", 3, max_episode_steps=8))
    twin = make("toy", 3, max_episode_steps=8)
    td = env.rand_step(env.reset())
    twin.reset()
    before = twin.step(td["action"]).obs
    torch.testing.assert_close(td["next", "observation"], before, rtol=0, atol=0)
    mask = torch.tensor([[False], [True], [False]])
    out = env.reset(TensorDict({"observation": before, "_reset": mask}, batch_size=[3]))
    assert out["observation"][:, -1].tolist() == [0.125, 0.0, 0.125]  # the last entry is t / max_episode_steps
    assert torch.equal(out["observation"][[0, 2]], before[[0, 2]]) and not torch.equal(out["observation"][1], before[1])
    assert env.env._t.tolist() == [1, 0, 1]


@pytest.mark.timeout(60)
def test_torchrl_step_counter_truncates_and_resets_running_envs():
    """TorchRL's StepCounter(max_steps) truncates episodes our env would continue and resets those envs alone."""
    from torchrl.envs import StepCounter, TransformedEnv

    env = TransformedEnv(TorchRLEnv(make("toy", 4, max_episode_steps=10, seed=3)), StepCounter(max_steps=3))
    td = env.rollout(8, break_when_any_done=False)
    truncated = td["next", "truncated"][..., 0]
    assert torch.equal(truncated.nonzero()[:, 1].unique(), torch.tensor([2, 5]))  # steps 3 and 6 of every env
    assert truncated[:, [2, 5]].all()
    t = td["observation"][..., -1] * 10  # toy: the last entry is t / max_episode_steps
    torch.testing.assert_close(t, torch.tensor([0.0, 1, 2, 0, 1, 2, 0, 1]).expand(4, 8))
    assert torch.equal(td["step_count"][..., 0], t.round().long())


@pytest.mark.timeout(60)
def test_torchrl_collector_max_frames_per_traj():
    """A collector's max_frames_per_traj cuts trajectories at 4 steps; the env resets those envs on demand."""
    from torchrl.collectors import Collector

    env = TorchRLEnv(make("toy", 2, max_episode_steps=50, seed=1))
    collector = Collector(env, None, frames_per_batch=20, total_frames=20, max_frames_per_traj=4)
    (batch,) = list(collector)
    collector.shutdown()
    t = batch["observation"][..., -1] * 50  # toy: t / max_episode_steps
    expected = torch.arange(10) % 4
    torch.testing.assert_close(t.reshape(2, 10), expected.float().expand(2, 10))
    assert torch.equal(batch["next", "truncated"].reshape(2, 10), (expected == 3).expand(2, 10))


# ----- Isaac Gym VecTask / rl_games -----------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_vectask_rl_games_style_driver_loop():
    """The loop rl_games' A2CBase.play_steps runs, reduced: obs_dict["obs"], rewards, dones, infos["time_outs"]
    with the bootstrap term gamma * V * time_outs. Checks buffers against a twin env and the bookkeeping."""
    num_envs, horizon, gamma = 4, 6, 0.99
    env = VecTaskEnv(make("toy", num_envs, seed=2, max_episode_steps=horizon, terminate_on_miss=True))
    twin = make("toy", num_envs, seed=2, max_episode_steps=horizon, terminate_on_miss=True)
    info = env.get_env_info()
    assert (env.num_envs, env.num_obs, env.num_actions) == (num_envs, 3, 2)
    assert info["action_space"].shape == (2,) and info["observation_space"].shape == (3,)
    value_head = torch.nn.Linear(env.num_obs, 1)  # stands in for the critic
    obs_dict = env.reset()
    twin_obs, _ = twin.reset()
    torch.testing.assert_close(obs_dict["obs"], twin_obs)
    current_return = torch.zeros(num_envs)
    finished, num_terminated = [], 0
    gen = torch.Generator().manual_seed(0)
    for _ in range(3 * horizon):
        actions = torch.rand(num_envs, env.num_actions, generator=gen) * 2 - 1
        obs_dict, rewards, dones, infos = env.step(actions)
        res = twin.step(actions)
        # fresh tensors equal to the live buffers (IsaacGymEnvs hands out torch.clamp(obs_buf), a new tensor)
        assert obs_dict["obs"] is not env.obs_buf and rewards is not env.rew_buf and dones is not env.reset_buf
        assert torch.equal(obs_dict["obs"], env.obs_buf) and torch.equal(rewards, env.rew_buf)
        assert torch.equal(dones, env.reset_buf) and dones.dtype == torch.int64
        torch.testing.assert_close(env.obs_buf, res.obs)
        torch.testing.assert_close(env.rew_buf, res.reward)
        assert torch.equal(infos["time_outs"], res.truncated & ~res.terminated)
        with torch.no_grad():  # rl_games: shaped_rewards += gamma * values * time_outs
            shaped = rewards + gamma * value_head(infos["final_obs"]).squeeze(-1) * infos["time_outs"]
        assert torch.equal(shaped[~infos["time_outs"]], rewards[~infos["time_outs"]])
        current_return += rewards
        done_idx = dones.nonzero().flatten()
        finished += current_return[done_idx].tolist()
        torch.testing.assert_close(current_return[done_idx], infos["episode_return"][done_idx])
        current_return[done_idx] = 0.0
        num_terminated += int(infos["terminated"].sum())
        assert bool((env.progress_buf < horizon).all())
    assert num_terminated > 0 and len(finished) >= num_terminated
    env.close()


def test_vectask_clips_actions_to_box():
    env = VecTaskEnv(make("toy", 2, max_episode_steps=5), clip_actions=5.0)
    twin = make("toy", 2, max_episode_steps=5)
    env.reset()
    twin.reset()
    _, rew, _, _ = env.step(torch.full((2, 2), 3.0))  # clamped to the box [-1, 1] before the env sees it
    torch.testing.assert_close(rew, twin.step(torch.ones(2, 2)).reward)
    with pytest.raises(EnvError, match="flat continuous"):
        VecTaskEnv(make("toy", 2, kind="discrete"))


# ----- docs/wrappers.md ----------------------------------------------------------------------------------------
DOC = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "wrappers.md")


def _doc_blocks() -> list[str]:
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


class _StepRecorder:
    """Every ``BatchedEnv`` step result (cloned) and reset, per env in order of first use: the independent record
    the adapters' outputs in the doc examples are checked against."""

    def __init__(self, monkeypatch) -> None:
        self.envs: list = []
        self.steps: dict = {}
        recv, reset = BatchedEnv.recv, BatchedEnv.reset

        def recording_recv(env):
            res = recv(env)
            self._seen(env).append(
                StepResult(*(x.clone() for x in res[:4]), {k: v.clone() for k, v in res.info.items()})
            )
            return res

        def recording_reset(env, seed=None, **kwargs):
            self._seen(env)
            return reset(env, seed, **kwargs)

        monkeypatch.setattr(BatchedEnv, "recv", recording_recv)
        monkeypatch.setattr(BatchedEnv, "reset", recording_reset)

    def _seen(self, env) -> list:
        if env not in self.steps:
            self.envs.append(env)
            self.steps[env] = []
        return self.steps[env]


def _check_arm_obs_and_reward(obs: torch.Tensor, reward: torch.Tensor, actions: torch.Tensor) -> None:
    """The page's doc_arm: obs = [cos q (2), sin q (2), qvel (2), fingertip xy (2)], after a step.

    A step ends with an integration (Euler: q <- q_prev + dt * qvel), and xpos is from the forward pass before it,
    i.e. at q_prev = q - dt * qvel (dt = 0.01). Forward kinematics of the two 0.5 m links at q_prev gives the
    fingertip; the reward is minus the fingertip's distance to (0.3, 0.6) minus 0.01 |a|^2."""
    assert obs.shape == (16, 8) and obs.dtype == torch.float32 and reward.shape == (16,)
    o = obs.double()
    torch.testing.assert_close(o[:, 0:2].square() + o[:, 2:4].square(), torch.ones(16, 2, dtype=torch.float64))
    q_prev = torch.atan2(o[:, 2:4], o[:, 0:2]) - 0.01 * o[:, 4:6]
    elbow = q_prev[:, 0] + q_prev[:, 1]
    tip = 0.5 * torch.stack([q_prev[:, 0].cos() + elbow.cos(), q_prev[:, 0].sin() + elbow.sin()], -1)
    torch.testing.assert_close(o[:, 6:8], tip, atol=2e-6, rtol=0)
    distance = (o[:, 6:8] - torch.tensor([0.3, 0.6], dtype=torch.float64)).norm(dim=-1)
    torch.testing.assert_close(reward.double(), -distance - 0.01 * actions.double().square().sum(-1), atol=1e-6, rtol=0)


def _check_gymnasium_vector(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    steps = rec.steps[env]
    assert len(steps) == 10
    obs, reward, terminated, truncated = ns["obs"], ns["reward"], ns["terminated"], ns["truncated"]
    assert obs.shape == (4, 3) and obs.dtype == np.float32 and reward.dtype == np.float32
    assert terminated.dtype == truncated.dtype == np.bool_
    for ours, theirs in zip((obs, reward, terminated, truncated), steps[-1][:4], strict=True):
        np.testing.assert_array_equal(ours, theirs.numpy())  # the adapter's arrays are the BatchedEnv's
    # max_episode_steps=5 and no termination: step 10 ends every episode by the time limit
    assert truncated.all() and not terminated.any()
    np.testing.assert_array_equal(ns["last_obs"], steps[-1].info["final_obs"].numpy())
    assert (ns["last_obs"][:, -1] == 1.0).all() and (obs[:, -1] == 0.0).all()  # obs[-1] is t / max_episode_steps
    expected_returns = torch.stack([r.reward for r in steps[5:]]).sum(0)  # the second episode: steps 6..10
    np.testing.assert_allclose(ns["returns"], expected_returns.numpy(), rtol=1e-5)


def _check_gymnasium_make_vec(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    from sample_fast.envs.mujoco_env import MujocoEnv

    (env,) = new_envs
    assert isinstance(env, MujocoEnv) and env.num_envs == 4 and env.max_episode_steps == 50
    adapter = ns["envs"].env
    assert isinstance(adapter, GymnasiumVectorEnv) and adapter.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    steps = rec.steps[env]
    assert len(steps) == 60
    ended = [(s.terminated | s.truncated, s.truncated, s.info["episode_length"]) for s in steps]
    assert sum(int(d.sum()) for d, _, _ in ended) > 0  # hopper falls under random actions
    assert all(bool((length[d] <= 50).all() and (length[t] == 50).all()) for d, t, length in ended)
    # NormalizeObservation saw the reset's 4 observations and 4 per step; its output is normalized by them
    assert ns["envs"].obs_rms.count == pytest.approx(1e-4 + 4 * 61)
    raw = (ns["obs"] * np.sqrt(ns["envs"].obs_rms.var + 1e-8) + ns["envs"].obs_rms.mean).astype(np.float32)
    # an env whose episode ended in the step before returned a fresh first observation (NEXT_STEP), not the stepped
    # one; every other env returned exactly its stepped observation
    stepped = ~(steps[-2].terminated | steps[-2].truncated).numpy()
    assert stepped.any()
    np.testing.assert_allclose(raw[stepped], steps[-1].info["final_obs"].numpy()[stepped], rtol=0, atol=1e-4)


def _check_sb3(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    model, steps = ns["model"], rec.steps[env]
    assert model.num_timesteps == 256 and len(steps) == 32
    # SB3 logged exactly the episodes the env finished (toy: every episode truncated at 5 steps)
    finished = [float(r) for s in steps for r in s.info["episode_return"][s.truncated]]
    assert [e["l"] for e in model.ep_info_buffer] == [5] * len(finished) and len(finished) == 8 * 6
    np.testing.assert_allclose([e["r"] for e in model.ep_info_buffer], finished, rtol=1e-6)


def _check_gymnasium_single(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    last = rec.steps[env][-1]
    obs, reward = ns["obs"], ns["reward"]
    assert obs.shape == (3,) and obs.dtype == np.float32 and isinstance(reward, float)
    assert isinstance(ns["terminated"], bool) and isinstance(ns["truncated"], bool)
    np.testing.assert_array_equal(obs, last.info["final_obs"][0].numpy())  # gymnasium: the step's own next obs
    assert reward == float(last.reward[0])
    assert (ns["terminated"], ns["truncated"]) == (bool(last.terminated[0]), bool(last.truncated[0]))


def _check_torchrl(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    steps = rec.steps[env][-12:]  # the rollout's (check_env_specs stepped the env before)
    td, next_obs = ns["td"], ns["next_obs"]
    assert td.batch_size == torch.Size([4, 12]) and next_obs.shape == (4, 12, 3)
    terminated, truncated = ns["terminated"], ns["truncated"]
    assert terminated.shape == truncated.shape == (4, 12, 1) and terminated.dtype == truncated.dtype == torch.bool
    torch.testing.assert_close(next_obs, torch.stack([r.info["final_obs"] for r in steps], 1), rtol=0, atol=0)
    assert torch.equal(truncated[..., 0], torch.stack([r.truncated for r in steps], 1))
    # the rollout reset the batch: episodes of 5 steps end at rollout steps 5 and 10 (indices 4, 9), never else
    assert torch.equal(truncated[0, :, 0].nonzero().flatten(), torch.tensor([4, 9])) and truncated.all(0).any()
    assert not terminated.any() and (next_obs[:, [4, 9], -1] == 1.0).all()


def _check_vectask(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    steps = rec.steps[env]
    vec, obs_dict, rewards, dones, extras = ns["env"], ns["obs_dict"], ns["rewards"], ns["dones"], ns["extras"]
    assert len(steps) == 20 and torch.equal(obs_dict["obs"], vec.obs_buf) and obs_dict["obs"] is not vec.obs_buf
    assert obs_dict["obs"].shape == (8, 3) and dones.dtype == torch.int64
    torch.testing.assert_close(obs_dict["obs"], steps[-1].obs, rtol=0, atol=0)
    torch.testing.assert_close(rewards, steps[-1].reward, rtol=0, atol=0)
    # step 20 of 5-step episodes: every env hit its time limit; zero values leave the shaped reward unchanged
    assert (dones == 1).all() and extras["time_outs"].all() and not extras["terminated"].any()
    assert torch.equal(ns["shaped"], rewards)
    assert "Box(" in out and "(3,)" in out  # the printed observation space: one env's 3 floats


def _check_custom_robot(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    assert env.backend == "mujoco" and len(rec.steps[env]) == 1
    assert not ns["terminated_t"].any() and not ns["truncated_t"].any()
    _check_arm_obs_and_reward(ns["obs"], ns["reward_t"], torch.zeros(16, 2))
    torch.testing.assert_close(ns["obs"], rec.steps[env][0].obs, rtol=0, atol=0)


def _check_custom_robot_mjx(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    (env,) = new_envs
    assert env.backend == "mjx"
    _check_arm_obs_and_reward(ns["obs"], ns["reward_t"], torch.zeros(16, 2))


def _check_domain_randomization(ns: dict, rec: _StepRecorder, new_envs: list, out: str) -> None:
    params = ns["params"]
    with make("doc_arm", 16, backend="mujoco") as plain:
        mass0, damping0 = plain.model.body_mass, plain.model.dof_damping
        plain.reset(seed=0)
        plain_obs = plain.step(torch.ones(16, 2)).obs
    mass_ratio = params["body_mass"][:, 1:] / mass0[1:]
    damping_ratio = params["dof_damping"] / damping0
    assert params["body_mass"].shape == (16, 4) and (params["body_mass"][:, 0] == 0).all()
    assert mass_ratio.min() >= 0.8 and mass_ratio.max() <= 1.2 and mass_ratio.std() > 0.05  # drawn per env
    assert damping_ratio.min() >= 0.5 and damping_ratio.max() <= 2.0
    _check_arm_obs_and_reward(ns["obs"], ns["reward_t"], torch.ones(16, 2))
    # same seed and actions, other masses and damping: the joint velocities after the step differ
    assert (ns["obs"][:, 4:6] - plain_obs[:, 4:6]).abs().amax(1).min() > 1e-4


#: One check per ```python block of docs/wrappers.md, in page order.
DOC_CHECKS = [
    _check_gymnasium_vector,
    _check_gymnasium_make_vec,
    _check_gymnasium_single,
    _check_torchrl,
    _check_vectask,
    _check_sb3,
    _check_custom_robot,
    _check_custom_robot_mjx,
    _check_domain_randomization,
]


def _run_doc_blocks(include_mjx: bool, monkeypatch, capsys) -> int:
    """Run the page's blocks in one namespace, in order, and check each one's results."""
    blocks = _doc_blocks()
    assert len(blocks) == len(DOC_CHECKS), "docs/wrappers.md gained or lost an example: give it a check here"
    rec = _StepRecorder(monkeypatch)
    namespace: dict = {"__name__": "docs_wrappers"}
    ran = 0
    try:
        for block, check in zip(blocks, DOC_CHECKS, strict=True):
            if block.startswith("# needs: mjx") and not include_mjx:
                continue
            known = len(rec.envs)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*infinity.*")
                exec(compile(block, DOC, "exec"), namespace)  # blocks share one namespace, in page order
            check(namespace, rec, rec.envs[known:], capsys.readouterr().out)
            ran += 1
    finally:
        TASKS.pop("doc_arm", None)  # registered by the page's example
    return ran


@pytest.mark.timeout(120)
def test_docs_examples_run(monkeypatch, capsys):
    assert _run_doc_blocks(include_mjx=False, monkeypatch=monkeypatch, capsys=capsys) == 8


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_docs_examples_run_mjx(monkeypatch, capsys):
    assert _run_doc_blocks(include_mjx=True, monkeypatch=monkeypatch, capsys=capsys) == 9
