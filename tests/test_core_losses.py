"""Token-level behaviour of the RPG losses: Prop. 4.1, RPG-Style Clip branches, metrics, validation."""

import math

import pytest
import torch

from rpg_openrlhf.core import (
    LOSS_NAMES,
    LOSSES,
    METRIC_NAMES,
    STYLES,
    LossConfig,
    aggregate,
    compute_loss,
    kl_components,
    register_loss,
    token_losses,
)
from rpg_openrlhf.core.losses import reinforce

F64 = torch.float64
DIVS = ("fkl", "rkl", "ufkl", "urkl")
WIDE = dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)


def random_batch(seed: int = 0, b: int = 4, t: int = 7, spread: float = 0.5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    return {
        "logp": (old + spread * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(),
        "old_logp": old,
        "ref_logp": old + spread * torch.randn(b, t, generator=g, dtype=F64),
        "advantages": torch.randn(b, t, generator=g, dtype=F64),
        "action_mask": (torch.rand(b, t, generator=g) > 0.25).to(F64),
    }


def token_grad(name: str, style: str, batch: dict, **cfg: object) -> torch.Tensor:
    loss, mask, _ = token_losses(name, style, config=LossConfig(**cfg), **batch)
    return torch.autograd.grad((loss * mask).sum(), batch["logp"])[0]


def test_registry_covers_every_documented_pair():
    want = {(n, s) for n in DIVS for s in STYLES} | {
        ("grpo_kl", "differentiable"),
        ("grpo_kl_corrected", "differentiable"),
    }
    assert set(LOSSES) == want and set(LOSS_NAMES) == {n for n, _ in want}
    for fn in LOSSES.values():  # every loss states its formula
        assert fn.__doc__ and "L" in fn.__doc__


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("with_ref", [True, False])
@pytest.mark.parametrize("name", DIVS)
def test_reinforce_and_differentiable_have_the_same_gradient_per_token(name, with_ref, aggregation):
    """Prop. 4.1 holds token by token, not only in expectation."""
    batch = random_batch()
    if not with_ref:
        batch["ref_logp"] = None
    grads = []
    for style, cfg in (
        ("differentiable", dict(clip_reward=False)),
        ("reinforce", {}),
        ("reinforce_clip", WIDE),
    ):
        config = LossConfig(beta=0.3, aggregation=aggregation, **cfg)
        loss, _ = compute_loss(name, style, config=config, **batch)
        grads.append(torch.autograd.grad(loss, batch["logp"])[0])
    assert grads[0].abs().max() > 1e-2
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", DIVS)
def test_rpg_style_clip_passes_the_reinforce_coefficient_inside_the_window_only(name):
    eps_low, eps_high, c = 0.2, 0.28, 2.0
    batch = random_batch(seed=5, b=16, t=16, spread=0.6)
    batch["action_mask"] = torch.ones_like(batch["old_logp"])
    coef = -token_grad(name, "reinforce", batch, beta=0.4)  # the REINFORCE coefficient w A'
    got = token_grad(name, "reinforce_clip", batch, beta=0.4, eps_low=eps_low, eps_high=eps_high, clip_c=c)
    w = (batch["logp"] - batch["old_logp"]).detach().exp()
    a_prime = coef / w
    low = (a_prime < 0) & (w < 1 - eps_low)
    high = (a_prime > 0) & (w > 1 + eps_high)
    dual = (a_prime < 0) & (w > c)
    assert low.any() and high.any() and dual.any() and (~(low | high | dual)).any()  # every branch is hit
    torch.testing.assert_close(got, torch.where(low | high | dual, 0.0, -coef), rtol=0, atol=1e-13)


def test_rpg_style_clip_branches_by_hand():
    """URKL, pi_ref = pi_old: A' = A - beta log w. One token per branch; the last column is masked."""
    beta, eps_low, eps_high, c = 0.1, 0.2, 0.28, 3.0
    log_w = torch.tensor([[0.1, 0.5, -0.5, -0.5, 0.5, 1.5, 1.5, 0.5, -0.5]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 0.01, -1.0]], dtype=F64)
    mask = torch.tensor([[1.0] * 8 + [0.0]], dtype=F64)
    old = torch.full_like(log_w, -1.0)
    logp = (old + log_w).requires_grad_()
    config = LossConfig(beta=beta, eps_low=eps_low, eps_high=eps_high, clip_c=c)
    loss, _, _ = token_losses("urkl", "reinforce_clip", logp, old, adv, mask, config=config)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    w, a_prime = log_w.exp(), adv - beta * log_w
    inside = torch.tensor([[1, 0, 0, 1, 1, 0, 0, 1, 0]], dtype=torch.bool)
    # 0 inside, 1 high clip, 2 low clip, 3 A'>0 & w<1-eps (no clip), 4 A'<0 & w in (1+eps, c) (no clip),
    # 5 dual clip, 6 w>c but A'>0 (high clip, not c), 7 A>0 but A'<0 -> unclipped, 8 masked.
    assert a_prime[0, 7] < 0 < adv[0, 7]
    torch.testing.assert_close(grad, torch.where(inside, -w * a_prime, 0.0), rtol=0, atol=1e-14)
    torch.testing.assert_close(loss[0, 5], -c * a_prime[0, 5])
    torch.testing.assert_close(loss[0, 6], -(1 + eps_high) * a_prime[0, 6])
    torch.testing.assert_close(loss[0, 2], -(1 - eps_low) * a_prime[0, 2])
    _, metrics = compute_loss("urkl", "reinforce_clip", logp, old, adv, mask, config=config)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 8)
    assert metrics["clip_frac_high"] == pytest.approx(2 / 8)
    assert metrics["clip_frac_dual"] == pytest.approx(1 / 8)


def test_differentiable_style_clips_only_the_reward_term():
    batch = random_batch(seed=6, spread=1.0)
    beta = 0.5
    cfg = dict(eps_low=0.2, eps_high=0.28)
    got = token_grad("ufkl", "differentiable", batch, beta=beta, **cfg)
    ppo = token_grad("grpo_kl", "differentiable", batch, beta=0.0, **cfg)  # the clipped reward term alone
    (kl,) = torch.autograd.grad((kl_components("ufkl", batch["logp"], batch["old_logp"], batch["ref_logp"])
                                 * batch["action_mask"]).sum(), batch["logp"])  # fmt: skip
    torch.testing.assert_close(got, ppo + beta * kl, rtol=0, atol=1e-13)
    assert (ppo == 0).any() and (ppo != 0).any()  # some reward terms are clipped, KL gradient still flows


def test_sequence_level_shapes_and_advantage():
    batch = random_batch(seed=7)
    batch["action_mask"][1] = 0.0  # a fully masked sequence
    loss, mask, metrics = token_losses(
        "rkl", "reinforce", config=LossConfig(weight_level="sequence"), **batch
    )
    assert loss.shape == mask.shape == (4, 1)
    assert mask[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
    # [B] advantages and their broadcast [B, T] version give the same sequence loss
    adv = torch.randn(4, dtype=F64)
    batch["advantages"] = adv
    seq_a, _, _ = token_losses("urkl", "reinforce", config=LossConfig(weight_level="sequence"), **batch)
    batch["advantages"] = adv[:, None].expand(4, 7) * batch["action_mask"]
    seq_b, _, _ = token_losses("urkl", "reinforce", config=LossConfig(weight_level="sequence"), **batch)
    torch.testing.assert_close(seq_a[mask > 0], seq_b[mask > 0])


def test_metrics_values():
    batch = random_batch(seed=8, spread=0.8)
    config = LossConfig(beta=0.2, eps_low=0.2, eps_high=0.28, clip_c=3.0, aggregation="seq-mean-token-mean")
    loss, metrics = compute_loss("rkl", "differentiable", config=config, **batch)
    assert set(metrics) == set(METRIC_NAMES) and all(isinstance(v, float) for v in metrics.values())
    m = batch["action_mask"] > 0
    w = (batch["logp"] - batch["old_logp"]).detach().exp()[m]
    assert metrics["w_mean"] == pytest.approx(w.mean().item())
    assert metrics["w_max"] == pytest.approx(w.max().item()) and metrics["w_min"] == pytest.approx(
        w.min().item()
    )
    kl = kl_components("rkl", batch["logp"], batch["old_logp"], batch["ref_logp"]).detach()
    want_kl = aggregate(kl, batch["action_mask"], "seq-mean-token-mean")
    assert metrics["kl"] == pytest.approx(want_kl.item())
    adv = batch["advantages"][m]
    assert metrics["clip_frac_low"] == pytest.approx(((adv < 0) & (w < 0.8)).double().mean().item())
    assert metrics["clip_frac_high"] == pytest.approx(((adv > 0) & (w > 1.28)).double().mean().item())
    assert metrics["clip_frac_dual"] == pytest.approx(((adv < 0) & (w > 3.0)).double().mean().item())
    _, unclipped = compute_loss("rkl", "reinforce", config=config, **batch)
    assert unclipped["clip_frac_low"] == unclipped["clip_frac_high"] == unclipped["clip_frac_dual"] == 0.0
    assert unclipped["kl"] == pytest.approx(want_kl.item())


def test_extreme_log_ratios_are_clamped_and_finite():
    logp = torch.tensor([[50.0, -50.0, 0.0]], dtype=F64, requires_grad=True)
    old = torch.zeros(1, 3, dtype=F64)
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=F64)
    for name, style in LOSSES:
        loss, metrics = compute_loss(name, style, logp, old, adv, config=LossConfig(beta=0.1, clip_c=3.0))
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), (name, style)
        assert metrics["w_max"] == pytest.approx(math.exp(20.0)) and metrics["w_min"] == pytest.approx(
            math.exp(-20)
        )


def test_register_loss_adds_a_variant_with_one_function():
    key = ("urkl", "test_only_half")

    @register_loss(*key)
    def urkl_half(t):
        """L = -SG(coef / 2) log pi_theta (test variant)."""
        return reinforce(t, "urkl") / 2

    try:
        batch = random_batch(seed=9)
        torch.testing.assert_close(
            token_grad(*key, batch, beta=0.1), token_grad("urkl", "reinforce", batch, beta=0.1) / 2
        )
        with pytest.raises(ValueError, match=r"^name:.*already registered"):
            register_loss(*key)(urkl_half)
    finally:
        del LOSSES[key]


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(eps_low=0.0), "eps_low"),
        (dict(eps_high=-0.1), "eps_high"),
        (dict(clip_c=1.0), "clip_c"),
        (dict(beta=-1.0), "beta"),
        (dict(beta=float("nan")), "beta"),
        (dict(weight_level="prompt"), "weight_level"),
        (dict(aggregation="sum"), "aggregation"),
        (dict(log_ratio_clamp=0.0), "log_ratio_clamp"),
    ],
)
def test_bad_config_names_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        LossConfig(**kwargs)


def _bad(field: str, value: object) -> dict:
    batch = random_batch(seed=10)
    batch[field] = value(batch[field]) if callable(value) else value
    return batch


@pytest.mark.parametrize("entry", ["token_losses", "compute_loss"])
@pytest.mark.parametrize(
    "name, style, field, value, arg",
    [
        ("kl", "reinforce", None, None, "name"),
        ("urkl", "ppo", None, None, "style"),
        ("grpo_kl", "reinforce", None, None, "style"),
        ("grpo_kl_corrected", "reinforce_clip", None, None, "style"),
        ("urkl", "reinforce", "old_logp", lambda x: x[:, :3], "old_logp"),
        ("urkl", "reinforce", "ref_logp", lambda x: x[:2], "ref_logp"),
        ("urkl", "reinforce", "action_mask", lambda x: x[:, None], "action_mask"),
        ("urkl", "reinforce", "advantages", lambda x: x[:, :1], "advantages"),
        ("urkl", "reinforce", "logp", lambda x: x[0], "logp"),
        (
            "urkl",
            "differentiable",
            "logp",
            lambda x: x.detach().index_fill(1, torch.tensor([2]), math.nan),
            "logp",
        ),
        (
            "urkl",
            "differentiable",
            "old_logp",
            lambda x: x.index_fill(0, torch.tensor([0]), -math.inf),
            "old_logp",
        ),
        (
            "urkl",
            "differentiable",
            "ref_logp",
            lambda x: x.index_fill(0, torch.tensor([1]), math.inf),
            "ref_logp",
        ),
        (
            "urkl",
            "differentiable",
            "advantages",
            lambda x: x.index_fill(0, torch.tensor([1]), math.nan),
            "advantages",
        ),
    ],
)
def test_bad_input_names_the_argument(entry, name, style, field, value, arg):
    batch = random_batch(seed=10) if field is None else _bad(field, value)
    fn = token_losses if entry == "token_losses" else compute_loss
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        fn(name, style, **batch)


@pytest.mark.parametrize("kwargs, arg", [(dict(mode="sum"), "aggregation"), (dict(dp_size=0), "dp_size")])
def test_bad_aggregation_names_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        aggregate(torch.ones(2, 2), torch.ones(2, 2), **kwargs)
