"""Generic tests of the env API through ``make()``: bad arguments, the step contract, send/recv misuse and closing,
run over every backend that imports here (toy, gymnasium, envpool, mujoco, mjx, warp)."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch
from sample_fast.envs import EnvError, make

WARP_CACHE = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, ".cache", "warp"))
#: The values of test_env_mjx.FAST_OPTIONS: a difference costs one more compile, not a wrong result.
MJX_FAST_OPTIONS = {
    "max_episode_steps": 25,
    "xla_opt_level": 0,
    "compilation_cache_dir": os.path.abspath(
        os.path.join(os.path.dirname(__file__), os.pardir, ".pytest_cache", "mjx-xla")
    ),
}

#: id -> (optional third-party package the case needs, make args, make kwargs). Small envs: these tests check the
#: API, not physics. Only envpool is optional (pyproject's ``envpool`` extra); every other backend's packages are
#: hard dependencies, so an import error there is a failure, never a skip.
CASES: dict[str, tuple[str | None, tuple, dict]] = {
    "toy": (None, ("toy", 2), {}),
    "toy-discrete": (None, ("toy", 2), {"kind": "discrete"}),
    "gymnasium": (None, ("gymnasium:Pendulum-v1", 2), {}),
    "gymnasium-discrete": (None, ("gymnasium:CartPole-v1", 2), {}),
    "envpool": ("envpool", ("hopper", 2), {"backend": "envpool", "num_threads": 1}),
    "mujoco": (None, ("hopper", 2), {"backend": "mujoco"}),
    # MJX compiles when built (10 s to minutes on a busy 2-core CPU): one module-scoped env, marked slow below. It is
    # test_env_mjx's `cheetah` env (same task, size, seed and options), so the two share one entry of the XLA
    # persistent cache: whichever module runs first compiles, the other loads.
    "mjx": (None, ("halfcheetah", 4), {"backend": "mjx", "device": "cpu", "seed": 1, **MJX_FAST_OPTIONS}),
    # MuJoCo Warp builds its kernels once into the kernel cache (.cache/warp, kept by CI): ~1 s when cached.
    "warp": (None, ("hopper", 2), {"backend": "warp", "device": "cpu", "kernel_cache_dir": WARP_CACHE}),
}

#: The cases as pytest params; building an MJX env compiles, so those run only with --runslow.
#: The mjx and warp cases join the tests that compile the same program or kernels (tests/conftest.py: one worker).
CASE_MARKS = {
    "mjx": [pytest.mark.slow, pytest.mark.xdist_group("mjx-halfcheetah")],
    "warp": [pytest.mark.xdist_group("warp-kernels")],
}
CASE_PARAMS = [pytest.param(c, marks=CASE_MARKS.get(c, ())) for c in CASES]


def _make_case(case_id: str, **extra):
    optional, args, kwargs = CASES[case_id]
    if optional is not None:
        pytest.importorskip(optional, reason=f"the optional package {optional} of backend {case_id!r} is not installed")
    return make(*args, **{**kwargs, **extra})


def _valid_actions(env) -> torch.Tensor:
    spec = env.action_spec
    if spec.is_discrete:
        return torch.zeros(env.num_envs, dtype=torch.int64, device=env.device)
    return torch.zeros(env.num_envs, *spec.shape, dtype=spec.dtype, device=env.device)


@pytest.fixture(scope="module", params=CASE_PARAMS)
def env(request):
    e = _make_case(request.param)
    e.reset()
    yield e
    e.close()


# ----- make() arguments ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        (("nope", 2), {}, r"unknown env 'nope'; known envs: ant, halfcheetah.*toy, gymnasium:<id>"),
        (("", 2), {}, "non-empty string"),
        (("ant", 2), {"backend": "physx"}, r"unknown backend 'physx'; choose one of: auto, mujoco, mjx, warp, envpool"),
        (("toy", 2), {"backend": "mujoco"}, "runs only on backend 'toy'"),
        (("ant", 2), {"backend": "toy"}, "backend 'toy' runs only env 'toy'"),
        (("gymnasium:Pendulum-v1", 2), {"backend": "envpool"}, "runs on backend 'gymnasium'"),
        (("ant", 2), {"backend": "gymnasium"}, "use 'gymnasium:Ant-v5'"),
        (("toy", 0), {}, "num_envs must be a positive int, got 0"),
        (("toy", -3), {}, "num_envs must be a positive int, got -3"),
        (("toy", 2.0), {}, "num_envs must be a positive int, got 2.0"),
        (("toy", True), {}, "num_envs must be a positive int, got True"),
        (("toy", "4"), {}, "num_envs must be a positive int, got '4'"),
        (("toy", 2), {"device": "gpu0"}, "invalid device 'gpu0'"),
    ],
)
def test_make_rejects_bad_arguments(args, kwargs, fragment):
    with pytest.raises(EnvError, match=fragment):
        make(*args, **kwargs)


def test_env_error_is_a_value_error():
    with pytest.raises(ValueError):
        make("toy", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("name", ["toy", "gymnasium:Pendulum-v1", "hopper"])
def test_cuda_without_cuda(name):
    with pytest.raises(EnvError, match="torch sees no CUDA device; use device='cpu'"):
        make(name, 2, device="cuda")


def test_missing_envpool_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # makes `import envpool` raise ImportError
    monkeypatch.delitem(sys.modules, "sample_fast.envs.envpool_env", raising=False)
    with pytest.raises(EnvError, match="backend 'envpool' needs the package.*pip install envpool"):
        make("ant", 2, backend="envpool")


@pytest.mark.parametrize("case_id", list(CASES))
def test_unknown_option_is_rejected(case_id):
    with pytest.raises(EnvError, match="no_such_option"):
        _make_case(case_id, no_such_option=1)


OWNERS_CHILD = """
import sys
from sample_fast.envs import check_options
from sample_fast.envs.base import UnknownOptionError
try:
    check_options("ant", "mujoco", {"xla_opt_level": 0, "nconmax": 4})
except UnknownOptionError as e:
    print(sorted(e.owners.items()), *(m in sys.modules for m in ("jax", "warp", "mujoco_warp", "envpool")))
"""


def test_an_option_of_another_backend_is_named_without_importing_jax_or_warp():
    """The config check's error path names the owning backend from envs/sim_options.py (plain data), so a typo'd
    backend gets its message in a fraction of a second instead of after JAX's, Warp's and EnvPool's imports (EnvPool
    imports JAX). A fresh interpreter: this one has imported them already."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", OWNERS_CHILD], capture_output=True, text=True, timeout=120)
    owners, *imported = out.stdout.split("\n")[0].rsplit(" ", 4)
    assert owners == "[('nconmax', ['warp']), ('xla_opt_level', ['mjx'])]" and imported == ["False"] * 4, out


# ----- the step contract, on every backend --------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_step_contract(env):
    n = env.num_envs
    obs, info = env.reset()
    assert isinstance(info, dict)
    assert obs.shape == (n, *env.observation_spec.shape) and obs.dtype == torch.float32 and obs.device == env.device
    res = env.step(_valid_actions(env))
    assert res.obs.shape == obs.shape and res.obs.dtype == torch.float32
    assert res.reward.shape == (n,) and res.reward.dtype == torch.float32
    assert res.terminated.shape == (n,) and res.terminated.dtype == torch.bool
    assert res.truncated.shape == (n,) and res.truncated.dtype == torch.bool
    assert res.info["final_obs"].shape == obs.shape and res.info["final_obs"].dtype == torch.float32
    assert res.info["episode_return"].shape == (n,) and res.info["episode_return"].dtype == torch.float32
    assert res.info["episode_length"].shape == (n,) and res.info["episode_length"].dtype == torch.int64
    assert res.info["physics_reset"].shape == (n,) and res.info["physics_reset"].dtype == torch.bool
    assert torch.isfinite(res.obs).all() and torch.isfinite(res.info["final_obs"]).all()
    not_done = ~(res.terminated | res.truncated)
    assert torch.equal(res.obs[not_done], res.info["final_obs"][not_done])
    assert (res.info["episode_length"][not_done] == 0).all()


def _expected(env) -> str:
    return env.action_spec.describe(env.num_envs, env.device)


def test_wrong_action_shape(env):
    spec = env.action_spec
    with pytest.raises(EnvError, match="expected " + re.escape(_expected(env))):
        env.step(torch.zeros(env.num_envs + 1, *spec.shape, dtype=spec.dtype))
    with pytest.raises(EnvError, match="shape"):
        env.step(torch.zeros(env.num_envs, *spec.shape, 2, dtype=spec.dtype))


def test_wrong_action_dtype(env):
    spec = env.action_spec
    wrong = torch.float64 if not spec.is_discrete else torch.float32
    with pytest.raises(EnvError, match=f"dtype {wrong}; expected " + re.escape(_expected(env))):
        env.step(_valid_actions(env).to(wrong))


def test_wrong_action_device(env):
    # The "meta" device stands in for a wrong device on machines without a GPU.
    with pytest.raises(EnvError, match=r"actions are on meta; expected .*device " + str(env.device)):
        env.step(_valid_actions(env).to("meta"))


def test_actions_not_a_tensor(env):
    with pytest.raises(EnvError, match="must be a torch.Tensor"):
        env.step(_valid_actions(env).cpu().numpy())


def test_bad_action_values(env):
    actions = _valid_actions(env)
    if env.action_spec.is_discrete:
        actions[0] = env.action_spec.num_actions
        with pytest.raises(EnvError, match=rf"\[0, {env.action_spec.num_actions}\)"):
            env.step(actions)
    else:
        actions[1] = float("nan")
        with pytest.raises(EnvError, match=r"NaN or inf for envs \[1\]"):
            env.step(actions)


@pytest.mark.timeout(600)
def test_send_recv_misuse(env):
    with pytest.raises(EnvError, match="recv\\(\\) called without a pending send"):
        env.recv()
    env.send(_valid_actions(env))
    with pytest.raises(EnvError, match="send\\(\\) called twice"):
        env.send(_valid_actions(env))
    res = env.recv()  # the first send is still pending and completes normally
    assert res.obs.shape[0] == env.num_envs
    with pytest.raises(EnvError, match="without a pending send"):
        env.recv()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case_id", CASE_PARAMS)
def test_closed_env_rejects_calls_and_context_manager_closes(case_id):
    with _make_case(case_id) as e:
        assert not e._closed
    assert e._closed
    with pytest.raises(EnvError, match="is closed; make a new env"):
        e.step(_valid_actions(e))
    with pytest.raises(EnvError, match="is closed"):
        e.reset()
    e.close()  # closing twice is harmless


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case_id", ["toy", "toy-discrete", "gymnasium", "envpool"])
def test_cuda_device(case_id):
    with _make_case(case_id, device="cuda") as e:
        obs, _ = e.reset()
        assert obs.device.type == "cuda"
        res = e.step(_valid_actions(e))
        assert res.obs.device.type == "cuda" and res.reward.device.type == "cuda"
        assert res.info["final_obs"].device.type == "cuda" and res.info["episode_length"].device.type == "cuda"
        with pytest.raises(EnvError, match="actions are on cpu"):
            e.step(_valid_actions(e).cpu())
