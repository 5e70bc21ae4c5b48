"""Aggregation and PPO parity with OpenRLHF's own loss.py, and data-parallel sharding invariance.

OpenRLHF's loss.py is loaded from its file (tests/helpers/openrlhf_files.py)."""

import types

import pytest
import torch
from openrlhf_files import openrlhf_models_file

from rpg_openrlhf.core import LossConfig, aggregate, compute_loss

F64 = torch.float64


@pytest.fixture(scope="module")
def orl() -> types.ModuleType:
    return openrlhf_models_file("loss")


def batch(seed: int = 0, b: int = 6, t: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g, dtype=F64)
    mask = (torch.rand(b, t, generator=g) > 0.3).to(F64)
    mask[2] = 0.0  # a fully masked sequence
    mask[0, 0] = 1.0
    return loss, mask


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("mode, token_level", [("token-mean", True), ("seq-mean-token-mean", False)])
def test_aggregate_matches_openrlhf(orl, mode, token_level, normalized):
    loss, mask = batch()
    norm = {}
    if normalized:  # a rank's share of a global batch: any totals, dp_size 4
        norm = dict(
            dp_size=4, batch_num_tokens=torch.tensor(37.0, dtype=F64), global_batch_size=torch.tensor(11.0)
        )
    want = orl.aggregate_loss(loss, mask, token_level_loss=token_level, **norm)
    got = aggregate(loss, mask, mode, **norm)
    assert torch.equal(got, want.to(got.dtype))


def test_seq_mean_token_sum_by_hand():
    loss = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0], [64.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == (3.0 + 64.0) / 2
    got = aggregate(loss, mask, "seq-mean-token-sum", dp_size=2, global_batch_size=4.0)
    assert got.item() == (3.0 + 64.0) / 4 * 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_compute_loss_and_gradient_are_invariant_to_sharding(mode):
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(6, 5, generator=g, dtype=F64)
    logp = (old + 0.3 * torch.randn(6, 5, generator=g, dtype=F64)).requires_grad_()
    adv, mask = torch.randn(6, generator=g, dtype=F64), batch(seed=3)[1]
    config = LossConfig(beta=0.1, clip_c=3.0, aggregation=mode)
    full, _ = compute_loss("urkl", "reinforce_clip", logp, old, adv, mask, config=config)
    totals = dict(batch_num_tokens=mask.sum(), global_batch_size=(mask.sum(-1) > 0).sum())
    ranks = [compute_loss("urkl", "reinforce_clip", logp[s], old[s], adv[s], mask[s], config=config, dp_size=2,
                          **totals)[0] for s in (slice(0, 3), slice(3, None))]  # fmt: skip
    torch.testing.assert_close((ranks[0] + ranks[1]) / 2, full)  # DDP averages over the 2 ranks
    local = [compute_loss("urkl", "reinforce_clip", logp[s], old[s], adv[s], mask[s], config=config)[0]
             for s in (slice(0, 3), slice(3, None))]  # fmt: skip
    assert not torch.allclose((local[0] + local[1]) / 2, full)  # each rank's own mean would not be
    g_full, g_ranks = (torch.autograd.grad(x, logp)[0] for x in (full, (ranks[0] + ranks[1]) / 2))
    torch.testing.assert_close(g_ranks, g_full)


@pytest.mark.parametrize("dual_clip", [None, 1.5, 1.1])  # 1.1 < 1 + eps_high: c bounds A < 0 only
@pytest.mark.parametrize("mode, token_level", [("token-mean", True), ("seq-mean-token-mean", False)])
def test_ppo_reward_term_matches_openrlhf_policy_loss(orl, dual_clip, mode, token_level):
    """grpo_kl with beta = 0 is OpenRLHF's (dual-clip) PPO loss: same value, gradient, clip ratio."""
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(8, 9, generator=g, dtype=F64) * 2
    logp = (old + 0.6 * torch.randn(8, 9, generator=g, dtype=F64)).requires_grad_()
    adv = torch.randn(8, 9, generator=g, dtype=F64)
    mask = (torch.rand(8, 9, generator=g) > 0.2).to(F64)
    policy_loss = orl.PolicyLoss(
        clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=dual_clip, token_level_loss=token_level
    )
    want, clip_ratio, *_ = policy_loss(logp, old, adv, action_mask=mask)
    config = LossConfig(beta=0.0, eps_low=0.2, eps_high=0.28, clip_c=dual_clip, aggregation=mode)
    got, metrics = compute_loss("grpo_kl", "differentiable", logp, old, adv, mask, config=config)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    g_got, g_want = (torch.autograd.grad(x, logp)[0] for x in (got, want))
    torch.testing.assert_close(g_got, g_want, rtol=1e-14, atol=1e-14)
    assert metrics["clip_frac_low"] + metrics["clip_frac_high"] == pytest.approx(clip_ratio.item())
    assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
    assert (metrics["clip_frac_dual"] > 0) == (dual_clip is not None)


def test_sequence_weights_normalize_by_sequences_even_with_a_token_count() -> None:
    """weight_level="sequence" gives one loss per sequence: OpenRLHF's token count must not divide it."""
    from rpg_openrlhf.core import LossConfig, compute_loss

    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    old = logp - 0.1 * torch.rand(4, 6, generator=g, dtype=torch.float64)
    adv, mask = torch.randn(4, generator=g, dtype=torch.float64), torch.ones(4, 6)
    cfg = LossConfig(weight_level="sequence", beta=0.1)
    local, _ = compute_loss("urkl", "reinforce", logp, old, adv, mask, config=cfg)
    normed, _ = compute_loss(
        "urkl", "reinforce", logp, old, adv, mask, config=cfg, batch_num_tokens=24.0, global_batch_size=4.0
    )
    torch.testing.assert_close(normed, local)
