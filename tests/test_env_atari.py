"""Tests of the Atari games on the ``envpool`` and ``ale`` backends: one set of semantics, checked on both, and the
two backends against each other (Pong with no-op starts and sticky actions off is deterministic)."""

from __future__ import annotations

from importlib.util import find_spec

import numpy as np
import pytest
import torch
from sample_fast.envs import EnvError, make
from sample_fast.envs.atari import ATARI_OPTIONS

pytestmark = pytest.mark.timeout(120)

#: Each backend runs only where its package imports.
BACKENDS = [
    pytest.param(backend, marks=pytest.mark.skipif(find_spec(module) is None, reason=f"{module} is not installed"))
    for backend, module in (("envpool", "envpool"), ("ale", "ale_py"))
]
#: No no-op starts, no sticky actions: every Pong game from reset is the same deterministic game.
DETERMINISTIC = {"noop_max": 0, "repeat_action_probability": 0.0}


def _noop(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64)


@pytest.fixture(scope="module")
def noop_games():
    """Per backend: one game of Pong with NOOP forever (the opponent wins 21-0), recorded step by step."""
    cache: dict[str, dict] = {}

    def play(backend: str) -> dict:
        if backend not in cache:
            with make("Pong-v5", 1, backend=backend, seed=0, num_threads=1, **DETERMINISTIC) as env:
                obs0, _ = env.reset()
                rewards = []
                for _ in range(2000):
                    res = env.step(_noop(1))
                    rewards.append(float(res.reward[0]))
                    assert not res.truncated.any()
                    if res.terminated[0]:
                        break
                cache[backend] = {"obs0": obs0, "res": res, "rewards": rewards}
        return cache[backend]

    return play


# ----- shapes, dtypes, seeding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_shapes_and_dtypes(backend):
    with make("Pong-v5", 3, backend=backend, num_threads=1) as env:
        assert env.backend == backend and env.name == "Pong-v5"
        assert env.observation_spec.shape == (4, 84, 84) and env.observation_spec.dtype == torch.uint8
        assert env.action_spec.shape == () and env.action_spec.dtype == torch.int64
        assert env.action_spec.num_actions == 6  # Pong's minimal action set
        assert env.max_episode_steps == 27_000 and env.frame_skip == 4
        obs, info = env.reset()
        assert obs.shape == (3, 4, 84, 84) and obs.dtype == torch.uint8
        assert info["lives"].dtype == torch.int64
        # The stack at a game start repeats the first frame (ale-py zero-pads; the adapter aligns it with EnvPool).
        assert all(torch.equal(obs[:, k], obs[:, 3]) for k in range(3)) and obs.float().mean() > 50
        res = env.step(torch.tensor([0, 1, 5]))
        assert res.obs.shape == (3, 4, 84, 84) and res.obs.dtype == torch.uint8
        assert res.reward.shape == (3,) and res.reward.dtype == torch.float32
        assert res.terminated.dtype == torch.bool and res.truncated.dtype == torch.bool
        assert res.info["final_obs"].dtype == torch.uint8 and torch.equal(res.info["final_obs"], res.obs)
        assert res.info["episode_return"].dtype == torch.float32 and res.info["episode_length"].dtype == torch.int64
        assert not res.info["physics_reset"].any()
        with make("Pong-v5", 1, backend=backend, full_action_space=True) as full:
            assert full.action_spec.num_actions == 18


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_determinism(backend):
    """Default options (up to 30 no-op starts, sticky actions 0.25): a seed fixes the whole trajectory."""
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 6, (40, 2)))

    def run(seed, reset_seed=None):
        with make("Pong-v5", 2, backend=backend, seed=seed, num_threads=1) as env:
            out = [env.reset(seed=reset_seed)[0]]
            out += [env.step(a).obs for a in actions]
        return torch.stack(out)

    a = run(1)
    assert torch.equal(a, run(1))
    assert not torch.equal(a, run(2))  # the no-op starts differ
    assert torch.equal(run(2, reset_seed=1), a)  # reset(seed) reseeds as construction does


# ----- episode semantics ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_noop_forever_loses_pong_21_0(backend, noop_games):
    game = noop_games(backend)
    res, rewards = game["res"], game["rewards"]
    assert res.terminated.tolist() == [True] and res.truncated.tolist() == [False]
    # Raw scores, not clipped: 21 points lost, none won.
    assert sum(rewards) == -21.0 and rewards.count(-1.0) == 21 and set(rewards) == {0.0, -1.0}
    assert res.info["episode_return"].tolist() == [-21.0]
    assert res.info["episode_length"].tolist() == [len(rewards)]
    # Same-step reset: obs already shows the new game (the same deterministic start), final_obs the lost one.
    assert torch.equal(res.obs, game["obs0"])
    assert not torch.equal(res.info["final_obs"], res.obs)


def test_noop_game_is_as_long_on_both_backends(noop_games):
    pytest.importorskip("envpool")
    pytest.importorskip("ale_py")
    assert noop_games("envpool")["rewards"] == noop_games("ale")["rewards"]  # same points at the same steps


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncation_at_the_step_cap(backend):
    cap = 50  # agent steps (200 frames); Pong's first point comes later than that with NOOP
    with make("Pong-v5", 2, backend=backend, max_episode_steps=cap, **DETERMINISTIC) as env:
        obs0, _ = env.reset()
        for k in range(1, cap + 1):
            res = env.step(_noop(2))
            assert not res.terminated.any()
            assert res.truncated.tolist() == [k == cap] * 2
        assert res.info["episode_length"].tolist() == [cap, cap]
        assert res.info["episode_return"].tolist() == [0.0, 0.0]
        assert torch.equal(res.obs, obs0)  # the new episode's first observation
        assert not torch.equal(res.info["final_obs"], obs0)  # the true last one, 50 steps in
        res = env.step(_noop(2))  # the next episode runs the action (nothing is discarded)
        assert not res.truncated.any() and not torch.equal(res.obs, obs0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_episodic_life_terminates_on_a_lost_life_and_the_game_goes_on(backend):
    # Breakout with FIRE reset and NOOP: the ball flies, the paddle never moves, the first life is lost at step 24.
    with make("Breakout-v5", 1, backend=backend, episodic_life=True, **DETERMINISTIC) as env:
        _, info = env.reset()
        assert info["lives"].tolist() == [5]
        num_steps, res = 1, env.step(_noop(1))
        while not res.terminated[0] and num_steps < 100:
            num_steps, res = num_steps + 1, env.step(_noop(1))
        assert num_steps == 24 and not res.truncated[0]
        assert res.info["lives"].tolist() == [4] and res.info["episode_length"].tolist() == [24]
        assert torch.equal(res.obs, res.info["final_obs"])  # no reset: the game continues with 4 lives
        res = env.step(_noop(1))
        assert res.info["lives"].tolist() == [4] and not res.terminated[0]
    with make("Breakout-v5", 1, backend=backend, **DETERMINISTIC) as env:  # default: a lost life is no episode end
        env.reset()
        for _ in range(30):
            res = env.step(_noop(1))
            assert not res.terminated[0]
        assert res.info["lives"].tolist() == [4]


def test_envpool_and_ale_agree():
    """The same actions give the same rewards and flags, and bit-identical observations except the newest frame of
    a game-over final_obs (ale-py stops the frame skip before it captures the screen of the last frame)."""
    pytest.importorskip("envpool")
    pytest.importorskip("ale_py")
    steps, n = 780, 1
    # One env, column 1 of this random sequence: it loses its game at step 764 (one env halves the test's time).
    actions = torch.from_numpy(np.random.default_rng(0).integers(0, 6, (steps, 2))[:, 1:])
    runs = {}
    for backend in ("envpool", "ale"):
        with make("Pong-v5", n, backend=backend, seed=0, num_threads=1, **DETERMINISTIC) as env:
            rec = {"obs": [env.reset()[0]], "reward": [], "terminated": [], "truncated": [], "final_obs": []}
            for a in actions:
                res = env.step(a)
                for key in ("obs", "reward", "terminated", "truncated"):
                    rec[key].append(getattr(res, key))
                rec["final_obs"].append(res.info["final_obs"])
            runs[backend] = {key: torch.stack(v) for key, v in rec.items()}
    ep, ale = runs["envpool"], runs["ale"]
    assert ep["terminated"].nonzero().tolist() == [[763, 0]]
    for key in ("reward", "terminated", "truncated", "obs"):
        assert torch.equal(ep[key], ale[key]), key
    diff = (ep["final_obs"].int() - ale["final_obs"].int()).abs()
    done = ep["terminated"]
    assert diff[~done].max() == 0 and diff[done][:, :3].max() == 0
    assert diff[done][:, 3].float().mean() < 2.0  # measured: mean 0.06-0.08, max 142 on a few pixels
    # At the time limit too (ale-py reaches it on the step's last frame and stops before capturing it).
    final = {}
    for backend in ("envpool", "ale"):
        with make("Pong-v5", 1, backend=backend, max_episode_steps=50, **DETERMINISTIC) as env:
            env.reset()
            for _ in range(50):
                res = env.step(_noop(1))
            assert res.truncated.tolist() == [True] and res.terminated.tolist() == [False]
            final[backend] = res.info["final_obs"].int()
    diff = (final["envpool"] - final["ale"]).abs()
    assert diff[:, :3].max() == 0 and diff[:, 3].float().mean() < 2.0  # measured: mean 0.16, max 136


# ----- bad input -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, kwargs, fragment",
    [
        ("Pongg-v5", {}, r"unknown Atari game 'Pongg-v5'; closest: Pong-v5.*all 108 games: Adventure-v5"),
        ("Ant-v5", {}, "the MuJoCo task is named 'ant'"),
        ("Pong-v5", {"backend": "mujoco"}, "runs on backends envpool, ale"),
        ("ant", {"backend": "ale"}, "backend 'ale' runs Atari games"),
        ("Pong-v5", {"sticky": 0.1}, r"unknown option\(s\) \['sticky'\].*valid options: max_episode_steps, frame_skip"),
        ("Pong-v5", {"repeat_action_probability": 1.5}, "repeat_action_probability must be a number in"),
        ("Pong-v5", {"noop_max": -1}, "noop_max must be a non-negative int"),
        ("Pong-v5", {"episodic_life": 1}, "episodic_life must be True or False"),
        ("Pong-v5", {"max_episode_steps": 0}, "max_episode_steps must be a positive int"),
    ],
)
def test_make_rejects_bad_atari_arguments(name, kwargs, fragment):
    pytest.importorskip("ale_py")
    with pytest.raises(EnvError, match=fragment):
        make(name, 2, **{"backend": "ale", **kwargs})


def test_games_envpool_lacks_point_to_ale():
    pytest.importorskip("envpool")
    with pytest.raises(EnvError, match="EnvPool .* has no Atari game 'Combat-v5'; use backend='ale'"):
        make("Combat-v5", 1, backend="envpool")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_actions_name_the_spec(backend):
    with make("Pong-v5", 2, backend=backend, num_threads=1) as env:
        with pytest.raises(EnvError, match="call reset"):
            env.step(_noop(2))
        env.reset()
        spec = r"expected shape \(2,\), dtype torch.int64, device cpu, values in \[0, 6\)"
        with pytest.raises(EnvError, match=r"must be in \[0, 6\); got values in \[0, 6\]; " + spec):
            env.step(torch.tensor([0, 6]))
        with pytest.raises(EnvError, match=r"got values in \[-1, 0\]"):
            env.step(torch.tensor([-1, 0]))
        with pytest.raises(EnvError, match=r"dtype torch.float32; " + spec):
            env.step(torch.zeros(2))
        with pytest.raises(EnvError, match=r"shape \(3,\); " + spec):
            env.step(_noop(3))
        env.check_actions = False  # the range is still checked: EnvPool would index past its action table
        with pytest.raises(EnvError, match=r"must be in \[0, 6\)"):
            env.step(torch.tensor([7, 0]))
        assert env.step(_noop(2)).obs.shape == (2, 4, 84, 84)  # a failed send leaves nothing pending


def test_auto_picks_envpool_and_options_default_as_documented():
    pytest.importorskip("envpool")
    with make("Pong-v5", 1) as env:
        assert env.backend == "envpool"
        assert env.options["repeat_action_probability"] == 0.25 == ATARI_OPTIONS["repeat_action_probability"]
        assert env._kwargs["repeat_action_probability"] == 0.25 and env._kwargs["reward_clip"] is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_releases_the_pool(backend):
    env = make("Pong-v5", 2, backend=backend, num_threads=1)
    env.reset()
    env.close()
    assert env._pool is None
    with pytest.raises(EnvError, match="closed"):
        env.step(_noop(2))


def test_ale_rgb_frames_show_the_same_game():
    """``rgb_frames=True`` (eval's videos): the RGB screen follows the game the observations show, and the twin
    pool leaves those observations unchanged."""
    import torch.nn.functional as F

    actions = torch.randint(0, 6, (60, 2), generator=torch.Generator().manual_seed(0))
    with make("Pong-v5", 2, backend="ale", seed=3) as plain, make("Pong-v5", 2, backend="ale", seed=3,
                                                                   rgb_frames=True) as env:  # fmt: skip
        assert torch.equal(plain.reset()[0], env.reset()[0])
        screens = [env.render_rgb()]
        for a in actions:
            obs = env.step(a).obs
            assert torch.equal(plain.step(a).obs, obs)
            screens.append(env.render_rgb())
        rgb = screens[-1]
        assert rgb.shape == (2, 210, 160, 3) and rgb.dtype == np.uint8
        assert not np.array_equal(screens[0], rgb)  # the game moved
        # The newest observed frame is the screen in grey at 84x84: luminance (ITU-R 601) averaged down to 84x84
        # correlates with it (not bit-equal: ALE's palette-to-grey table and its max over 2 frames).
        lum = torch.from_numpy(rgb).float() @ torch.tensor([0.299, 0.587, 0.114])
        small = F.interpolate(lum[:, None], size=(84, 84), mode="area")[:, 0]
        for i in range(2):
            corr = torch.corrcoef(torch.stack([small[i].flatten(), obs[i, -1].float().flatten()]))[0, 1]
            assert corr > 0.9, corr
    with make("Pong-v5", 1, backend="ale") as env, pytest.raises(EnvError, match="rgb_frames=True"):
        env.render_rgb()
