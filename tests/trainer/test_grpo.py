"""GRPO math against hand-computed values."""

import math

import pytest
import torch

from trainer.grpo import LossConfig, aggregate, group_advantages, grpo_loss, k3_kl

L = math.log
NAN = float("nan")


def test_group_advantages_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv = group_advantages(rewards, groups, eps=0.0)
    # group 0: mean 0.5, sample std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.8660254
    assert adv[:4].tolist() == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254], abs=1e-6)
    # group 1: identical rewards -> no signal; group 2: a group of one -> 0
    assert adv[4:].tolist() == [0.0, 0.0, 0.0]
    adv_eps = group_advantages(rewards, groups, eps=1e-4)
    assert adv_eps[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-4), rel=1e-6)
    assert group_advantages(rewards, groups, scale_by_std=False)[:4].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_group_advantages_ignore_order():
    rewards = torch.tensor([3.0, 1.0, 0.0, 2.0])
    groups = torch.tensor([1, 0, 1, 0])
    adv = group_advantages(rewards, groups, scale_by_std=False)
    assert adv.tolist() == [1.5, -0.5, -1.5, 0.5]


def _batch():
    # seq0: A=+1, two generated tokens with ratios 1.2 and 0.8 (inside the clip range)
    # seq1: A=-1, one generated token with ratio 1.5 (outside: min picks the unclipped -1.5)
    old = torch.tensor([[L(0.5), L(0.5), NAN], [L(0.5), NAN, NAN]])
    new = torch.tensor([[L(0.6), L(0.4), 0.3], [L(0.75), -2.0, 0.1]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    return new, old, mask, adv


def test_clipped_loss_sequence_norm():
    new, old, mask, adv = _batch()
    loss, stats = grpo_loss(new, old, adv, mask, LossConfig(norm="sequence"))
    # seq0: mean(-1.2, -0.8) = -1.0; seq1: -min(-1.5, -1.2) = 1.5; mean over sequences = 0.25
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx((1.2 + 0.8 + 1.5) / 3, abs=1e-6)
    loss.backward()
    g = new.grad
    assert torch.isfinite(g).all()
    assert g[0, 2] == 0 and g[1, 1] == 0 and g[1, 2] == 0  # mask-0 positions get no gradient
    # d/dlogp of -A*ratio/n_tokens/n_seq: seq0 tok0 = -1.2/2/2
    assert g[0, 0].item() == pytest.approx(-0.3, abs=1e-6)
    assert g[1, 0].item() == pytest.approx(1.5 / 1 / 2, abs=1e-6)


def test_clipped_loss_token_norm():
    new, old, mask, adv = _batch()
    loss, _ = grpo_loss(new, old, adv, mask, LossConfig(norm="token"))
    assert loss.item() == pytest.approx((-1.2 - 0.8 + 1.5) / 3, abs=1e-6)


def test_clipping_kills_gradient_outside_trust_region():
    # A=+1, ratio 1.5 > 1+eps: the clipped branch is the min, so no gradient.
    # A=-1, ratio 0.5 < 1-eps: -min(-0.5, -0.8) = 0.8, clipped, no gradient either.
    old = torch.tensor([[L(0.5)], [L(0.5)]])
    new = torch.tensor([[L(0.75)], [L(0.25)]], requires_grad=True)
    mask = torch.ones(2, 1, dtype=torch.long)
    loss, stats = grpo_loss(new, old, torch.tensor([1.0, -1.0]), mask, LossConfig(norm="token"))
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    assert stats["clip_frac"] == 1.0
    loss.backward()
    assert new.grad.abs().max().item() == 0.0


def test_asymmetric_clip():
    old = torch.tensor([[L(0.5)]])
    new = torch.tensor([[L(0.7)]])  # ratio 1.4
    cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, norm="token")
    loss, _ = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.28, abs=1e-6)


def test_k3_kl_hand_value_and_in_loss():
    logp = torch.tensor([[L(0.5)]])
    ref = torch.tensor([[L(0.25)]])
    # exp(ln .5) - ln .5 - 1 = 0.5 + 0.693147 - 1
    assert k3_kl(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert k3_kl(logp, logp).item() == 0.0
    cfg = LossConfig(beta=0.1, norm="token")
    loss, stats = grpo_loss(logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), cfg, ref)
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-6)
    assert stats["kl"] == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_microbatch_normalizers_match_full_batch():
    torch.manual_seed(0)
    new = torch.randn(4, 5)
    old = new + 0.05 * torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    adv = torch.tensor([0.5, -1.0, 2.0, -0.3])
    for norm in ("sequence", "token"):
        cfg = LossConfig(norm=norm)
        full, _ = grpo_loss(new, old, adv, mask, cfg)
        parts = sum(grpo_loss(new[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], cfg,
                              total_sequences=4, total_tokens=int(mask.sum()))[0] for i in (0, 2))
        assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_aggregate_rejects_unknown_norm():
    with pytest.raises(ValueError, match="unknown loss normalization"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "bogus")
