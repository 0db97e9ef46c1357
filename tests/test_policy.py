"""Tests of ``sample_fast.policy``: the running normaliser against numpy, log-probs and entropies against
torch.distributions and hand values, shapes/dtypes of ``act``, init, and state_dict round trips."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sample_fast.envs import Spec

from sample_fast.policy import ActorCritic, PolicyConfig, PolicyConfigError, RunningNormalizer

OBS = Spec(shape=(5,), dtype=torch.float32)
CONT = Spec(shape=(3,), dtype=torch.float32, low=-torch.ones(3), high=torch.ones(3))
DISC = Spec(shape=(), dtype=torch.int64, num_actions=4)


@pytest.fixture(autouse=True)
def one_thread():
    # Other processes share the 2 cores; tiny matmuls on 2 spinning threads can be 10x slower than on one.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_normalizer_matches_numpy_over_several_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=s, size=(n, 4)) for n, s in ((7, 1.0), (100, 5.0), (1, 2.0), (33, 0.1))]
    norm = RunningNormalizer(4, clip=100.0)
    for b in batches:
        norm.update(torch.from_numpy(b).float())
    data = np.concatenate([b.astype(np.float32).astype(np.float64) for b in batches])
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-9)  # population variance
    assert norm.count.item() == len(data)
    x = torch.from_numpy(rng.normal(size=(6, 4))).float()
    expected = (x.double().numpy() - data.mean(0)) / np.sqrt(data.var(0) + 1e-8)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_normalizer_clips_and_is_identity_before_any_update():
    norm = RunningNormalizer(2, clip=5.0)
    x = torch.tensor([[1.0, -2.0], [100.0, -100.0]])
    assert torch.allclose(norm(x), torch.tensor([[1.0, -2.0], [5.0, -5.0]]))  # mean 0, var 1 -> only the clip


def test_policy_normalizer_buffers_travel_with_state_dict():
    torch.manual_seed(0)
    a = ActorCritic(OBS, CONT)
    a.update_normalizer(torch.randn(4, 16, 5) * 3 + 1)  # [T, B, obs] is flattened
    assert a.normalizer.count.item() == 64
    state = a.state_dict()
    assert {"normalizer.mean", "normalizer.var", "normalizer.count", "log_std"} <= set(state)
    b = ActorCritic(OBS, CONT)
    b.load_state_dict(state)
    obs = torch.randn(8, 5)
    assert torch.equal(a.evaluate(obs, torch.zeros(8, 3))[0], b.evaluate(obs, torch.zeros(8, 3))[0])


def test_continuous_act_shapes_and_logp_match_torch_distributions():
    torch.manual_seed(1)
    pol = ActorCritic(OBS, CONT, PolicyConfig(hidden_sizes=[32, 32], init_log_std=-0.3))
    pol.update_normalizer(torch.randn(50, 5))
    obs = torch.randn(10, 5)
    actions, logp, values = pol.act(obs)
    assert actions.shape == (10, 3) and actions.dtype == torch.float32
    assert logp.shape == (10,) and values.shape == (10,)
    mean = torch.tanh(pol.actor(pol.normalizer(obs)))  # bounds [-1, 1]: center 0, half range 1
    dist = torch.distributions.Normal(mean, torch.full((3,), math.exp(-0.3)))
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1), rtol=1e-5, atol=1e-5)
    target_logp, entropy, values2 = pol.evaluate(obs, actions)
    torch.testing.assert_close(target_logp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values2, values)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    det_actions, det_logp, _ = pol.act(obs, deterministic=True)
    torch.testing.assert_close(det_actions, mean)
    torch.testing.assert_close(det_logp, dist.log_prob(mean).sum(-1))


def test_squashed_mean_stays_inside_asymmetric_bounds():
    spec = Spec(shape=(2,), dtype=torch.float32, low=torch.tensor([0.0, -2.0]), high=torch.tensor([1.0, 2.0]))
    pol = ActorCritic(OBS, spec)
    assert pol.squash and not ActorCritic(OBS, spec, PolicyConfig(squash_mean=False)).squash
    obs = torch.randn(4, 5)
    with torch.no_grad():
        pol.actor[-1].weight.zero_()
    # Zero actor output -> the box centre [0.5, 0]; a huge output -> the upper bound, never beyond.
    torch.testing.assert_close(pol.act(obs, deterministic=True)[0], torch.tensor([[0.5, 0.0]]).expand(4, 2))
    with torch.no_grad():
        pol.actor[-1].bias.fill_(100.0)
    torch.testing.assert_close(pol.act(obs, deterministic=True)[0], torch.tensor([[1.0, 2.0]]).expand(4, 2))
    actions, logp, _ = pol.act(obs)  # the sample itself is not squashed: log-prob is of the unclipped Gaussian
    dist = torch.distributions.Normal(torch.tensor([1.0, 2.0]), math.exp(-0.5))
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))


def test_entropy_of_known_gaussian():
    pol = ActorCritic(OBS, Spec(shape=(2,), dtype=torch.float32), PolicyConfig(init_log_std=0.0))
    _, entropy, _ = pol.evaluate(torch.zeros(3, 5), torch.zeros(3, 2))
    # Unit Gaussian, 2 dims: 2 * 0.5 * log(2 pi e) = log(2 pi e) = 1.8379 + 1 = 2.8379
    torch.testing.assert_close(entropy, torch.full((3,), 2.837877), rtol=0, atol=1e-5)
    # log-prob of the mean of a unit Gaussian in 2 dims: -log(2 pi) = -1.837877
    logp, _, _ = pol.evaluate(torch.zeros(1, 5), pol.actor(torch.zeros(1, 5)).detach())
    torch.testing.assert_close(logp, torch.tensor([-1.837877]), rtol=0, atol=1e-5)


def test_discrete_act_and_evaluate_match_categorical():
    torch.manual_seed(2)
    pol = ActorCritic(OBS, DISC, PolicyConfig(hidden_sizes=[16], actor_out_gain=1.0, normalize_obs=False))
    obs = torch.randn(200, 5)
    actions, logp, _ = pol.act(obs)
    assert actions.shape == (200,) and actions.dtype == torch.int64
    assert int(actions.min()) >= 0 and int(actions.max()) < 4
    dist = torch.distributions.Categorical(logits=pol.actor(obs))
    torch.testing.assert_close(logp, dist.log_prob(actions))
    target_logp, entropy, _ = pol.evaluate(obs, actions)
    torch.testing.assert_close(target_logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    det, _, _ = pol.act(obs, deterministic=True)
    assert torch.equal(det, dist.logits.argmax(-1))


def test_orthogonal_init_gains():
    pol = ActorCritic(OBS, CONT)
    w0 = pol.actor[0].weight  # [256, 5]: columns orthonormal times sqrt(2)
    torch.testing.assert_close(w0.T @ w0, 2.0 * torch.eye(5), rtol=0, atol=1e-5)
    w_out = pol.actor[-1].weight  # [3, 256]: rows orthonormal times 0.01
    torch.testing.assert_close(w_out @ w_out.T, 1e-4 * torch.eye(3), rtol=0, atol=1e-8)
    assert pol.critic[-1].weight.norm().item() == pytest.approx(1.0, abs=1e-5)
    assert all(float(m.bias.detach().abs().max()) == 0 for m in pol.modules() if isinstance(m, torch.nn.Linear))
    assert pol.actor is not pol.critic and not set(map(id, pol.actor.parameters())) & set(
        map(id, pol.critic.parameters())
    )


def test_bad_config_is_rejected_with_a_fix():
    with pytest.raises(PolicyConfigError, match="activation"):
        ActorCritic(OBS, CONT, PolicyConfig(activation="sigmoidish"))
    with pytest.raises(PolicyConfigError, match="hidden_sizes"):
        ActorCritic(OBS, CONT, PolicyConfig(hidden_sizes=[]))


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu"])
def test_fast_inference_path_matches_modules_after_copy_and_load(activation):
    # act() runs the layers' parameters directly (no nn.Module calls): it must follow deepcopy, load_state_dict
    # and every activation exactly like the modules do.
    import copy

    torch.manual_seed(3)
    pol = ActorCritic(OBS, CONT, PolicyConfig(hidden_sizes=[16, 16], activation=activation, actor_out_gain=1.0))
    clone = copy.deepcopy(pol)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.1)
    obs = torch.randn(7, 5)
    for policy in (pol, clone):
        actions, _, values = policy.act(obs, deterministic=True)
        torch.testing.assert_close(actions, policy.action_mean(policy.actor(policy.normalizer(obs))))
        torch.testing.assert_close(values, policy.critic(policy.normalizer(obs)).squeeze(-1))
    assert not torch.allclose(pol.act(obs, deterministic=True)[0], clone.act(obs, deterministic=True)[0])
    pol.load_state_dict(clone.state_dict())
    torch.testing.assert_close(pol.act(obs, deterministic=True)[0], clone.act(obs, deterministic=True)[0])


# ----- CNN encoders ---------------------------------------------------------------------------------------------
FRAMES = Spec(shape=(4, 84, 84), dtype=torch.uint8)
PONG = Spec(shape=(), dtype=torch.int64, num_actions=6)
CNN_CFG = {
    "nature_cnn": PolicyConfig(encoder="nature_cnn", hidden_sizes=[512], activation="relu"),
    "impala_cnn": PolicyConfig(encoder="impala_cnn", hidden_sizes=[256], activation="relu"),
}


def _frames(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cnn_shapes_dtypes_and_shared_trunk(encoder):
    torch.manual_seed(0)
    pol = ActorCritic(FRAMES, PONG, CNN_CFG[encoder])
    assert pol.encoder == encoder and pol.normalizer is None  # pixels are scaled, not normalised
    obs = _frames(5)
    actions, logp, values = pol.act(obs)
    assert actions.shape == (5,) and actions.dtype == torch.int64 and 0 <= int(actions.min()) <= int(actions.max()) < 6
    assert logp.shape == (5,) and logp.dtype == torch.float32 and values.shape == (5,)
    assert pol.act(obs, with_value=False)[2] is None
    target_logp, entropy, values2 = pol.evaluate(obs, actions)
    assert target_logp.shape == entropy.shape == values2.shape == (5,)
    torch.testing.assert_close(values2, values)
    # One trunk, two linear heads: the value loss alone reaches the convolutions; the heads own nothing else.
    assert isinstance(pol.actor[0], torch.nn.Linear) and len(pol.actor) == len(pol.critic) == 1
    pol.value(obs).sum().backward()
    first_conv = next(m for m in pol.trunk.modules() if isinstance(m, torch.nn.Conv2d))
    assert first_conv.weight.grad is not None and first_conv.weight.grad.abs().sum() > 0
    assert pol.actor[0].weight.grad is None


def test_nature_cnn_is_the_papers_network():
    """Mnih et al. 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1, then 512 units; 84 -> 20 -> 9 -> 7, so 64 * 7 * 7 = 3136."""
    torch.manual_seed(0)
    pol = ActorCritic(FRAMES, PONG, CNN_CFG["nature_cnn"])
    convs = [m for m in pol.trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                          (64, (3, 3), (1, 1))]  # fmt: skip
    fc = [m for m in pol.trunk.modules() if isinstance(m, torch.nn.Linear)]
    assert [(f.in_features, f.out_features) for f in fc] == [(3136, 512)]
    # trunk: 4*32*64+32 + 32*64*16+64 + 64*64*9+64 + 3136*512+512 = 8,224 + 32,832 + 36,928 + 1,606,144
    assert sum(p.numel() for p in pol.trunk.parameters()) == 1_684_128
    # the forward written out with functional ops on the module's weights (x / 255, ReLU after every layer)
    obs = _frames(3)
    x = obs.float() / 255
    for c in convs:
        x = torch.relu(torch.nn.functional.conv2d(x, c.weight, c.bias, stride=c.stride))
    feat = torch.relu(x.flatten(1) @ fc[0].weight.T + fc[0].bias)
    logits = feat @ pol.actor[0].weight.T + pol.actor[0].bias
    torch.testing.assert_close(pol.evaluate(obs, torch.zeros(3, dtype=torch.int64))[0],
                               torch.log_softmax(logits, -1)[:, 0], rtol=1e-4, atol=1e-5)  # fmt: skip


def test_impala_cnn_is_the_papers_network():
    """Espeholt et al. 2018: 3 stacks (conv 3x3, max-pool 3x3/2, 2 residual blocks) of 16, 32, 32 channels:
    84 -> 42 -> 21 -> 11, so 32 * 11 * 11 = 3872 features into 256 units; 15 convolutions."""
    pol = ActorCritic(FRAMES, PONG, CNN_CFG["impala_cnn"])
    convs = [m for m in pol.trunk.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 15 and [c.out_channels for c in convs] == [16] * 5 + [32] * 10
    fc = [m for m in pol.trunk.modules() if isinstance(m, torch.nn.Linear)]
    assert [(f.in_features, f.out_features) for f in fc] == [(3872, 256)]


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cnn_logp_of_sampled_actions_is_log_softmax_gathered(encoder):
    torch.manual_seed(1)
    pol = ActorCritic(FRAMES, PONG, dataclasses.replace(CNN_CFG[encoder], actor_out_gain=1.0))
    obs = _frames(64, seed=1)
    actions, logp, _ = pol.act(obs)
    with torch.no_grad():
        log_probs = torch.log_softmax(pol.actor(pol.trunk(obs)), dim=-1)  # the modules, not act's fast path
    torch.testing.assert_close(logp, log_probs.gather(1, actions[:, None]).squeeze(1), rtol=1e-5, atol=1e-5)
    assert len(set(actions.tolist())) > 1  # gain 1: the samples are not all one action
    target_logp, entropy, _ = pol.evaluate(obs, actions)
    torch.testing.assert_close(target_logp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, -(log_probs.exp() * log_probs).sum(-1), rtol=1e-5, atol=1e-5)
    det, det_logp, _ = pol.act(obs, deterministic=True)
    assert torch.equal(det, log_probs.argmax(-1))


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cnn_uint8_frames_equal_float_frames_over_255(encoder):
    torch.manual_seed(2)
    pol = ActorCritic(FRAMES, PONG, dataclasses.replace(CNN_CFG[encoder], actor_out_gain=1.0))
    obs = _frames(6, seed=2)
    scaled = obs.float() / 255
    a_u8, logp_u8, v_u8 = pol.act(obs, deterministic=True)
    a_f, logp_f, v_f = pol.act(scaled, deterministic=True)
    assert torch.equal(a_u8, a_f)
    torch.testing.assert_close(logp_u8, logp_f)
    torch.testing.assert_close(v_u8, v_f)
    torch.testing.assert_close(pol.evaluate(obs, a_u8)[0], pol.evaluate(scaled, a_u8)[0])
    # and the scale matters: raw 0-255 floats give other outputs
    assert not torch.allclose(pol.value(obs.float()), v_u8)


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cnn_trains_under_bf16_autocast(encoder):
    """The learner's bf16 option autocasts forward and backward (on CUDA; here CPU autocast, the same dtype rules):
    outputs stay float32 and near the float32 ones, and every parameter gets a finite gradient."""
    torch.manual_seed(3)
    pol = ActorCritic(FRAMES, PONG, CNN_CFG[encoder])
    obs, actions = _frames(4, seed=3), torch.tensor([0, 1, 2, 5])
    ref = pol.evaluate(obs, actions)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logp, entropy, values = pol.evaluate(obs, actions)
        assert pol.trunk(obs).dtype == torch.bfloat16  # autocast is really on
        loss = -logp.mean() - 0.01 * entropy.mean() + 0.5 * values.square().mean()
    assert logp.dtype == entropy.dtype == values.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: ~0.4% relative error per op
    torch.testing.assert_close(logp, ref[0], rtol=0.05, atol=0.05)
    torch.testing.assert_close(values, ref[2], rtol=0.05, atol=0.05)
    loss.backward()
    for name, p in pol.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cpu_bf16_trunk_runs_in_bf16_and_stays_near_float32(encoder):
    """policy.cpu_bf16=always: the trunk's convolutions and linear layers compute in bf16 (seen by a hook), the
    heads read float32 features, the outputs are float32 and within bf16's precision of the same weights in float32;
    the sampler's act and the learner's evaluate agree on a batch; every parameter stays float32 with a finite
    gradient."""
    torch.manual_seed(5)
    cfg = dataclasses.replace(CNN_CFG[encoder], actor_out_gain=1.0)
    ref = ActorCritic(FRAMES, PONG, cfg)
    pol = ActorCritic(FRAMES, PONG, dataclasses.replace(cfg, cpu_bf16="always"))
    pol.load_state_dict(ref.state_dict())
    assert pol.cpu_bf16 and not ref.cpu_bf16
    seen = []
    conv = next(m for m in pol.trunk.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    obs = _frames(32, seed=5)
    actions, logp, values = pol.act(obs)
    assert seen == [torch.bfloat16]
    assert pol._features(obs).dtype == torch.float32  # what the heads read
    assert logp.dtype == values.dtype == torch.float32
    target_logp, entropy, values2 = pol.evaluate(obs, actions)
    torch.testing.assert_close(target_logp, logp, rtol=1e-5, atol=1e-5)  # same batch, same bf16 trunk
    torch.testing.assert_close(values2, values, rtol=1e-5, atol=1e-5)
    ref_logp, ref_entropy, ref_values = ref.evaluate(obs, actions)
    # bf16 keeps 8 bits of mantissa (~0.4% per op); measured here: |logp - ref| <= ~0.02
    torch.testing.assert_close(target_logp, ref_logp, rtol=0.05, atol=0.05)
    torch.testing.assert_close(entropy, ref_entropy, rtol=0.05, atol=0.05)
    torch.testing.assert_close(values2, ref_values, rtol=0.05, atol=0.05)
    assert not torch.equal(target_logp, ref_logp)  # really another precision, not the float32 path
    (-target_logp.mean() - 0.01 * entropy.mean() + 0.5 * values2.square().mean()).backward()
    for name, p in pol.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and torch.isfinite(p.grad).all(), name


def test_cpu_bf16_auto_follows_the_cpu_flags(tmp_path, monkeypatch):
    from sample_fast import encoders

    def cpuinfo(flags: str) -> Path:
        path = tmp_path / f"cpuinfo_{len(list(tmp_path.iterdir()))}"
        path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\n")
        return path

    assert encoders.cpu_has_native_bf16(cpuinfo("fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni"))
    assert encoders.cpu_has_native_bf16(cpuinfo("fpu avx512f amx_tile amx_bf16 amx_int8"))
    assert not encoders.cpu_has_native_bf16(cpuinfo("fpu avx2 avx512f avx512bw avx512_vnni"))  # emulated bf16 only
    assert not encoders.cpu_has_native_bf16(tmp_path / "missing")
    for native in (True, False):
        monkeypatch.setattr(encoders, "cpu_has_native_bf16", lambda native=native: native)
        cnn = CNN_CFG["nature_cnn"]
        assert ActorCritic(FRAMES, PONG, dataclasses.replace(cnn, cpu_bf16="auto")).cpu_bf16 is native
        assert ActorCritic(FRAMES, PONG, dataclasses.replace(cnn, cpu_bf16="always")).cpu_bf16
        assert not ActorCritic(FRAMES, PONG, dataclasses.replace(cnn, cpu_bf16="never")).cpu_bf16
        assert not ActorCritic(OBS, DISC, PolicyConfig(cpu_bf16="auto")).cpu_bf16  # an MLP ignores auto
    with pytest.raises(PolicyConfigError, match="cpu_bf16=always applies to CNN encoders only"):
        ActorCritic(OBS, DISC, PolicyConfig(cpu_bf16="always"))
    with pytest.raises(PolicyConfigError, match="cpu_bf16 'fast' unknown; choose one of: auto, always, never"):
        ActorCritic(FRAMES, PONG, dataclasses.replace(CNN_CFG["nature_cnn"], cpu_bf16="fast"))


def test_cnn_weights_round_trip_through_state_dict_and_deepcopy():
    import copy

    torch.manual_seed(4)
    a = ActorCritic(FRAMES, PONG, CNN_CFG["nature_cnn"])
    b = ActorCritic(FRAMES, PONG, CNN_CFG["nature_cnn"])
    obs = _frames(3, seed=4)
    assert not torch.allclose(a.value(obs), b.value(obs))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.value(obs), a.value(obs))
    torch.testing.assert_close(copy.deepcopy(a).value(obs), a.value(obs))
    assert not any(k.startswith("normalizer") for k in a.state_dict())


def test_auto_encoder_follows_the_observations():
    assert ActorCritic(OBS, DISC).encoder == "mlp" and ActorCritic(OBS, DISC).trunk is None
    assert ActorCritic(FRAMES, PONG, PolicyConfig(hidden_sizes=[32])).encoder == "nature_cnn"
    small = Spec(shape=(1, 12, 12), dtype=torch.uint8)  # too small for Nature's 8x8/4 + 4x4/2 + 3x3 convolutions
    assert ActorCritic(small, PONG, PolicyConfig(hidden_sizes=[32])).encoder == "impala_cnn"
    # float frames are not pixels to auto (an MLP), but an explicit CNN takes them
    float_frames = Spec(shape=(4, 84, 84), dtype=torch.float32)
    assert ActorCritic(float_frames, PONG, PolicyConfig(hidden_sizes=[8])).encoder == "mlp"


@pytest.mark.parametrize(
    "obs_spec, act_spec, cfg, message",
    [
        (OBS, DISC, PolicyConfig(encoder="nature_cnn"), r"encoder=nature_cnn needs image observations \[C, H, W\]; "
         r"this env's are \(5,\) torch.float32: use encoder=mlp"),
        (Spec(shape=(1, 12, 12), dtype=torch.uint8), PONG, PolicyConfig(encoder="nature_cnn"),
         r"needs frames of at least 36x36 .* these are 12x12: use encoder=impala_cnn"),
        (FRAMES, PONG, PolicyConfig(encoder="resnet"), r"encoder 'resnet' unknown; choose one of: auto, mlp, "),
        (FRAMES, PONG, PolicyConfig(init_log_std=-1.0), r"init_log_std only applies to continuous .*drop init_log_std"),
        (OBS, DISC, PolicyConfig(squash_mean=False), r"squash_mean only applies to continuous"),
        (FRAMES, PONG, PolicyConfig(encoder="mlp", normalize_obs=False),
         r"encoder=mlp on uint8 frames \[4, 84, 84\] needs normalize_obs=true"),
        (Spec(shape=(4, 84, 84), dtype=torch.float32), PONG, PolicyConfig(encoder="nature_cnn", normalize_pixels=True),
         r"normalize_pixels needs uint8 frames .* these are torch.float32: drop normalize_pixels"),
    ],
)  # fmt: skip
def test_policy_settings_that_do_not_fit_the_specs_are_rejected(obs_spec, act_spec, cfg, message):
    with pytest.raises(PolicyConfigError, match=message):
        ActorCritic(obs_spec, act_spec, cfg)


def test_mlp_on_frames_with_the_normaliser_works():
    """``policy.encoder=mlp`` on Atari frames is allowed (with normalize_obs): it flattens the 28,224 pixels."""
    # normalize_pixels (the Atari presets' value) is the CNN's: the MLP keeps its own normaliser (floor 1e-8).
    pol = ActorCritic(FRAMES, PONG, PolicyConfig(encoder="mlp", hidden_sizes=[16], normalize_pixels=True))
    assert pol.normalizer is not None and pol.normalizer.eps == 1e-8
    obs = _frames(4)
    pol.update_normalizer(obs)
    actions, logp, _ = pol.act(obs)
    assert pol.trunk is None and pol.actor[0].in_features == 4 * 84 * 84 and actions.shape == (4,)
    torch.testing.assert_close(pol.evaluate(obs, actions)[0], logp)


def test_chunked_moments_equal_the_float64_reference():
    """The normaliser's batch moments are merged over row chunks (a pixel batch as float64 would be ~460 MB)."""
    from sample_fast.policy import _moments

    g = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (300, 500), generator=g, dtype=torch.uint8)  # float32 chunks of 256 + 44 rows
    pixels[:, :50] = 200  # constant columns: variance exactly 0
    pixels[:, 50:60] = 255  # the largest per-chunk sum of squares, 256 * 255^2, must still be exact
    floats = torch.randn(300, 500, generator=g) * 3 + 100  # float64 chunks merged by Chan's formula
    for x in (pixels, floats):
        mean, var = _moments(x, chunk_bytes=8 * 500 * 7)  # floats: 7 rows per chunk, the last one short
        ref = x.numpy().astype(np.float64)
        np.testing.assert_allclose(mean.numpy(), ref.mean(0), rtol=1e-12)
        np.testing.assert_allclose(var.numpy(), ref.var(0), rtol=1e-9, atol=1e-12)
    mean, var = _moments(pixels)
    assert float(var[:60].abs().max()) == 0.0 and bool((mean[50:60] == 255.0).all())


def test_uint8_normalisation_is_the_same_in_every_layout():
    """``forward_uint8`` on ``[N, dim]``, on NCHW and on channels_last ``[N, C, H, W]`` frames: the float64
    reference in each, the 4-D output in the input's memory layout."""
    from sample_fast.policy import RunningNormalizer

    norm = RunningNormalizer(4 * 6 * 5, clip=1.0, eps=1e-5 * 255.0**2)
    frames = _frames(8, seed=4)[:, :, :6, :5].contiguous()  # [8, 4, 6, 5]
    norm.update(frames.reshape(8, -1)[:5])  # statistics of 5 of the frames: many values clip at +-1
    ref = frames.reshape(8, -1).numpy().astype(np.float64)
    expected = np.clip((ref - norm.mean.numpy()) / np.sqrt(norm.var.numpy() + 1e-5 * 255.0**2), -1.0, 1.0)
    assert 0.05 < np.mean(np.abs(expected) == 1.0) < 0.95
    flat = norm.forward_uint8(frames.reshape(8, -1))
    nchw = norm.forward_uint8(frames)
    cl = norm.forward_uint8(frames.contiguous(memory_format=torch.channels_last))
    assert nchw.is_contiguous() and cl.is_contiguous(memory_format=torch.channels_last) and cl.dtype == torch.float32
    for out in (flat, nchw, cl):
        np.testing.assert_allclose(out.reshape(8, -1).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("encoder", ["nature_cnn", "impala_cnn"])
def test_cnn_normalize_pixels_feeds_the_trunk_per_pixel_standardised_frames(encoder):
    """``normalize_pixels`` (Sample Factory's normalize_input): each pixel minus its running mean over its running
    std (floor 1e-5 on the [0, 1] scale), clipped to obs_clip, is what the convolutions see; the statistics are
    buffers that travel with the weights."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(CNN_CFG[encoder], normalize_pixels=True, obs_clip=5.0)
    pol = ActorCritic(FRAMES, PONG, cfg)
    frames = _frames(6, seed=1)
    frames[:, :, :40] = 87  # a static background: zero variance there
    pol.update_normalizer(frames.reshape(2, 3, 4, 84, 84))  # [T, B, ...] is flattened
    ref = frames.numpy().reshape(6, -1).astype(np.float64)
    expected = np.clip((ref - ref.mean(0)) / np.sqrt(ref.var(0) + 1e-5 * 255.0**2), -5.0, 5.0)
    obs = frames[:2]
    seen = {}
    hook = pol.trunk.register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    pol.value(obs)
    hook.remove()
    x = seen["x"]
    assert x.dtype == torch.float32 and x.shape == (2, 4, 84, 84)
    assert x.is_contiguous(memory_format=torch.channels_last)  # normalised in the trunk's layout: no float copy
    np.testing.assert_allclose(x.reshape(2, -1).numpy(), expected[:2], atol=1e-5)
    assert float(x[:, :, :40].abs().max()) < 1e-5  # static background: ~0 in float32 rounding, not 87 / 255
    other = ActorCritic(FRAMES, PONG, cfg)
    other.load_state_dict(pol.state_dict())
    torch.testing.assert_close(other.value(obs), pol.value(obs))
    plain = ActorCritic(FRAMES, PONG, CNN_CFG[encoder])  # the same weights on frames / 255
    plain.load_state_dict({k: v for k, v in pol.state_dict().items() if not k.startswith("normalizer.")})
    assert not torch.allclose(plain.value(obs), pol.value(obs), atol=1e-3)
