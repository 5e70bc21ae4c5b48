"""Rollout (engine) mismatch correction: samples from mu = pi_rollout, not pi_old (core/correction.py).

Exact proofs on the enumerable policy of test_core_exact.py (vocabulary 3, length 3, 27 sequences,
tabular logits per prefix, float64) with four distinct policies pi_theta, pi_old, mu, pi_ref:
expectations under mu are exact mu-weighted sums over every sequence, target gradients come from
autograd through the exact objective computed by enumeration (test_core_exact.exact_grad). The
mask / clip mechanics are checked against formulas written here, and the gating statistics against
OpenRLHF 0.11.2's PolicyLoss on the same tensors.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from openrlhf_files import openrlhf_models_file
from test_core_exact import BETA, DIVS, N_PREFIX, SEQS, STYLES, V, exact_grad, token_logp

from rpg_openrlhf.core import (
    CORRECTION_GATINGS,
    CORRECTION_LEVELS,
    CORRECTION_METRICS,
    CORRECTION_MODES,
    LOSSES,
    METRIC_NAMES,
    LossConfig,
    RolloutCorrection,
    compute_loss,
    token_losses,
)

F64 = torch.float64
WIDE = dict(eps_low=1.0, eps_high=1e3, clip_c=1e4)
PAPER = dict(eps_low=0.2, eps_high=0.28, clip_c=3.0)  # windows that clip on this policy
SEQ = RolloutCorrection.untruncated("seq")
TOKEN = RolloutCorrection.untruncated("token")
OFF = RolloutCorrection()


@pytest.fixture(scope="module")
def params() -> dict[str, torch.Tensor]:
    """pi_old, pi_theta, pi_ref and the sampler mu: four distinct random tabular policies."""
    g = torch.Generator().manual_seed(1)
    old = 0.8 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)
    return {
        "old": old,
        "theta": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
        "ref": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
        "mu": old + 0.5 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
        "reward": torch.randn(len(SEQS), generator=g, dtype=F64),
    }


def expected_grad(
    key: tuple[str, str],
    theta: torch.Tensor,
    old: torch.Tensor,
    sampler: torch.Tensor,
    ref: torch.Tensor | None,
    adv: torch.Tensor,
    correction: RolloutCorrection = OFF,
    rows: torch.Tensor | None = None,
    row_weight: torch.Tensor | None = None,
    **cfg: object,
) -> torch.Tensor:
    """grad of sum_x P(x) L(x): L(x) the per-sample loss (its tokens' losses summed), x = SEQS[rows],
    P = row_weight (default: every sequence once, weighted by the sampler's probability). The
    sampler's log-probs are the loss's rollout_logp."""
    rows = torch.arange(len(SEQS)) if rows is None else rows
    th = theta.clone().requires_grad_()
    old_logp, mu_logp = token_logp(old)[rows], token_logp(sampler)[rows]
    ref_logp = None if ref is None else token_logp(ref)[rows]
    weight = mu_logp.sum(-1).exp() if row_weight is None else row_weight
    config = LossConfig(beta=BETA, rollout_correction=correction, **cfg)
    loss, mask, _ = token_losses(
        *key, token_logp(th)[rows], old_logp, adv, None, ref_logp, config, rollout_logp=mu_logp
    )
    return torch.autograd.grad((weight * (loss * mask).sum(-1)).sum(), th)[0]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


# ------------------------------------------------------------------ exactness of the seq level
@pytest.mark.parametrize("baseline", [0.0, 0.7])
@pytest.mark.parametrize("ref_kind", ["old", "other"])
@pytest.mark.parametrize("style_key", list(STYLES))
@pytest.mark.parametrize("name", DIVS)
def test_seq_level_correction_gives_the_exact_gradient_from_samples_of_mu(
    name, style_key, ref_kind, baseline, params
):
    """sum_x mu(x) grad[c(x) L(x)] = grad of -(E_theta[R] - beta D(pi_theta, pi_ref)), c = pi_old/mu."""
    style, cfg = STYLES[style_key]
    theta, old, mu = params["theta"], params["old"], params["mu"]
    ref = params["ref"] if ref_kind == "other" else old
    ref_arg = None if ref_kind == "old" else ref
    adv = params["reward"] - baseline
    args = ((name, style), theta, old, mu, ref_arg, adv)
    got = expected_grad(*args, SEQ, weight_level="sequence", **cfg)
    want = exact_grad(name, theta, ref, params["reward"])
    assert (got - want).abs().max() < 1e-12 * max(1.0, want.abs().max().item())
    # not vacuous: without the correction, samples of mu give a different gradient
    assert rel_err(expected_grad(*args, OFF, weight_level="sequence", **cfg), want) > 1e-2


@pytest.mark.parametrize("ref_kind", ["old", "other"])
def test_seq_level_corrected_grpo_is_urkl_from_samples_of_mu(ref_kind, params):
    theta, old, mu = params["theta"], params["old"], params["mu"]
    ref = params["ref"] if ref_kind == "other" else old
    got = expected_grad(("grpo_kl_corrected", "differentiable"), theta, old, mu,
                        None if ref_kind == "old" else ref, params["reward"], SEQ, weight_level="sequence",
                        **WIDE)  # fmt: skip
    want = exact_grad("urkl", theta, ref, params["reward"])
    assert (got - want).abs().max() < 1e-12 * max(1.0, want.abs().max().item())


N_GROUP = 3
_GROUPS = torch.tensor(list(itertools.product(range(len(SEQS)), repeat=N_GROUP)))  # [27^3, n]


def group_advantages_by_formula(reward: torch.Tensor, baseline: str) -> torch.Tensor:
    """[G * n] advantages of every group of n samples: R_i - mean_j R_j or R_i - mean_{j != i} R_j."""
    r = reward[_GROUPS]
    if baseline == "mean":
        return (r - r.mean(-1, keepdim=True)).flatten()
    return (r - (r.sum(-1, keepdim=True) - r) / (N_GROUP - 1)).flatten()


@pytest.mark.parametrize("baseline", ["loo", "mean"])
@pytest.mark.parametrize("style_key", list(STYLES))
@pytest.mark.parametrize("name", DIVS)
def test_seq_level_correction_with_a_group_baseline(name, style_key, baseline, params):
    """Every group of n = 3 samples of mu, exactly: P(group) = prod mu(x_i), loss = the group's mean.
    Leave-one-out: the exact gradient. The paper's group mean (self included) scales the reward
    part by (n - 1)/n: the exact gradient of (n-1)/n E_theta[R] - beta D."""
    style, cfg = STYLES[style_key]
    theta, old, mu, ref = params["theta"], params["old"], params["mu"], params["ref"]
    mu_seq = token_logp(mu).sum(-1).exp()
    row_weight = (mu_seq[_GROUPS].prod(-1, keepdim=True) / N_GROUP).expand(-1, N_GROUP).flatten()
    adv = group_advantages_by_formula(params["reward"], baseline)
    got = expected_grad((name, style), theta, old, mu, ref, adv, SEQ, _GROUPS.flatten(), row_weight,
                        weight_level="sequence", **cfg)  # fmt: skip
    scale = 1.0 if baseline == "loo" else (N_GROUP - 1) / N_GROUP
    want = exact_grad(name, theta, ref, params["reward"] * scale)
    assert (got - want).abs().max() < 1e-11 * max(1.0, want.abs().max().item())


# ------------------------------------------------------------------ invariance, every registered pair
@pytest.mark.parametrize("weight_level", ["token", "sequence"])
@pytest.mark.parametrize("ref_kind", ["old", "other"])
@pytest.mark.parametrize("key", sorted(LOSSES), ids="/".join)
def test_seq_level_correction_makes_the_gradient_independent_of_the_sampler(
    key, ref_kind, weight_level, params
):
    """sum_x mu(x) grad[c(x) L(x)] = sum_x pi_old(x) grad L(x), exactly: what the loss's gradient
    is when the samples come from pi_old, for every registered loss (clipping windows that bind)."""
    theta, old, mu = params["theta"], params["old"], params["mu"]
    ref = params["ref"] if ref_kind == "other" else None
    adv = params["reward"] - 0.3
    cfg = dict(PAPER, weight_level=weight_level)
    want = expected_grad(key, theta, old, old, ref, adv, OFF, **cfg)
    got = expected_grad(key, theta, old, mu, ref, adv, SEQ, **cfg)
    assert (got - want).abs().max() < 1e-13 * max(1.0, want.abs().max().item())
    assert want.norm() > 1e-2
    assert rel_err(expected_grad(key, theta, old, mu, ref, adv, OFF, **cfg), want) > 1e-2


# ------------------------------------------------------------------ the token level: an approximation
def _with_rows(theta: torch.Tensor, positions: tuple[int, ...], scale: float, seed: int) -> torch.Tensor:
    """theta with the logit rows of the prefixes at the given positions perturbed (prefix rows of
    position t are V^t rows starting at sum_{s<t} V^s)."""
    g = torch.Generator().manual_seed(seed)
    out = theta.clone()
    for t in positions:
        start = sum(V**s for s in range(t))
        out[start : start + V**t] += scale * torch.randn(V**t, V, generator=g, dtype=F64)
    return out


TOKEN_KEYS = [(n, "differentiable") for n in DIVS] + [(n, "reinforce") for n in DIVS]


@pytest.mark.parametrize("key", TOKEN_KEYS, ids="/".join)
def test_token_level_correction_is_exact_for_a_last_position_mismatch_without_advantage(key, params):
    """E_mu[c_t f(x_{<=t})] = E_{x_{<t} ~ mu} E_{o_t ~ pi_old}[f]: the token weight corrects position
    t's own token, not its prefix. With mu = pi_old before the last position and a per-token loss
    that depends on x_{<=t} alone (A = 0: the KL terms), it is exact."""
    theta, old, ref = params["theta"], params["old"], params["ref"]
    mu = _with_rows(old, (2,), 0.7, seed=3)
    zero = torch.zeros(len(SEQS), dtype=F64)
    cfg = dict(clip_reward=False) if key[1] == "differentiable" else {}
    want = expected_grad(key, theta, old, old, ref, zero, OFF, **cfg)
    got = expected_grad(key, theta, old, mu, ref, zero, TOKEN, **cfg)
    assert (got - want).abs().max() < 1e-14 * max(1.0, want.abs().max().item())
    assert rel_err(expected_grad(key, theta, old, mu, ref, zero, OFF, **cfg), want) > 1e-2  # mismatch matters


@pytest.mark.parametrize("key", TOKEN_KEYS, ids="/".join)
def test_token_level_correction_misses_the_prefix_and_the_suffix(key, params):
    """Token weights pi_old(o_t|h_t)/mu(o_t|h_t) are an approximation, the seq-level weight exact: a
    mismatch before position t reaches t's prefix (A = 0, mu != pi_old at the first position only);
    the sequence advantage depends on tokens after t drawn from mu (rewards, mu != pi_old at the last
    position only)."""
    theta, old, ref = params["theta"], params["old"], params["ref"]
    zero, reward = torch.zeros(len(SEQS), dtype=F64), params["reward"]
    cfg = dict(clip_reward=False) if key[1] == "differentiable" else {}
    for positions, adv in (((0,), zero), ((2,), reward)):
        mu = _with_rows(old, positions, 0.7, seed=3)
        want = expected_grad(key, theta, old, old, ref, adv, OFF, **cfg)
        got = expected_grad(key, theta, old, mu, ref, adv, TOKEN, **cfg)
        assert rel_err(got, want) > 1e-2, positions
        seq = expected_grad(key, theta, old, mu, ref, adv, SEQ, **cfg)
        assert rel_err(seq, want) < 1e-13, positions


# ------------------------------------------------------------------ mask / clip mechanics, by formula
def mismatch_batch(seed: int = 0, b: int = 12, t: int = 10) -> dict[str, torch.Tensor]:
    """Token log-ratios log(pi_old/mu) spread over [-0.6, 0.6], a float mask with one empty row."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2 - 0.05
    mask = (torch.rand(b, t, generator=g) > 0.2).to(F64)
    mask[0] = 0.0
    mask[:, 0] = torch.where(torch.arange(b) == 0, 0.0, 1.0).to(F64)
    return {
        "logp": (old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(),
        "old_logp": old,
        "advantages": torch.randn(b, t, generator=g, dtype=F64),
        "action_mask": mask,
        "rollout_logp": (old + torch.empty(b, t, dtype=F64).uniform_(-0.6, 0.6, generator=g)).clamp(
            max=-1e-3
        ),
    }


def stats_by_formula(x: dict, gating: str, seq: bool) -> torch.Tensor:
    """OpenRLHF's gating statistic, written out: token [B, T] or per sequence [B, 1]."""
    m, r = x["action_mask"], x["old_logp"] - x["rollout_logp"]
    n = m.sum(-1, keepdim=True).clamp(min=1)
    p = x["rollout_logp"].exp().clamp(1e-6, 1 - 1e-6)
    q = x["old_logp"].exp().clamp(1e-6, 1 - 1e-6)
    if gating == "ratio":
        return ((r * m).sum(-1, keepdim=True) / n).exp() if seq else r.exp()
    stat = (
        p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
        if gating == "binary_kl"
        else (p - q).abs()
    )
    return (stat * m).sum(-1, keepdim=True) / n if seq else stat


CASES = [  # (level, mode, gating, low, high)
    ("token", "mask", "ratio", 0.8, 1.25),
    ("token", "clip", "ratio", 0.8, 1.25),
    ("token", "mask", "binary_kl", 0.0, 0.02),
    ("token", "mask", "tv", 0.0, 0.1),
    ("seq", "mask", "ratio", 0.95, 1.05),
    ("seq", "mask", "binary_kl", 0.0, 0.05),
    ("seq", "mask", "tv", 0.0, 0.11),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_mask_and_clip_by_formula_and_against_openrlhf(case):
    """The weight (a stop-gradient factor of the whole loss), the filter and the metrics by formula
    (OpenRLHF's gating statistic written out); an empty sequence is no unit. Then OpenRLHF 0.11.2's
    PolicyLoss on the same tensors (beta = 0: PPO on the reward alone, as PolicyLoss): the units it
    filters are filtered here, with the same is_filter_ratio and vllm_kl. At token level the weights are
    OpenRLHF's too (loss and gradient equal); at seq level the surviving sequences get the exact ratio
    pi_old(x)/mu(x) here and each token its own ratio in OpenRLHF (the one difference)."""
    level, mode, gating, low, high = case
    key = ("fkl", "differentiable")
    corr = RolloutCorrection(level=level, mode=mode, gating=gating, low=low, high=high)
    config = LossConfig(beta=0.0, clip_c=3.0, rollout_correction=corr)
    x = mismatch_batch()
    m, r = x["action_mask"], x["old_logp"] - x["rollout_logp"]
    stat = stats_by_formula(x, gating, level == "seq")
    out = (stat < low) | (stat > high)
    if level == "seq":
        units = m.sum(-1, keepdim=True) > 0
        weight = torch.where(out, 0.0, (r * m).sum(-1, keepdim=True).exp())
    else:
        units = m > 0
        weight = r.exp().clamp(low, high) if mode == "clip" else torch.where(out, 0.0, r.exp())
    assert (out & units).any() and (~out & units).any()  # the band filters some units, not all
    plain = {k: v for k, v in x.items() if k != "rollout_logp"}
    off, _, _ = token_losses(*key, config=dataclasses.replace(config, rollout_correction=OFF), **plain)
    on, _, _ = token_losses(*key, config=config, **x)
    torch.testing.assert_close(on, weight * off, rtol=1e-14, atol=0)
    g_on, g_off = (torch.autograd.grad((v * m).sum(), x["logp"])[0] for v in (on, off))
    torch.testing.assert_close(g_on, weight * g_off, rtol=1e-14, atol=1e-300)  # a stop-gradient weight
    # token-mean: a filtered token still counts in the denominator
    loss, metrics = compute_loss(*key, config=config, **x)
    torch.testing.assert_close(loss, (weight * off * m).sum() / m.sum(), rtol=1e-13, atol=0)
    assert metrics["vllm_kl"] == pytest.approx(
        ((x["rollout_logp"] - x["old_logp"]) * m).sum().item() / m.sum().item()
    )
    n_units = units.sum().item()
    assert metrics["is_filter_ratio"] == pytest.approx((out & units).sum().item() / n_units, rel=1e-12)
    assert metrics["is_weight_mean"] == pytest.approx(torch.where(units, weight, 0.0).sum().item() / n_units)
    assert list(metrics) == [*METRIC_NAMES, *CORRECTION_METRICS]

    x["action_mask"][0, :3] = 1.0  # OpenRLHF gives an empty sequence a NaN statistic: none here
    m = x["action_mask"]
    theirs_fn = openrlhf_models_file("loss").PolicyLoss(0.2, 0.28, dual_clip=3.0, is_correction_level=level, is_correction_mode=mode,
                                     is_correction_gating=gating, is_correction_threshold=[low, high])  # fmt: skip
    theirs, _, _, vllm_kl, filter_ratio = theirs_fn(
        x["logp"], x["old_logp"], x["advantages"], m, rollout_log_probs=x["rollout_logp"]
    )
    ours, metrics = compute_loss(*key, config=config, **x)
    # OpenRLHF's seq-level fraction is a float32 mean
    assert metrics["is_filter_ratio"] == pytest.approx(
        filter_ratio.item(), rel=1e-12 if level == "token" else 1e-7
    )
    assert metrics["vllm_kl"] == pytest.approx(vllm_kl.item(), rel=1e-12)
    assert 0 < filter_ratio.item() < 1
    g_theirs, g_ours = (torch.autograd.grad(v, x["logp"])[0] for v in (theirs, ours))
    if level == "token":
        torch.testing.assert_close(ours, theirs, rtol=1e-13, atol=0)
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-13, atol=1e-300)
        return
    # seq: the same sequences dropped; survivors carry exp(sum_t r_t) instead of exp(r_t) per token
    seq_c = (r * m).sum(-1, keepdim=True).exp()
    kept = (g_ours != 0).any(-1, keepdim=True)
    assert torch.equal(kept, (g_theirs != 0).any(-1, keepdim=True))
    torch.testing.assert_close(
        g_ours, torch.where(kept, g_theirs / r.exp() * seq_c, 0.0), rtol=1e-12, atol=1e-300
    )


def test_level_off_ignores_rollout_logp_but_reports_vllm_kl():
    x = mismatch_batch(seed=2)
    plain = {k: v for k, v in x.items() if k != "rollout_logp"}
    config = LossConfig(beta=0.2)
    a, ma = compute_loss("urkl", "reinforce_clip", config=config, **plain)
    b, mb = compute_loss("urkl", "reinforce_clip", config=config, **x)
    assert torch.equal(a, b)
    assert set(ma) == set(METRIC_NAMES) and set(mb) == {*METRIC_NAMES, "vllm_kl"}
    assert {k: mb[k] for k in ma} == ma


def test_the_log_of_the_weight_is_clamped_like_the_other_log_ratios():
    """A sequence with sum_t log(pi_old/mu) = 8 * 10 = 80 gets e^20 (log_ratio_clamp), not e^80."""
    old = torch.full((2, 10), -1.0, dtype=F64)
    rollout = old - torch.tensor([[8.0], [0.1]], dtype=F64)
    logp = old.clone().requires_grad_()
    adv = torch.ones(2, dtype=F64)
    off, _, _ = token_losses("urkl", "reinforce", logp, old, adv)
    for corr, want in ((SEQ, [[20.0], [1.0]]), (TOKEN, [[8.0], [0.1]])):
        on, _, _ = token_losses("urkl", "reinforce", logp, old, adv, rollout_logp=rollout,
                                config=LossConfig(rollout_correction=corr))  # fmt: skip
        torch.testing.assert_close(on, off * torch.tensor(want, dtype=F64).exp(), rtol=1e-14, atol=0)
    cfg = LossConfig(rollout_correction=SEQ, log_ratio_clamp=5.0)
    on, _, _ = token_losses("urkl", "reinforce", logp, old, adv, rollout_logp=rollout, config=cfg)
    torch.testing.assert_close(on[0], off[0] * math.exp(5.0), rtol=1e-14, atol=0)


# ------------------------------------------------------------------ validation
def test_choices_are_openrlhfs():
    assert CORRECTION_LEVELS == ("off", "token", "seq")
    assert CORRECTION_MODES == ("mask", "clip")
    assert CORRECTION_GATINGS == ("ratio", "binary_kl", "tv")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(level="sequence"), "level"),
        (dict(mode="truncate"), "mode"),
        (dict(gating="kl"), "gating"),
        (dict(low=-0.1), "low"),
        (dict(low=2.0, high=1.0), "high"),
        (dict(high=math.nan), "high"),
        (dict(level="seq", mode="clip"), "mode"),
        (dict(level="token", gating="binary_kl", low=0.5), "low"),
    ],
)
def test_bad_correction_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        RolloutCorrection(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(level="seq", low=0.0, high=math.inf),
        dict(level="token", mode="clip", low=0.5, high=2.0),
        dict(level="off", gating="tv"),  # OpenRLHF checks the bound only with the correction on
    ],
)
def test_valid_corrections_are_accepted(kwargs):
    RolloutCorrection(**kwargs)


def test_loss_config_checks_the_correction_and_round_trips_through_asdict():
    with pytest.raises(
        ValueError, match=r"^rollout_correction: token-level correction needs token-level weights"
    ):
        LossConfig(weight_level="sequence", rollout_correction=RolloutCorrection(level="token"))
    with pytest.raises(ValueError, match=r"^rollout_correction:"):
        LossConfig(rollout_correction="seq")
    LossConfig(weight_level="sequence", rollout_correction=SEQ)
    config = LossConfig(beta=0.1, rollout_correction=RolloutCorrection(level="seq", low=0.9, high=1.1))
    assert LossConfig(**dataclasses.asdict(config)) == config


@pytest.mark.parametrize(
    "level, value, message",
    [
        ("token", None, "required"),
        ("seq", lambda x: x[:, :4], "shape"),
        ("token", lambda x: x.index_fill(1, torch.tensor([2]), math.nan), "NaN"),
        ("off", lambda x: x.index_fill(0, torch.tensor([1]), math.nan), "NaN"),
    ],
)
def test_bad_rollout_logp_names_it(level, value, message):
    x = mismatch_batch(seed=8)
    x["rollout_logp"] = None if value is None else value(x["rollout_logp"])
    config = LossConfig(rollout_correction=RolloutCorrection(level=level))
    with pytest.raises(ValueError, match=rf"^rollout_logp:.*{message}"):
        compute_loss("urkl", "reinforce_clip", config=config, **x)
