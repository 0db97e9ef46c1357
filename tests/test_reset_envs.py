"""Per-env reset on demand (``BatchedEnv.reset(env_mask=...)``) on every backend, and the fresh-tensor contract.

Each backend test runs two twin envs (same seed, same actions). After a few steps one twin resets the chosen envs:
the independent expectation is the other twin, which does not. The envs that were not chosen must continue bit for
bit (observations, rewards, flags, final observations, episode statistics, step after step); the chosen ones start
a new episode there: new first observations, and their time limit and episode statistics restart at the reset
(their truncation comes exactly ``max_episode_steps`` steps after it, their ``episode_length`` counts from it).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from arm_robot import ARM_XML, arm_obs, arm_reward
from sample_fast.envs import TASKS, EnvError, make
from sample_fast.envs.adapters import VecTaskEnv
from sample_fast.envs.base import BatchedEnv
from sample_fast.envs.custom import register_robot

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
CACHE_DIR = os.path.join(os.path.dirname(__file__), os.pardir, ".pytest_cache", "mjx-xla")

# A contact-free planar arm with reset noise (cheap to compile for MJX); no termination, so only the time limit ends
# its episodes.
ARM_STEPS = 6


@pytest.fixture(scope="module")
def arm():
    register_robot("reset_arm", ARM_XML, arm_obs, arm_reward, max_episode_steps=ARM_STEPS, reset_noise_scale=0.1,
                   check_jax=False, overwrite=True)  # fmt: skip
    yield "reset_arm"
    TASKS.pop("reset_arm", None)


def _actions(env: BatchedEnv, gen: torch.Generator) -> torch.Tensor:
    spec = env.action_spec
    if spec.is_discrete:
        return torch.randint(0, spec.num_actions, (env.num_envs, *spec.shape), generator=gen)
    return torch.rand(env.num_envs, *spec.shape, generator=gen) * 2 - 1


def _check_partial_reset(
    build, limit: int | None, steps_before: int = 3, steps_after: int = 12, new_obs: bool = True
) -> None:
    """Twin ``build()`` envs; ``a`` resets envs 1 and 3 after ``steps_before`` steps, ``b`` does not."""
    a, b = build(), build()
    try:
        n = a.num_envs
        mask = torch.zeros(n, dtype=torch.bool)
        mask[1::2] = True
        gen = torch.Generator().manual_seed(0)
        a.reset(seed=4)
        last_b, _ = b.reset(seed=4)
        for _ in range(steps_before):
            act = _actions(a, gen)
            a.step(act)
            last_b = b.step(act).obs
        obs, info = a.reset(env_mask=mask)
        assert obs.shape == (n, *a.observation_spec.shape) and obs.dtype == a.observation_spec.dtype
        keep = ~mask
        assert torch.equal(obs[keep], last_b[keep])  # the other rows: the last step's observations
        if new_obs:  # (an Atari game 3 steps in can still show its first screen: there the time limit proves it)
            assert not torch.equal(obs[mask], last_b[mask])  # new episodes' first observations
        since_reset = torch.zeros(n, dtype=torch.int64)  # steps into the current episode, counted here
        since_reset[keep] = steps_before
        num_done = {"kept": 0, "reset": 0}
        for _ in range(steps_after):
            act = _actions(a, gen)
            ra, rb = a.step(act), b.step(act)
            for x, y in zip(ra[:4], rb[:4], strict=True):
                assert torch.equal(x[keep], y[keep])
            for key in ("final_obs", "episode_return", "episode_length"):
                assert torch.equal(ra.info[key][keep], rb.info[key][keep]), key
            since_reset += 1
            done = ra.terminated | ra.truncated
            if limit is not None:
                # the time limit counts from each env's own (partial) reset
                assert torch.equal(ra.truncated & ~ra.terminated, (since_reset >= limit) & ~ra.terminated)
            assert torch.equal(ra.info["episode_length"][done], since_reset[done])
            num_done["kept"] += int((done & keep).sum())
            num_done["reset"] += int((done & mask).sum())
            since_reset[done] = 0
        assert num_done["kept"] > 0 and num_done["reset"] > 0  # both kinds of env reached an episode end
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["continuous", "discrete", "image"])
def test_partial_reset_toy(kind):
    _check_partial_reset(lambda: make("toy", 4, kind=kind, max_episode_steps=5, seed=1), limit=5)


@pytest.mark.timeout(60)
def test_partial_reset_toy_restarts_time_and_returns():
    env = make("toy", 3, max_episode_steps=4)
    env.reset()
    env.step(torch.zeros(3, 2))
    env.step(torch.zeros(3, 2))
    obs, _ = env.reset(env_mask=torch.tensor([True, False, False]))
    assert obs[:, -1].tolist() == [0.0, 0.5, 0.5]  # the last entry is t / max_episode_steps
    obs, _ = env.reset(env_mask=torch.zeros(3, dtype=torch.bool))  # nothing chosen: nothing changes
    assert obs[:, -1].tolist() == [0.0, 0.5, 0.5]


@pytest.mark.timeout(60)
def test_partial_reset_mujoco(arm):
    _check_partial_reset(lambda: make(arm, 4, backend="mujoco", num_threads=2), limit=ARM_STEPS)


@pytest.mark.timeout(120)
def test_partial_reset_mujoco_hopper_terminations():
    # hopper under random actions falls over (terminations) as well as hitting its time limit
    _check_partial_reset(lambda: make("hopper", 4, backend="mujoco", num_threads=1, max_episode_steps=10), limit=10,
                         steps_after=25)  # fmt: skip


@pytest.mark.timeout(300, method="thread")
def test_partial_reset_mjx(arm):
    pytest.importorskip("mujoco.mjx")  # a required dependency; a stripped install lacks only this backend

    def build():
        return make(arm, 4, backend="mjx", xla_opt_level=0, compilation_cache_dir=os.path.abspath(CACHE_DIR))

    _check_partial_reset(build, limit=ARM_STEPS)


@pytest.mark.timeout(300, method="thread")
@pytest.mark.xdist_group("warp-kernels")  # after test_env_warp's tests, on their worker: the kernels are built
def test_partial_reset_warp(arm):
    pytest.importorskip("mujoco_warp")  # pinned in pyproject; a stripped install lacks only this backend
    cache = os.path.join(os.path.dirname(__file__), os.pardir, ".cache", "warp")  # test_env_warp's kernel cache

    def build():
        return make(arm, 4, backend="warp", device="cpu", kernel_cache_dir=os.path.abspath(cache))

    _check_partial_reset(build, limit=ARM_STEPS)


@pytest.mark.timeout(60)
def test_partial_reset_gymnasium():
    _check_partial_reset(lambda: make("gymnasium:CartPole-v1", 4, max_episode_steps=8), limit=None, steps_after=20)


@pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool does not install on this platform")
@pytest.mark.timeout(60)
def test_partial_reset_envpool():
    _check_partial_reset(lambda: make("hopper", 4, backend="envpool", num_threads=1, max_episode_steps=10), limit=10,
                         steps_after=25)  # fmt: skip


@pytest.mark.timeout(60)
def test_partial_reset_ale():
    _check_partial_reset(lambda: make("Pong-v5", 4, backend="ale", num_threads=1, max_episode_steps=6), limit=6,
                         new_obs=False)  # fmt: skip


@pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool does not install on this platform")
@pytest.mark.timeout(60)
def test_partial_reset_envpool_atari():
    _check_partial_reset(lambda: make("Pong-v5", 4, backend="envpool", num_threads=1, max_episode_steps=6), limit=6,
                         new_obs=False)  # fmt: skip


def test_partial_reset_errors():
    env = make("toy", 3)
    with pytest.raises(EnvError, match="call reset\\(\\) once first"):
        env.reset(env_mask=torch.ones(3, dtype=torch.bool))
    env.reset()
    with pytest.raises(EnvError, match="bool tensor of shape \\(3,\\)"):
        env.reset(env_mask=torch.ones(2, dtype=torch.bool))
    with pytest.raises(EnvError, match="bool tensor of shape \\(3,\\)"):
        env.reset(env_mask=torch.ones(3))
    with pytest.raises(EnvError, match="torch.as_tensor"):
        env.reset(env_mask=[True, False, True])
    with pytest.raises(EnvError, match="reseeds the whole batch"):
        env.reset(seed=1, env_mask=torch.ones(3, dtype=torch.bool))
    env.send(torch.zeros(3, 2))
    with pytest.raises(EnvError, match="call recv\\(\\) first"):
        env.reset(env_mask=torch.ones(3, dtype=torch.bool))


def test_backend_without_partial_reset_says_so():
    """A backend that does not implement ``_reset_envs`` refuses by name, and does not reset anything."""

    class FullResetOnly(type(make("toy", 1))):
        backend = "fullresetonly"
        _reset_envs = BatchedEnv._reset_envs

    env = FullResetOnly("toy", 2)
    obs, _ = env.reset()
    env.step(torch.zeros(2, 2))
    t_before = env._t.clone()
    with pytest.raises(EnvError, match="backend 'fullresetonly' .* cannot reset chosen envs"):
        env.reset(env_mask=torch.tensor([True, False]))
    assert torch.equal(env._t, t_before)


# ----- fresh tensors ---------------------------------------------------------------------------------------------
FRESH_BACKENDS = {
    "toy": lambda arm: make("toy", 3, max_episode_steps=3),
    "mujoco": lambda arm: make("hopper", 3, backend="mujoco", num_threads=1, max_episode_steps=3),
    "gymnasium": lambda arm: make("gymnasium:Pendulum-v1", 3, max_episode_steps=3),
    "mjx": lambda arm: make(
        arm, 3, backend="mjx", xla_opt_level=0, max_episode_steps=3, compilation_cache_dir=os.path.abspath(CACHE_DIR)
    ),  # fmt: skip
    "envpool": lambda arm: make("hopper", 3, backend="envpool", max_episode_steps=3),
}


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("backend", list(FRESH_BACKENDS))
def test_vectask_observation_survives_next_step(backend, arm):
    """What ``VecTaskEnv.step`` returns is never overwritten by later steps (skrl 1.4 stores the returned tensors
    and learned from the next step's observation when it was the live ``obs_buf``), on every backend with flat
    continuous observations and actions (the Atari backends have neither, so VecTask does not take them)."""
    if backend == "envpool" and not HAS_ENVPOOL:
        pytest.skip("envpool does not install on this platform")
    env = VecTaskEnv(FRESH_BACKENDS[backend](arm))
    first = env.reset()["obs"]
    first_copy = first.clone()
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # through the time limit (3): the auto-reset rows too
        obs_dict, rew, dones, extras = env.step(torch.rand(env.num_envs, env.num_actions, generator=gen) * 2 - 1)
        refs = (obs_dict["obs"], rew, dones, extras["final_obs"], extras["time_outs"], extras["episode_return"])
        copies = tuple(x.clone() for x in refs)
        env.step(torch.rand(env.num_envs, env.num_actions, generator=gen) * 2 - 1)
        for ref, copy in zip(refs, copies, strict=True):
            assert torch.equal(ref, copy)  # still what that step returned
        assert not torch.equal(refs[0], env.obs_buf)  # the buffer moved on, the returned tensor did not
    assert torch.equal(first, first_copy)
    env.close()


def test_vectask_reset_idx():
    """VecTaskEnv.reset_idx resets the chosen envs on demand; the others keep their observations and progress."""
    env = VecTaskEnv(make("toy", 3, max_episode_steps=8))
    env.reset()
    obs_dict, *_ = env.step(torch.zeros(3, 2))
    out = env.reset_idx(torch.tensor([2]))
    assert env.progress_buf.tolist() == [1, 1, 0]
    assert torch.equal(out["obs"][:2], obs_dict["obs"][:2]) and out["obs"][2, -1] == 0.0  # t / max_episode_steps
    assert torch.equal(env.obs_buf, out["obs"]) and out["obs"] is not env.obs_buf
