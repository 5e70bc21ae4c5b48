"""Every framework's KL option (rpg_openrlhf/core/kl_options.py, docs/kl-options.md), checked two ways:

1. its per-token value and gradient are the framework's own formula, written here literally (autograd
   through the framework's expression, clamps included, on log-ratios that reach every clamp);
2. the published claims, exactly, on a policy small enough to enumerate (vocabulary 3, length 3: 27
   sequences, float64): the expected gradient E_old[grad L] is an exact pi_old-weighted sum, the
   targets are autograd through divergences computed here from the enumerated probabilities.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from rpg_openrlhf.core import KL_OPTION_NAMES, LOSSES, LossConfig, SettingError, check_loss, token_losses
from rpg_openrlhf.mechanisms.atlas import options, verdict

F64 = torch.float64
BETA = 0.3
V, L = 3, 3
SEQS = torch.tensor(list(itertools.product(range(V), repeat=L)))
N_PREFIX = sum(V**t for t in range(L))
#: the logit-table row of token t of each sequence: its prefix as a base-V number, after all shorter ones
PREFIX = torch.stack([sum(V**j for j in range(t)) + torch.arange(V**L) // V ** (L - t) for t in range(L)], 1)


# ------------------------------------------------------------------ 1. the frameworks' literal formulas
def _k3_openrlhf(lr):  # OpenRLHF 0.11.2 compute_approx_kl, estimator k3 (lr = log pi - log ref)
    x = lr.clamp(min=-10)
    return ((-x).exp() - 1 + x).clamp(-10, 10)


def _k3_verl(lp, ref):  # verl kl_penalty_forward low_var_kl
    kl = (ref - lp).clamp(-20, 20)
    return (kl.exp() - kl - 1).clamp(-10, 10)


def _nemo(lp, ref, weight):  # NeMo-RL calculate_kl(k3, input clamp 20, output clamp 10, weights)
    logr = ref - lp
    clamped = logr.clamp(-20, 20)
    weight = torch.where(logr == clamped, weight, weight.detach())
    return (weight * (clamped.exp() - 1 - clamped)).clamp(-10, 10)


def _straight_through(value, surrogate):
    return value.detach() + surrogate - surrogate.detach()


def _reward(k):  # in the reward, A = 0: -w A'_t / beta = w sum_{s>=t} k_s, k of pi_old against pi_ref,
    # w PolicyLoss's ratio: exp(clamp(log pi - log pi_old, -20, 20))
    return lambda lp, old, ref: (lp - old).clamp(-20, 20).exp() * k(old - ref).flip(-1).cumsum(-1).flip(-1)


LITERAL = {
    "openrlhf_k1_loss": lambda lp, old, ref: (lp - ref).clamp(-10, 10),
    "openrlhf_k2_loss": lambda lp, old, ref: ((lp - ref) ** 2 / 2).clamp(-10, 10),
    "openrlhf_k3_loss": lambda lp, old, ref: _k3_openrlhf(lp - ref),
    "verl_low_var_kl": lambda lp, old, ref: _k3_verl(lp, ref),
    "openrlhf_k3_unbiased_gradient": lambda lp, old, ref: _straight_through(
        _k3_openrlhf(lp - ref), (lp - old).exp().clamp(max=10).detach() * (lp - ref) ** 2 / 2
    ),
    "verl_k1": lambda lp, old, ref: lp - ref,
    "verl_k2": lambda lp, old, ref: 0.5 * (lp - ref).square(),
    "verl_abs": lambda lp, old, ref: (lp - ref).abs(),
    "verl_k3plus": lambda lp, old, ref: _straight_through(_k3_verl(lp, ref), 0.5 * (lp - ref).square()),
    "nemo_rl_k3": lambda lp, old, ref: _nemo(lp, ref, (lp - lp.detach()).exp()),
    "nemo_rl_k3_on_policy": lambda lp, old, ref: _nemo(lp, ref, (lp - old).exp()),
    "trl_k3": lambda lp, old, ref: (ref - lp).exp() - (ref - lp) - 1,
    "trl_k3_bias_corrected": lambda lp, old, ref: ((ref - lp).exp() - (ref - lp) - 1) * (lp - old).exp(),
    "deepseek_v32_k3": lambda lp, old, ref: (lp - old).exp() * ((ref - lp).exp() - (ref - lp) - 1),
    "slime_k3_unbiased": lambda lp, old, ref: (lp - old).exp() * ((ref - lp).exp() - 1 - (ref - lp)),
    "slime_k1_unbiased": lambda lp, old, ref: (lp - old).exp() * (lp - ref),
    "openrlhf_k1_reward": _reward(lambda x: x.clamp(-10, 10)),
    "openrlhf_k2_reward": _reward(lambda x: (x**2 / 2).clamp(-10, 10)),
    "openrlhf_k3_reward": _reward(_k3_openrlhf),
}  # fmt: skip


def _extreme_batch() -> dict[str, torch.Tensor]:
    """log pi - log ref across (-30, 30) (every clamp: k1 at 10, k2 at sqrt(20), k3 below -2.4,
    NeMo-RL's input clamp at 20), log pi_ref/pi_old across (-26, 26) and, in the last row, log w
    across (-24, 24): beyond the core's own +-20 log-ratio clamp, which the frameworks do not have
    (issue 39: with it, a token the reference rates below e^-20 pi_old left verl_k2, verl_k3plus, the
    corrected k3 and OpenRLHF's unbiased_gradient 8-12 % off upstream)."""
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(4, 40, generator=g, dtype=F64) - 2
    log_w = 2.5 * (2 * torch.rand(4, 40, generator=g, dtype=F64) - 1)
    log_w[3] = torch.linspace(-24, 24, 40, dtype=F64)
    log_rho = torch.linspace(-26, 26, 160, dtype=F64).reshape(4, 40)
    log_rho[3] = torch.linspace(-3, 3, 40, dtype=F64).flip(0)
    old = lp - log_w
    return {"lp": lp, "old": old, "ref": old + log_rho}


@pytest.mark.parametrize("name", KL_OPTION_NAMES)
def test_value_and_gradient_are_the_frameworks_formula(name: str) -> None:
    """Every option: its value and gradient are the formula written above (and its docstring states it)."""
    doc = " ".join(LOSSES[(name, "differentiable")].__doc__.split())
    assert "L = PPO(w, A" in doc and "beta" in doc
    x = _extreme_batch()
    lp = x["lp"].clone().requires_grad_()
    # A = 0 and the plain reward term: the per-token loss is the KL part alone, beta times the formula
    loss, _, _ = token_losses(name, "differentiable", lp, x["old"], torch.zeros(4), None, x["ref"],
                              LossConfig(beta=BETA, clip_reward=False))  # fmt: skip
    lp2 = x["lp"].clone().requires_grad_()
    want = BETA * LITERAL[name](lp2, x["old"], x["ref"])
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    (g_want,) = torch.autograd.grad(want.sum(), lp2)
    # beyond |l| = 5 the literal w k3 loses digits to cancellation (its two gradient terms are ~e^|l|)
    near = (x["lp"] - x["ref"]).abs() <= 5
    torch.testing.assert_close(g[near], g_want[near], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g[~near], g_want[~near], rtol=1e-6, atol=1e-9)
    assert g_want.abs().max() > 1e-3  # not vacuous
    beyond = ((x["lp"] - x["old"]).abs() > 20) | ((x["ref"] - x["old"]).abs() > 20)
    assert beyond.sum() >= 20  # tokens where the core's clamp would bind (compared above like the rest)


@pytest.mark.parametrize("name", KL_OPTION_NAMES)
def test_the_released_codes_kl_settings_are_refused_for_a_framework_option(name: str) -> None:
    """--rpg.kl_rho off and --rpg.kl_value_clamp K belong to RPG's own losses: the docs say they do
    not apply to a framework's option, and the option refuses them rather than change (issue 39:
    kl_rho off moved grpo_kl_corrected's aliases by 0.66 of the gradient, slime_k1_unbiased by 1.7)."""
    settings = ((LossConfig(kl_rho=False), "kl_rho"), (LossConfig(kl_value_clamp=10.0), "kl_value_clamp"))
    for cfg, flag in settings:
        with pytest.raises(SettingError) as info:
            check_loss(name, "differentiable", cfg)
        assert info.value.fields == (flag, "name") and "framework" in info.value.message
    for own in ("grpo_kl", "grpo_kl_corrected", "rkl"):
        check_loss(own, "differentiable", LossConfig(kl_rho=False, kl_value_clamp=10.0))


@pytest.mark.parametrize("flags", [["--rpg.kl_rho", "off"], ["--rpg.kl_value_clamp", "10"]])
def test_rpg_train_refuses_the_released_codes_kl_settings_for_a_framework_option(flags, capsys) -> None:
    from test_rpg_flags import dry_run_error

    err = dry_run_error(["--rpg.loss", "trl_k3_bias_corrected", *flags], capsys)
    assert f"error: {flags[0]} {flags[1]}" in err and "with --rpg.loss trl_k3_bias_corrected: " in err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ 2. the published claims, exactly
def token_logp(theta: torch.Tensor) -> torch.Tensor:
    return theta[PREFIX].log_softmax(-1).gather(-1, SEQS.unsqueeze(-1)).squeeze(-1)


def seq_div(name: str, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    p, q = logp.exp(), logq.exp()
    return {"fkl": (q * (logq - logp)).sum(), "rkl": (p * (logp - logq)).sum()}[name]


def target_grad(name: str, level: str, theta, old, ref) -> torch.Tensor:
    """Exact gradient of the divergence: sequence level D(pi_theta, pi_ref); token level
    sum_h pi_old(h) D(pi_theta(.|h), pi_ref(.|h)) with the prefix weights pi_old(h) held fixed."""
    th = theta.clone().requires_grad_()
    if level == "sequence":
        d = seq_div(name, token_logp(th).sum(-1), token_logp(ref).sum(-1))
    else:
        old_tok = token_logp(old)
        reach = torch.cat([torch.zeros(len(SEQS), 1, dtype=F64), old_tok.cumsum(-1)[:, :-1]], 1).exp()
        w = torch.zeros(N_PREFIX, dtype=F64).index_put_((PREFIX.reshape(-1),), reach.reshape(-1))
        lp, lq = th.log_softmax(-1), ref.log_softmax(-1)
        per = {"fkl": (lq.exp() * (lq - lp)).sum(-1), "rkl": (lp.exp() * (lp - lq)).sum(-1)}[name]
        d = (w * per).sum()
    return torch.autograd.grad(d, th)[0]


def expected_grad(name: str, level: str, theta, old, ref, **cfg) -> torch.Tensor:
    """grad of E_old[sum of the option's per-sample loss], A = 0, beta = 1 (the KL part alone)."""
    th = theta.clone().requires_grad_()
    old_tok = token_logp(old)
    config = LossConfig(beta=1.0, weight_level=level, clip_reward=False, **cfg)
    loss, mask, _ = token_losses(name, "differentiable", token_logp(th), old_tok, torch.zeros(len(SEQS), dtype=F64),
                                 None, token_logp(ref), config)  # fmt: skip
    return torch.autograd.grad((old_tok.sum(-1).exp()[:, None] * loss * mask).sum(), th)[0]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def pol() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = 0.8 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)
    return {"old": old, "theta": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64),
            "ref": old + 0.4 * torch.randn(N_PREFIX, V, generator=g, dtype=F64)}  # fmt: skip


LEVELS = ("sequence", "token")


def test_k3_expectation_is_the_unnormalized_kl(pol) -> None:
    """E_theta[k3(pi_ref/pi_theta)] = KL(pi_theta || pi_ref) (= its unnormalized form for normalized
    policies) and E_old[w k3(pi_ref/pi_theta)] is the same number from samples of pi_old."""
    lp, lo, lq = (token_logp(pol[k]).sum(-1) for k in ("theta", "old", "ref"))
    k3 = (lq - lp).exp() - 1 - (lq - lp)
    ukl = (lp.exp() * (lp - lq) - lp.exp() + lq.exp()).sum()
    assert abs((lp.exp() * k3).sum() - ukl) < 1e-14 and abs(ukl - seq_div("rkl", lp, lq)) < 1e-14
    assert abs((lo.exp() * (lp - lo).exp() * k3).sum() - ukl) < 1e-14
    assert abs((lo.exp() * k3).sum() - ukl) > 1e-3  # without the weight, off-policy: not the KL


#: option -> (the gradient its expected update has on-policy, at both levels; whether it keeps it off-policy)
ON_AND_OFF_POLICY = {
    # k3(pi_ref/pi_theta) as a loss: KL(pi_ref || pi_theta), over whole sequences at sequence level, the
    # pi_old-weighted per-prefix FKL at token level; off-policy neither KL
    "trl_k3": ("fkl", False),
    "openrlhf_k3_loss": ("fkl", False),
    # w k3 with w's gradient (TRL, DeepSeek-V3.2, slime, NeMo-RL) and OpenRLHF's SG(w) l grad logp: the
    # (U)RKL gradient on- and off-policy (no clamp binds here: w < 10 and k3 < 1)
    "trl_k3_bias_corrected": ("rkl", True),
    "nemo_rl_k3_on_policy": ("rkl", True),
    "openrlhf_k3_unbiased_gradient": ("rkl", True),
    # k1 as a loss: no gradient on-policy
    "verl_k1": ("zero", False),
    "openrlhf_k1_loss": ("zero", False),
    # k2's gradient l grad logp (verl's k3+, NeMo-RL's value-1 weight): RKL on-policy, no importance weight
    "verl_k3plus": ("rkl", False),
    "nemo_rl_k3": ("rkl", False),
    "openrlhf_k2_loss": ("rkl", False),
    # k2 as a loss = k1 in the reward on-policy (Liu et al. 2510.01555) at sequence level; at token level
    # k1 in the reward (returns-to-go) still descends the sequence RKL, k2 as a loss the per-prefix RKL
    "verl_k2": ("rkl", False),
    "openrlhf_k1_reward": ("seq_rkl", False),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ON_AND_OFF_POLICY)
def test_the_gradient_of_each_option_on_and_off_policy(name, level, pol) -> None:
    old, ref, theta = pol["old"], pol["ref"], pol["theta"]
    target, off_too = ON_AND_OFF_POLICY[name]
    assert float((token_logp(theta) - token_logp(old)).exp().max()) < 10  # OpenRLHF's clamp of w at 10
    on, off = expected_grad(name, level, old, old, ref), expected_grad(name, level, theta, old, ref)
    on_kl = {d: target_grad(d, level, old, old, ref) for d in ("fkl", "rkl")}
    on_kl["seq_rkl"] = target_grad("rkl", "sequence", old, old, ref)
    off_kl = {d: target_grad(d, level, theta, old, ref) for d in ("fkl", "rkl")}
    assert rel(on_kl["rkl"], on_kl["fkl"]) > 0.05  # the two KLs are told apart here
    assert level == "sequence" or rel(on_kl["rkl"], on_kl["seq_rkl"]) > 0.05  # and the two levels
    if target == "zero":
        assert on.norm() < 1e-14 * on_kl["rkl"].norm() and off.norm() > 0.05 * on_kl["rkl"].norm()
    elif off_too:
        assert rel(on, on_kl[target]) < 1e-12 and rel(off, off_kl[target]) < 1e-12
    else:
        assert rel(on, on_kl[target]) < 1e-12 and min(rel(off, g) for g in off_kl.values()) > 0.05


def test_trl_pr_6503_on_policy_change_is_a_closed_form() -> None:
    """TRL PR #6503's review: use_bias_correction_kl changes the gradient by ~21% even on-policy. Its
    script has log pi_ref = log pi_theta - 0.4 on every token, so l = 0.4 everywhere: the corrected
    gradient is l grad logp, the plain one (1 - e^-l) grad logp, parallel, and the change is exactly
    l / (1 - e^-l) - 1 = 0.2133 for any logits. With a normalized pi_ref the change is instead
    ||grad URKL - grad FKL|| / ||grad FKL|| on-policy, which depends on pi_ref."""
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=F64)
    grads = []
    for name in ("trl_k3", "trl_k3_bias_corrected"):
        x = logits.clone().requires_grad_()
        lp = torch.log_softmax(x, -1)[..., 0]  # on-policy (pi_old = pi_theta), l = 0.4 on every token
        loss, _, _ = token_losses(name, "differentiable", lp, lp.detach(), torch.zeros(3, dtype=F64), None,
                                  lp.detach() - 0.4, LossConfig(beta=1.0, clip_reward=False))  # fmt: skip
        grads.append(torch.autograd.grad(loss.sum(), x)[0])
    change = rel(grads[1], grads[0])
    assert abs(change - (0.4 / -math.expm1(-0.4) - 1)) < 1e-12 and abs(change - 0.2133) < 1e-4


def test_docs_state_every_verdict_of_the_committed_atlas() -> None:
    """docs/kl-options.md holds, word for word, the verdict of every option the committed atlas run
    (results/mechanisms/exp5_kl_atlas_summary.csv) computed: the docs say what the table says."""
    root = Path(__file__).resolve().parents[1]
    summary = pd.read_csv(root / "results" / "mechanisms" / "exp5_kl_atlas_summary.csv")
    docs = " ".join((root / "docs" / "kl-options.md").read_text().split())
    assert len(summary) == 2 * len(options())
    for _, row in summary.iterrows():
        assert " ".join(verdict(row).split()) in docs, (row["option"], row["level"])
