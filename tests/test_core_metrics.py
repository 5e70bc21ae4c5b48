"""A loss reports what it measured (core.Measured), and only that: a variant registered here gets
its own KL and clip fractions back from compute_loss, and a variant that reports nothing gets the
weight statistics alone, with no KL recomputed for it and no clip fractions of 0 (issue #13).
Expected values are formulas written here, on the inputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_core_losses import random_batch

from rpg_openrlhf.core import LOSSES, LossConfig, Measured, compute_loss, register_loss, token_losses
from rpg_openrlhf.core.losses import PolicyTerms, ppo_surrogate

CFG = LossConfig(beta=0.1, eps_low=0.2, eps_high=0.28, clip_c=3.0)  # token-mean
CLIP_KEYS = {"clip_frac_low", "clip_frac_high", "clip_frac_dual"}


def batch() -> dict[str, torch.Tensor]:
    x = random_batch(seed=3, b=4, t=9, spread=0.8)
    del x["ref_logp"]  # pi_ref = pi_old
    return x


@pytest.fixture
def registered():
    """register_loss for the test's own variants, removed again afterwards."""
    keys = []

    def register(name: str, style: str):
        keys.append((name, style))
        return register_loss(name, style)

    yield register
    for key in keys:
        LOSSES.pop(key, None)


def test_a_registered_variant_reports_its_own_kl_and_clip(registered):
    @registered("urkl", "test_own_metrics")
    def urkl_own_metrics(t: PolicyTerms):
        """L = PPO(w, A) on a tighter window (0.9, 1.1); reports KL = mean (log w)^2 (its own)."""
        loss, measured = ppo_surrogate(t, t.w, t.adv)
        return loss, measured | Measured(kl=t.log_w.detach() ** 2, extra={"adv_max": t.adv.max()})

    with pytest.raises(ValueError, match=r"^name:.*already registered"):
        register_loss("urkl", "test_own_metrics")(urkl_own_metrics)
    x = batch()
    cfg = LossConfig(beta=0.1, eps_low=0.1, eps_high=0.1, clip_c=3.0)
    _, metrics = compute_loss("urkl", "test_own_metrics", config=cfg, **x)

    m = x["action_mask"] > 0
    log_w = (x["logp"] - x["old_logp"]).detach()
    w, adv = log_w.exp()[m], x["advantages"][m]
    assert metrics["kl"] == pytest.approx((log_w[m] ** 2).mean().item())  # not URKL's D_t
    urkl = (log_w.exp() * log_w - log_w.exp() + 1)[m].mean().item()
    assert metrics["kl"] != pytest.approx(urkl)
    assert metrics["clip_frac_low"] == pytest.approx(((adv < 0) & (w < 0.9)).double().mean().item())
    assert metrics["clip_frac_high"] == pytest.approx(((adv > 0) & (w > 1.1)).double().mean().item())
    assert metrics["clip_frac_dual"] == pytest.approx(((adv < 0) & (w > 3.0)).double().mean().item())
    assert metrics["clip_frac_high"] > 0 and metrics["clip_frac_low"] > 0
    assert metrics["adv_max"] == x["advantages"].max().item()
    assert metrics["w_mean"] == pytest.approx(w.mean().item())


def test_a_variant_that_reports_nothing_gets_no_made_up_kl_or_clip(registered):
    @registered("urkl", "test_bare")
    def urkl_bare(t: PolicyTerms) -> torch.Tensor:
        """L = -clip(w, 0.8, 1.28) A (clips, and says nothing about it)."""
        return -(t.w.clamp(0.8, 1.28) * t.adv)

    x = batch()
    _, metrics = compute_loss("urkl", "test_bare", config=CFG, **x)
    assert set(metrics) == {"w_mean", "w_max", "w_min"}  # no KL recomputed, no clip fractions of 0
    w = (x["logp"] - x["old_logp"]).detach().exp()[x["action_mask"] > 0]
    assert (metrics["w_max"], metrics["w_min"]) == pytest.approx((w.max().item(), w.min().item()))
    _, _, per_token = token_losses("urkl", "test_bare", config=CFG, **x)
    assert set(per_token) == {"w_mean", "w_max", "w_min"}


def test_built_in_losses_report_every_metric():
    x = batch()
    for name, style in list(LOSSES):
        if style.startswith("test_"):
            continue
        _, metrics = compute_loss(name, style, config=LossConfig(clip_c=3.0), **x)
        assert set(metrics) >= {"kl", "w_mean", "w_max", "w_min"} | CLIP_KEYS, (name, style)


def test_a_metric_of_the_wrong_shape_is_refused(registered):
    @registered("urkl", "test_bad_metric")
    def urkl_bad_metric(t: PolicyTerms):
        """L = -w A; reports a per-sequence metric of the wrong shape."""
        return -(t.w * t.adv), Measured(extra={"per_seq": t.adv.sum(-1)})

    with pytest.raises(ValueError, match=r"^metrics: 'per_seq' has shape \(4,\)"):
        compute_loss("urkl", "test_bad_metric", config=CFG, **batch())

    @registered("urkl", "test_bad_return")
    def urkl_bad_return(t: PolicyTerms):
        """L = -w A, returned with a dict instead of a Measured."""
        return -(t.w * t.adv), {"kl": t.adv}

    with pytest.raises(TypeError, match=r"test_bad_return.*Tensor or \(Tensor, Measured\)"):
        compute_loss("urkl", "test_bad_return", config=CFG, **batch())


def test_the_actor_logs_only_what_the_loss_measured(registered):
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.trainer.ray imports vllm / flash_attn at import time
    from rpg_openrlhf.plugin.actor import RPGPolicyLoss

    @registered("urkl", "test_bare_actor")
    def urkl_bare_actor(t: PolicyTerms) -> torch.Tensor:
        """L = -w A (reports nothing)."""
        return -(t.w * t.adv)

    x = {k: v.float().detach() for k, v in batch().items()}
    rollout_kl = torch.tensor(0.123)
    experience = SimpleNamespace(base_action_log_probs=None, info={"kl": rollout_kl})
    fn = RPGPolicyLoss("urkl", "test_bare_actor", CFG)
    fn.experience = experience
    _, clip_ratio, *_ = fn(x["logp"], x["old_logp"], x["advantages"], action_mask=x["action_mask"])
    assert math.isnan(clip_ratio.item())  # OpenRLHF needs a tensor: NaN = not measured, not 0
    assert experience.info["kl"] is rollout_kl  # OpenRLHF's own value, not a recomputed one
    assert {k for k in experience.info if k.startswith("rpg/")} == {"rpg/w_mean", "rpg/w_max", "rpg/w_min"}
