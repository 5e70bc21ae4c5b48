"""Token-level behaviour of the RPG losses: Prop. 4.1, RPG-Style Clip branches, metrics, validation.

Expected values are formulas written here (the paper's, docs/losses.md), never the module's own
helpers; corrected GRPO is also checked against OpenRLHF's --algo.kl.unbiased_gradient path."""

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


def ratios(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, rho, log(pi_theta/pi_ref)) of a batch, no gradient."""
    log_w = (batch["logp"] - batch["old_logp"]).detach()
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


# (name, style) -> (the formula its docstring states, that formula's value with nothing clipped),
# value(w, rho, log_pr, A, logp, beta); with eps_low = 1, eps_high = 1e3, c = 1e4: PPO(w, A) = -w A.
_D = {
    "fkl": ("beta rho log(pi_ref/pi_theta)", lambda w, r, lp: -r * lp),
    "rkl": ("beta w log(pi_theta/pi_ref)", lambda w, r, lp: w * lp),
    "ufkl": ("beta (w - rho - rho log(pi_theta/pi_ref))", lambda w, r, lp: w - r - r * lp),
    "urkl": ("beta (w log(pi_theta/pi_ref) - w + rho)", lambda w, r, lp: w * lp - w + r),
}
_COEF = {
    "fkl": ("-SG(w A + beta rho) log pi_theta", lambda w, r, lp, a, b: w * a + b * r),
    "rkl": (
        "-SG(w (A - beta log(pi_theta/pi_ref) - beta)) log pi_theta",
        lambda w, r, lp, a, b: w * (a - b * lp - b),
    ),
    "ufkl": ("-SG(w A - beta (w - rho)) log pi_theta", lambda w, r, lp, a, b: w * a - b * (w - r)),
    "urkl": ("-SG(w (A - beta log(pi_theta/pi_ref))) log pi_theta", lambda w, r, lp, a, b: w * (a - b * lp)),
}
_A_PRIME = {
    "fkl": ("A' = A + beta rho / w", lambda w, r, lp, a, b: a + b * r / w),
    "rkl": ("A' = A - beta (log(pi_theta/pi_ref) + 1)", lambda w, r, lp, a, b: a - b * (lp + 1)),
    "ufkl": ("A' = A - beta (1 - rho / w)", lambda w, r, lp, a, b: a - b * (1 - r / w)),
    "urkl": ("A' = A - beta log(pi_theta/pi_ref)", lambda w, r, lp, a, b: a - b * lp),
}
_RELEASED = {  # w_h = w inside the wide window
    "fkl": "-SG(w_h A + beta rho) log pi_theta",
    "rkl": "-SG(w_h (A - beta log(w_h/rho) - beta)) log pi_theta",
    "ufkl": "-SG(w_h A - beta (w_h - rho)) log pi_theta",
    "urkl": "-SG(w_h (A - beta log(w_h/rho))) log pi_theta",
}
_RELEASED_CLIP = {
    "fkl": "-SG(w A + beta rho) log pi_theta where the sign(A) clip passes",
    "rkl": "-SG(w A - beta w_h (log(w_h/rho) + 1)) log pi_theta where the sign(A) clip passes",
    "ufkl": "-SG(w A - beta (w_h - rho)) log pi_theta where the sign(A) clip passes",
    "urkl": "-SG(w A - beta w_h log(w_h/rho)) log pi_theta where the sign(A) clip passes",
}
DOC_FORMULAS = {
    **{(n, "differentiable"): (f"L = PPO(w, A) + {_D[n][0]}",
                               lambda w, r, lp, a, g, b, n=n: -w * a + b * _D[n][1](w, r, lp)) for n in DIVS},
    **{(n, "reinforce"): (f"L = {_COEF[n][0]}", lambda w, r, lp, a, g, b, n=n: -_COEF[n][1](w, r, lp, a, b) * g)
       for n in DIVS},
    **{(n, "reinforce_clip"): (f"L = dual-clip PPO(w, A'),  {_A_PRIME[n][0]}",
                               lambda w, r, lp, a, g, b, n=n: -w * _A_PRIME[n][1](w, r, lp, a, b)) for n in DIVS},
    **{(n, "reinforce_released"): (f"L = {_RELEASED[n]}",
                                   lambda w, r, lp, a, g, b, n=n: -_COEF[n][1](w, r, lp, a, b) * g) for n in DIVS},
    **{(n, "reinforce_clip_released"): (f"L = {_RELEASED_CLIP[n]}",
                                        lambda w, r, lp, a, g, b, n=n: -_COEF[n][1](w, r, lp, a, b) * g)
       for n in DIVS},
    ("grpo_kl", "differentiable"): ("L = PPO(w, A) + beta k3(pi_ref/pi_theta)",
                                    lambda w, r, lp, a, g, b: -w * a + b * _k3(r / w)),
    ("grpo_kl_corrected", "differentiable"): ("L = PPO(w, A) + beta w k3(pi_ref/pi_theta)",
                                              lambda w, r, lp, a, g, b: -w * a + b * w * _k3(r / w)),
}  # fmt: skip


def test_registry_covers_every_documented_pair():
    # every framework's KL option is registered too, its formula checked in tests/test_kl_options.py
    options = {(n, "differentiable") for n in KL_OPTION_NAMES}
    assert set(LOSSES) - options == set(DOC_FORMULAS) and set(LOSS_NAMES) == {n for n, _ in DOC_FORMULAS}
    assert {s for _, s in DOC_FORMULAS} == set(STYLES)


# style -> the formula its one function's docstring states (the paper's Table 1, over D_t and s_t)
STYLE_DOCS = {
    "differentiable": "L = PPO(w, A) + beta D_t",
    "reinforce": "L = -SG(coef) log pi_theta, coef = w A - beta s_t",
    "reinforce_clip": "L = PPO(w, A'), A' = SG(coef / w)",
    "reinforce_released": "L = -SG(w_h A - beta s_t(w_h)) log pi_theta",
    "reinforce_clip_released": "L = -SG(w A - beta s_t(w_h)) log pi_theta",
}


@pytest.mark.parametrize("key", sorted(DOC_FORMULAS), ids="/".join)
def test_every_docstring_states_the_formula_the_loss_computes(key):
    """The loss is one function whose docstring holds its formula (a divergence's loss: its style's,
    applied to that divergence), and the loss's value is the formula written above for the pair."""
    doc_formula, value = DOC_FORMULAS[key]
    fn = LOSSES[key]
    if isinstance(fn, functools.partial):  # (divergence, style): the style's function on DIVERGENCES[name]
        assert fn.keywords == {"div": DIVERGENCES[key[0]]} and not fn.args, key
        fn, doc_formula = fn.func, STYLE_DOCS[key[1]]
    doc = " ".join(fn.__doc__.split())
    assert " ".join(doc_formula.split()) in doc, (key, doc)
    batch = random_batch(seed=11)
    beta = 0.3
    w, rho, log_pr = ratios(batch)
    loss, _, _ = token_losses(*key, config=LossConfig(beta=beta, **WIDE), **batch)
    want = value(w, rho, log_pr, batch["advantages"], batch["logp"].detach(), beta)
    torch.testing.assert_close(loss.detach(), want, rtol=0, atol=1e-12)


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
    coef = coef_formula(name, batch, beta=0.4)  # the REINFORCE coefficient w A'
    got = token_grad(name, "reinforce_clip", batch, beta=0.4, eps_low=eps_low, eps_high=eps_high, clip_c=c)
    w = ratios(batch)[0]
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
    got = token_grad("ufkl", "differentiable", batch, beta=beta, eps_low=0.2, eps_high=0.28)
    w, rho, _ = ratios(batch)
    a, m = batch["advantages"], batch["action_mask"]
    # PPO(w, A) passes -A w grad logp only inside the window (A >= 0: w < 1.28; A < 0: w > 0.8)
    inside = torch.where(a >= 0, w < 1.28, w > 0.8)
    ppo = torch.where(inside, -a * w, 0.0) * m
    torch.testing.assert_close(got, ppo + beta * (w - rho) * m, rtol=0, atol=1e-13)  # UFKL score w - rho
    assert (~inside & (m > 0)).any() and (inside & (m > 0)).any()  # clipped tokens still get the KL gradient


def _kl_only_batch(seed: int) -> dict:
    """A = 0 (the PPO reward term is 0 with no gradient), pi_ref != pi_old, w spread over [0.05, 30]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 64, generator=g, dtype=F64) * 3
    log_w = torch.empty(8, 64, dtype=F64).uniform_(math.log(0.05), math.log(30.0), generator=g)
    return {
        "logp": (old + log_w).requires_grad_(),
        "old_logp": old,
        "ref_logp": old + 0.5 * torch.randn(8, 64, generator=g, dtype=F64),
        "advantages": torch.zeros(8, 64, dtype=F64),
    }


def test_corrected_grpo_gradient_is_openrlhf_unbiased_gradient_up_to_its_weight_clamp():
    """OpenRLHF's --algo.kl.unbiased_gradient backpropagates w_c log(pi_theta/pi_ref) with
    w_c = min(w, KL_IS_WEIGHT_CLIP = 10), detached: an independent importance-weighted k3 gradient.
    It equals grpo_kl_corrected's where w <= 10 and is w_c / w of it beyond; its value is the
    unweighted k3, not w k3."""
    utils = openrlhf_models_file("utils")
    compute_approx_kl, clip = utils.compute_approx_kl, utils.KL_IS_WEIGHT_CLIP
    assert clip == 10.0
    beta = 1.0
    x = _kl_only_batch(13)
    logp, old, ref = x["logp"], x["old_logp"], x["ref_logp"]
    theirs = compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator="k3", unbiased_gradient=True)
    ours, _, _ = token_losses("grpo_kl_corrected", "differentiable", config=LossConfig(beta=beta), **x)
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
    w_all, _, log_pr = ratios(batch)
    kl, mask = w_all * log_pr, batch["action_mask"]  # RKL: D_t = w log(pi_theta/pi_ref)
    rows = mask.sum(-1) > 0
    want_kl = ((kl * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()  # seq-mean-token-mean
    assert metrics["kl"] == pytest.approx(want_kl.item())
    adv = batch["advantages"][m]
    assert metrics["clip_frac_low"] == pytest.approx(((adv < 0) & (w < 0.8)).double().mean().item())
    assert metrics["clip_frac_high"] == pytest.approx(((adv > 0) & (w > 1.28)).double().mean().item())
    assert metrics["clip_frac_dual"] == pytest.approx(((adv < 0) & (w > 3.0)).double().mean().item())
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


def test_register_loss_adds_a_variant_with_one_function():
    key = ("urkl", "test_only_half")

    @register_loss(*key)
    def urkl_half(t):
        """L = -SG(coef / 2) log pi_theta (test variant)."""
        return reinforce(t, "urkl")[0] / 2  # the loss; its Measured is not reported

    try:
        batch = random_batch(seed=9)
        want = -coef_formula("urkl", batch, beta=0.1) * batch["action_mask"] / 2
        torch.testing.assert_close(token_grad(*key, batch, beta=0.1), want)
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
