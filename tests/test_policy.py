"""Tests of ``sample_fast.policy``: the running normaliser against numpy, log-probs and entropies against
torch.distributions and hand values, shapes/dtypes of ``act``, init, and state_dict round trips."""

from __future__ import annotations

import math

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
