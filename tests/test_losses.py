"""Per-sample ``weights`` of ``sample_fast.losses`` (replay's IS weights): unit weights are the plain loss exactly,
a hand-computed two-sample case, the count (not sum of weights) normalisation, and zero weights removing a sample.
The unweighted terms have their hand-computed tests in tests/test_learner.py."""

from __future__ import annotations

import math

import pytest
import torch

from sample_fast.losses import approx_kl, masked_mean, ppo_clip_loss, value_loss

N = 64


def random_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # log-ratios of ~N(0, 0.5) put some ratios outside [0.8, 1.2], so both clip branches are taken.
    behavior_logp = torch.randn(N, generator=gen)
    return {
        "target_logp": behavior_logp + 0.5 * torch.randn(N, generator=gen),
        "behavior_logp": behavior_logp,
        "advantages": torch.randn(N, generator=gen),
        "values": torch.randn(N, generator=gen),
        "value_targets": torch.randn(N, generator=gen),
        "old_values": torch.randn(N, generator=gen),
        "entropy": torch.rand(N, generator=gen),
    }


def all_terms(x: dict[str, torch.Tensor], mask, weights, dual_clip, value_clip) -> list[torch.Tensor]:
    """Every weighted term the learner computes, in its order: policy loss, clip_frac, ratio, value, entropy, KL."""
    policy, clip_frac, ratio = ppo_clip_loss(
        x["target_logp"], x["behavior_logp"], x["advantages"], 0.2, mask, dual_clip=dual_clip, weights=weights
    )
    v = value_loss(x["values"], x["value_targets"], x["old_values"], value_clip, mask, weights=weights)
    return [policy, clip_frac, ratio, v, masked_mean(x["entropy"], mask, weights),
            approx_kl(x["target_logp"], x["behavior_logp"], mask, weights)]  # fmt: skip


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("value_clip", [None, 0.3])
def test_unit_weights_equal_the_plain_loss_exactly(with_mask, dual_clip, value_clip):
    x = random_inputs(seed=int(with_mask) + 2 * (dual_clip is not None) + 4 * (value_clip is not None))
    mask = torch.rand(N, generator=torch.Generator().manual_seed(7)) > 0.3 if with_mask else None
    if mask is not None:
        x["advantages"] = torch.where(mask, x["advantages"], float("nan"))  # masked-out entries may hold NaN
    plain = all_terms(x, mask, None, dual_clip, value_clip)
    unit = all_terms(x, mask, torch.ones(N), dual_clip, value_clip)
    for name, p, u in zip(("policy", "clip_frac", "ratio", "value", "entropy", "kl"), plain, unit, strict=True):
        assert torch.isfinite(p).all(), name
        assert torch.equal(p, u), f"{name}: {p} != {u}"  # 1 * x == x exactly, then the same reduction


def test_unit_weights_give_the_plain_gradient():
    x = random_inputs()
    grads = []
    for weights in (None, torch.ones(N)):
        target_logp = x["target_logp"].clone().requires_grad_(True)
        values = x["values"].clone().requires_grad_(True)
        loss = ppo_clip_loss(target_logp, x["behavior_logp"], x["advantages"], 0.2, dual_clip=3.0, weights=weights)[0]
        loss = loss + value_loss(values, x["value_targets"], x["old_values"], 0.3, weights=weights)
        loss = loss + approx_kl(target_logp, x["behavior_logp"], weights=weights)
        grads.append(torch.autograd.grad(loss, (target_logp, values)))
    for plain, unit in zip(*grads, strict=True):
        assert torch.equal(plain, unit)


def test_two_samples_hand_computed():
    weights = torch.tensor([2.0, 0.5])
    # masked_mean: sum(w x) / N = (2 * 1 + 0.5 * 2) / 2 = 1.5 (normalised by the count, not by sum(w) = 2.5 -> 1.2)
    assert masked_mean(torch.tensor([1.0, 2.0]), None, weights).item() == pytest.approx(1.5)
    # PPO: r = [1.5, 0.5], A = [1, -2], clip_eps 0.2 -> clip(r) = [1.2, 0.8]
    # min(r A, clip(r) A) = [min(1.5, 1.2), min(-1, -1.6)] = [1.2, -1.6]
    # weighted: -(2 * 1.2 + 0.5 * -1.6) / 2 = -(2.4 - 0.8) / 2 = -0.8   (unweighted: -(1.2 - 1.6) / 2 = 0.2)
    target_logp = torch.log(torch.tensor([1.5, 0.5]))
    advantages = torch.tensor([1.0, -2.0])
    loss, clip_frac, _ = ppo_clip_loss(target_logp, torch.zeros(2), advantages, 0.2, weights=weights)
    assert loss.item() == pytest.approx(-0.8)
    assert clip_frac.item() == pytest.approx(1.0)  # |r - 1| = 0.5 > 0.2 for both; clip_frac is unweighted
    assert ppo_clip_loss(target_logp, torch.zeros(2), advantages, 0.2)[0].item() == pytest.approx(0.2)
    # value: V = [1, 2], vs = [0, 4] -> (V - vs)^2 = [1, 4]; 0.5 * (2 * 1 + 0.5 * 4) / 2 = 0.5 * 4 / 2 = 1.0
    assert value_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), weights=weights).item() == pytest.approx(1.0)
    # value clip 0.5 around V_old = [0.8, 1.0]: V_clip = [1.0 (0.8 + 0.2), 1.5] -> (V_clip - vs)^2 = [1, 6.25]
    # max per sample = [1, 6.25]; 0.5 * (2 * 1 + 0.5 * 6.25) / 2 = 0.5 * 5.125 / 2 = 1.28125
    v = value_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([0.8, 1.0]), 0.5, weights=weights)
    assert v.item() == pytest.approx(1.28125)
    # k3 KL with r = [1, 2]: per sample (r - 1) - log r = [0, 1 - log 2]; (2 * 0 + 0.5 * (1 - log 2)) / 2
    kl = approx_kl(torch.tensor([0.0, math.log(2.0)]), torch.zeros(2), weights=weights)
    assert kl.item() == pytest.approx(0.25 * (1.0 - math.log(2.0)))


def test_weights_with_a_mask_average_over_the_selected_count():
    # mask [T, F, T], weights [2, 100, 0.5], x = [1, NaN, 2]: (2 * 1 + 0.5 * 2) / 2 selected = 1.5; the masked-out
    # sample neither counts nor poisons the sum with its NaN, whatever its weight.
    x = torch.tensor([1.0, float("nan"), 2.0])
    mask = torch.tensor([True, False, True])
    assert masked_mean(x, mask, torch.tensor([2.0, 100.0, 0.5])).item() == pytest.approx(1.5)
    # PPO on the same layout: r = 1 everywhere, A = [1, NaN, -2] -> -(2 * 1 + 0.5 * -2) / 2 = -0.5
    loss, _, _ = ppo_clip_loss(torch.zeros(3), torch.zeros(3), x * torch.tensor([1.0, 1.0, -1.0]), 0.2, mask,
                               weights=torch.tensor([2.0, 100.0, 0.5]))  # fmt: skip
    assert loss.item() == pytest.approx(-0.5)


@pytest.mark.parametrize("with_mask", [False, True])
def test_a_zero_weight_makes_the_loss_independent_of_that_sample(with_mask):
    x = random_inputs(seed=3)
    mask = torch.rand(N, generator=torch.Generator().manual_seed(5)) > 0.3 if with_mask else None
    k = 11  # the zero-weighted sample (selected by the mask, so only its weight removes it)
    if mask is not None:
        mask[k] = True
    weights = torch.rand(N, generator=torch.Generator().manual_seed(6)) + 0.5
    weights[k] = 0.0
    other = {key: value.clone() for key, value in x.items()}
    for value in other.values():  # sample k's every input changed to other finite values
        value[k] = value[k] * -3.0 + 5.0
    base = all_terms(x, mask, weights, 3.0, 0.3)
    changed = all_terms(other, mask, weights, 3.0, 0.3)
    for name, b, c in zip(("policy", "value", "entropy", "kl"), (base[0], *base[3:]), (changed[0], *changed[3:]),
                          strict=True):  # fmt: skip
        torch.testing.assert_close(b, c, rtol=0, atol=1e-7, msg=name)
    # and the gradient with respect to sample k's log-prob and value is exactly zero; the others' is not
    target_logp = x["target_logp"].clone().requires_grad_(True)
    values = x["values"].clone().requires_grad_(True)
    loss = ppo_clip_loss(target_logp, x["behavior_logp"], x["advantages"], 0.2, mask, dual_clip=3.0, weights=weights)
    loss = loss[0] + value_loss(values, x["value_targets"], x["old_values"], 0.3, mask, weights=weights)
    loss = loss + approx_kl(target_logp, x["behavior_logp"], mask, weights)
    grad_logp, grad_v = torch.autograd.grad(loss, (target_logp, values))
    assert grad_logp[k] == 0 and grad_v[k] == 0
    assert (grad_logp != 0).sum() > N // 3 and (grad_v != 0).sum() > N // 3


def test_weights_are_constants():
    # IS weights carry no gradient into whatever produced them (Schaul et al. 2016 treat them as constants).
    weights = torch.tensor([2.0, 0.5], requires_grad=True)
    target_logp = torch.zeros(2, requires_grad=True)
    loss = ppo_clip_loss(target_logp, torch.zeros(2), torch.ones(2), 0.2, weights=weights)[0]
    loss = loss + value_loss(target_logp, torch.ones(2), weights=weights) + approx_kl(target_logp, torch.zeros(2),
                                                                                    weights=weights)  # fmt: skip
    loss.backward()
    assert weights.grad is None and target_logp.grad is not None
