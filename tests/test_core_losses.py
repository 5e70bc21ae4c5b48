"""Token-level behaviour of the RPG losses: every registered pair's value and gradient against its
formula (the paper's, docs/losses.md) written here, Prop. 4.1 token by token, RPG-Style Clip's
window, metrics, validation.

Expected values are formulas written here, never the module's own helpers; corrected GRPO is also
checked against OpenRLHF's --algo.kl.unbiased_gradient path."""

import functools
import math

import pytest
import torch
from openrlhf_files import openrlhf_models_file

from rpg_openrlhf.core import (
    DIVERGENCES,
    KL_OPTION_NAMES,
    LOSS_NAMES,
    LOSSES,
    METRIC_NAMES,
    STYLES,
    LossConfig,
    aggregate,
    compute_loss,
    token_losses,
)

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


def ratios(batch: dict, logp: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, rho, log(pi_theta/pi_ref)) of a batch, at logp (default: the batch's, no gradient)."""
    logp = batch["logp"].detach() if logp is None else logp
    log_w = logp - batch["old_logp"]
    log_rho = (
        batch["ref_logp"] - batch["old_logp"] if batch["ref_logp"] is not None else torch.zeros_like(log_w)
    )
    return log_w.exp(), log_rho.exp(), log_w - log_rho


def coef_formula(name: str, batch: dict, beta: float) -> torch.Tensor:
    """The paper's REINFORCE coefficients (rpg-method.md, general pi_ref)."""
    w, rho, log_pr = ratios(batch)
    a = batch["advantages"]
    return {
        "fkl": w * a + beta * rho,
        "rkl": w * (a - beta * log_pr - beta),
        "ufkl": w * a - beta * (w - rho),
        "urkl": w * (a - beta * log_pr),
    }[name]


def _k3(y: torch.Tensor) -> torch.Tensor:
    return y - 1 - y.log()


def formula_loss(key: tuple[str, str], batch: dict, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, gradient in logp) of the pair's formula with nothing clipped (eps_low 1, eps_high 1e3,
    c 1e4: PPO(w, A) = -w A): the differentiable losses through autograd of their formula, the REINFORCE
    ones -SG(coef) log pi_theta and RPG-Style Clip -w SG(coef / w) (A' = coef / w); the released
    styles are the paper's inside the window (w_h = w)."""
    name, style = key
    logp = batch["logp"].detach().clone().requires_grad_()
    w, rho, lp = ratios(batch, logp)
    a = batch["advantages"]
    if name in ("grpo_kl", "grpo_kl_corrected"):  # + beta k3(pi_ref/pi_theta), corrected: times w
        value = -w * a + beta * _k3(rho / w) * (w if name == "grpo_kl_corrected" else 1.0)
    elif style == "differentiable":
        d_t = {"fkl": -rho * lp, "rkl": w * lp, "ufkl": w - rho - rho * lp, "urkl": w * lp - w + rho}[name]
        value = -w * a + beta * d_t
    else:
        coef = coef_formula(name, batch, beta)
        value = -w * (coef / w.detach()) if style == "reinforce_clip" else -coef * logp
    mask = batch["action_mask"]
    return value.detach(), torch.autograd.grad((value * mask).sum(), logp)[0]


def test_registry_covers_every_documented_pair():
    # every framework's KL option is registered too, its formula checked in tests/test_kl_options.py
    paper = {(n, s) for n in DIVS for s in STYLES} | {
        ("grpo_kl", "differentiable"),
        ("grpo_kl_corrected", "differentiable"),
    }
    assert set(LOSSES) - {(n, "differentiable") for n in KL_OPTION_NAMES} == paper
    assert set(LOSS_NAMES) == {n for n, _ in paper}


# style (or GRPO loss) -> the formula its docstring states (the paper's Table 1, over D_t and s_t)
DOCS = {
    "differentiable": "L = PPO(w, A) + beta D_t",
    "reinforce": "L = -SG(coef) log pi_theta, coef = w A - beta s_t",
    "reinforce_clip": "L = PPO(w, A'), A' = SG(coef / w)",
    "reinforce_released": "L = -SG(w_h A - beta s_t(w_h)) log pi_theta",
    "reinforce_clip_released": "L = -SG(w A - beta s_t(w_h)) log pi_theta",
    "grpo_kl": "L = PPO(w, A) + beta k3(pi_ref/pi_theta)",
    "grpo_kl_corrected": "L = PPO(w, A) + beta w k3(pi_ref/pi_theta)",
}


@pytest.mark.parametrize("with_ref", [True, False])
@pytest.mark.parametrize(
    "key", sorted(set(LOSSES) - {(n, "differentiable") for n in KL_OPTION_NAMES}), ids="/".join
)
def test_every_loss_is_its_formula_in_value_and_gradient(key, with_ref):
    """The loss is one function whose docstring holds its formula (a divergence's loss: its style's,
    applied to that divergence), and its value and gradient are the formula written above. Prop. 4.1
    token by token: the differentiable formula's gradient is the REINFORCE coefficient's."""
    fn = LOSSES[key]
    if isinstance(fn, functools.partial):  # (divergence, style): the style's function on DIVERGENCES[name]
        assert fn.keywords == {"div": DIVERGENCES[key[0]]} and not fn.args, key
        fn = fn.func
    assert " ".join(DOCS[fn.__name__].split()) in " ".join(fn.__doc__.split()), key
    batch = random_batch(seed=11)
    if not with_ref:
        batch["ref_logp"] = None
    beta = 0.3
    loss, _, _ = token_losses(*key, config=LossConfig(beta=beta, **WIDE), **batch)
    value, grad = formula_loss(key, batch, beta)
    torch.testing.assert_close(loss.detach(), value, rtol=0, atol=1e-12)
    torch.testing.assert_close(token_grad(*key, batch, beta=beta, **WIDE), grad, rtol=0, atol=1e-12)
    if key[0] in DIVS:
        assert grad.abs().max() > 1e-2
        torch.testing.assert_close(
            grad, -coef_formula(key[0], batch, beta) * batch["action_mask"], rtol=0, atol=1e-12
        )


def ppo_dual_clip(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, c: float
) -> torch.Tensor:
    """OpenRLHF's PolicyLoss form: max(-A r, -A clamp(r)), then min(., -A c) where A < 0."""
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    return torch.where(adv < 0, torch.minimum(clipped, -adv * c), clipped)


@pytest.mark.parametrize("name", DIVS)
def test_rpg_style_clip_passes_the_reinforce_coefficient_inside_the_window_only(name):
    """RPG-Style Clip with windows that bind: the value is dual-clip PPO on A' (written as OpenRLHF
    writes it), the gradient -coef inside the window and 0 outside, the clip fractions count A''s branches."""
    eps_low, eps_high, c, beta = 0.2, 0.28, 2.0, 0.4
    batch = random_batch(seed=5, b=16, t=16, spread=0.6)
    batch["action_mask"] = torch.ones_like(batch["old_logp"])
    coef = coef_formula(name, batch, beta=beta)  # the REINFORCE coefficient w A'
    cfg = dict(beta=beta, eps_low=eps_low, eps_high=eps_high, clip_c=c)
    got = token_grad(name, "reinforce_clip", batch, **cfg)
    w = ratios(batch)[0]
    a_prime = coef / w
    low = (a_prime < 0) & (w < 1 - eps_low)
    high = (a_prime > 0) & (w > 1 + eps_high)
    dual = (a_prime < 0) & (w > c)
    inside = ~(low | high | dual)
    # every branch is hit; some tokens that a branch on sign(A) would clip pass by A''s
    by_a = torch.where(batch["advantages"] > 0, w > 1 + eps_high, (w < 1 - eps_low) | (w > c))
    assert low.any() and high.any() and dual.any() and (inside & by_a).any()
    torch.testing.assert_close(got, torch.where(inside, -coef, 0.0), rtol=0, atol=1e-13)
    loss, _, _ = token_losses(name, "reinforce_clip", config=LossConfig(**cfg), **batch)
    torch.testing.assert_close(
        loss.detach(), ppo_dual_clip(w, a_prime, eps_low, eps_high, c), rtol=0, atol=1e-12
    )
    _, metrics = compute_loss(name, "reinforce_clip", config=LossConfig(**cfg), **batch)
    for key, branch in (("clip_frac_low", low), ("clip_frac_high", high), ("clip_frac_dual", dual)):
        assert metrics[key] == pytest.approx(branch.double().mean().item()), key


def test_differentiable_style_clips_only_the_reward_term():
    batch = random_batch(seed=6, spread=1.0)
    beta = 0.5
    got = token_grad("ufkl", "differentiable", batch, beta=beta, eps_low=0.2, eps_high=0.28)
    w, rho, _ = ratios(batch)
    a, m = batch["advantages"], batch["action_mask"]
    # PPO(w, A) passes -A w grad logp only inside the window (A >= 0: w < 1.28; A < 0: w > 0.8)
    inside = torch.where(a >= 0, w < 1.28, w > 0.8)
    ppo = torch.where(inside, -a * w, 0.0) * m
    torch.testing.assert_close(got, ppo + beta * (w - rho) * m, rtol=0, atol=1e-13)  # UFKL score w - rho
    assert (~inside & (m > 0)).any() and (inside & (m > 0)).any()  # clipped tokens still get the KL gradient


def test_corrected_grpo_gradient_is_openrlhf_unbiased_gradient_up_to_its_weight_clamp():
    """OpenRLHF's --algo.kl.unbiased_gradient backpropagates w_c log(pi_theta/pi_ref) with
    w_c = min(w, KL_IS_WEIGHT_CLIP = 10), detached: an independent importance-weighted k3 gradient.
    It equals grpo_kl_corrected's where w <= 10 and is w_c / w of it beyond; its value is the
    unweighted k3, not w k3. A = 0 (the PPO reward term is 0 with no gradient), w over [0.05, 30]."""
    utils = openrlhf_models_file("utils")
    compute_approx_kl, clip = utils.compute_approx_kl, utils.KL_IS_WEIGHT_CLIP
    assert clip == 10.0
    g = torch.Generator().manual_seed(13)
    old = -torch.rand(8, 64, generator=g, dtype=F64) * 3
    log_w = torch.empty(8, 64, dtype=F64).uniform_(math.log(0.05), math.log(30.0), generator=g)
    logp = (old + log_w).requires_grad_()
    ref = old + 0.5 * torch.randn(8, 64, generator=g, dtype=F64)
    theirs = compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3", unbiased_gradient=True)
    ours, _, _ = token_losses("grpo_kl_corrected", "differentiable", logp, old, torch.zeros_like(old),
                              ref_logp=ref, config=LossConfig(beta=1.0))  # fmt: skip
    g_theirs, g_ours = (torch.autograd.grad(v.sum(), logp, retain_graph=True)[0] for v in (theirs, ours))
    w = (logp - old).detach().exp()
    below = w <= clip
    assert below.any() and (~below).any()
    # OpenRLHF computes in float32 (log_probs.float()): agree to float32 precision
    torch.testing.assert_close(g_theirs[below], g_ours[below], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_theirs[~below], (g_ours * clip / w)[~below], rtol=1e-5, atol=1e-6)
    y = (ref - logp).detach().exp()
    torch.testing.assert_close(theirs.detach(), (y - 1 - y.log()).clamp(-10, 10).to(theirs.dtype))


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
    """The KL aggregated like the loss (seq-mean-token-mean); a loss without a clip reports clip fractions
    of 0 (the clip fractions' formula: the clip test above; w statistics: tests/test_core_metrics.py)."""
    batch = random_batch(seed=8, spread=0.8)
    config = LossConfig(beta=0.2, clip_c=3.0, aggregation="seq-mean-token-mean")
    _, metrics = compute_loss("rkl", "differentiable", config=config, **batch)
    assert set(metrics) == set(METRIC_NAMES) and all(isinstance(v, float) for v in metrics.values())
    w_all, _, log_pr = ratios(batch)
    kl, mask = w_all * log_pr, batch["action_mask"]  # RKL: D_t = w log(pi_theta/pi_ref)
    rows = mask.sum(-1) > 0
    want_kl = ((kl * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()  # seq-mean-token-mean
    assert metrics["kl"] == pytest.approx(want_kl.item())
    _, unclipped = compute_loss("rkl", "reinforce", config=config, **batch)
    assert unclipped["clip_frac_low"] == unclipped["clip_frac_high"] == unclipped["clip_frac_dual"] == 0.0
    assert unclipped["kl"] == pytest.approx(want_kl.item())


def test_log_ratio_clamp_stops_the_gradient_through_w_only():
    """Beyond |log w| = 20, w is the constant e^+-20: losses differentiated through w get no
    gradient there (autograd through torch's clamp, written here), REINFORCE keeps -SG(coef)."""
    log_w = torch.tensor([[25.0, -25.0, 19.5, -19.5, 0.3, -0.7]], dtype=F64)
    old = torch.full_like(log_w, -30.0)
    adv = torch.tensor([[1.0, -1.0, -0.5, 0.5, 1.5, -2.0]], dtype=F64)
    beta = 0.2
    cfg = dict(beta=beta, eps_low=1.0, eps_high=1e12, clip_c=1e12)  # nothing clips but the log ratio
    x = (old + log_w).requires_grad_()
    w = (x - old).clamp(-20, 20).exp()  # torch's own clamp, autograd through it
    want = {
        "differentiable": -w * adv + beta * (w * w.log() - w + 1),
        "reinforce_clip": -w * (adv - beta * w.log()).detach(),
    }
    for style, literal in want.items():
        loss, _, _ = token_losses("urkl", style, x, old, adv, config=LossConfig(**cfg))
        got, expected = (torch.autograd.grad(v.sum(), x, retain_graph=True)[0] for v in (loss, literal))
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
        assert (got[0, :2] == 0).all() and (got[0, 2:] != 0).all(), style
    loss, _, _ = token_losses("urkl", "reinforce", x, old, adv, config=LossConfig(beta=beta))
    coef = (w * (adv - beta * w.log())).detach()
    torch.testing.assert_close(torch.autograd.grad(loss.sum(), x)[0], -coef, rtol=1e-12, atol=0)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(eps_low=0.0), "eps_low"),
        (dict(clip_c=1.0), "clip_c"),
        (dict(beta=float("nan")), "beta"),
        (dict(weight_level="prompt"), "weight_level"),
        (dict(aggregation="sum"), "aggregation"),
        (dict(aggregation_scope="rank"), "aggregation_scope"),
        (dict(log_ratio_clamp=0.0), "log_ratio_clamp"),
        (dict(kl_value_clamp=0.0), "kl_value_clamp"),
    ],
)
def test_bad_config_names_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        LossConfig(**kwargs)


@pytest.mark.parametrize(
    "name, style, field, value, arg",
    [
        ("kl", "reinforce", None, None, "name"),
        ("urkl", "ppo", None, None, "style"),
        ("grpo_kl_corrected", "reinforce_clip", None, None, "style"),
        ("urkl", "reinforce", "old_logp", lambda x: x[:, :3], "old_logp"),
        ("urkl", "reinforce", "ref_logp", lambda x: x[:2], "ref_logp"),
        ("urkl", "reinforce", "action_mask", lambda x: x[:, None], "action_mask"),
        ("urkl", "reinforce", "advantages", lambda x: x[:, :1], "advantages"),
        ("urkl", "reinforce", "logp", lambda x: x[0], "logp"),
    ],
)
def test_bad_input_names_the_argument(name, style, field, value, arg):
    batch = random_batch(seed=10)
    if field is not None:
        batch[field] = value(batch[field])
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        compute_loss(name, style, **batch)


@pytest.mark.parametrize("kwargs, arg", [(dict(mode="sum"), "aggregation"), (dict(dp_size=0), "dp_size")])
def test_bad_aggregation_names_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        aggregate(torch.ones(2, 2), torch.ones(2, 2), **kwargs)
