"""The released code's departures from the paper, each an explicit option of the core.

Every expected value here is a formula written in this file, following the released
verl code (github.com/complex-reasoning/RPG, verl/trainer/ppo/core_algos.py and
verl/workers/actor/dp_actor.py) as docs/losses.md describes it; nothing is built from the
module's own helpers. Each option also gets a check that it departs from the paper's text
where the released code does (a vanishing gradient, a different branch, a different weight).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from rpg_openrlhf.core import LossConfig, aggregate, compute_loss, token_losses

F64 = torch.float64
DIVS = ("fkl", "rkl", "ufkl", "urkl")
EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0


def grad_of(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(loss.sum(), logp, retain_graph=True)[0]


def batch(seed: int, b: int = 6, t: int = 40, spread: float = 0.6, ref: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    return {
        "logp": (old + spread * torch.randn(b, t, generator=g, dtype=F64)).requires_grad_(),
        "old_logp": old,
        "ref_logp": old + spread * torch.randn(b, t, generator=g, dtype=F64) if ref else None,
        "advantages": torch.randn(b, t, generator=g, dtype=F64),
    }


# --------------------------------------------------------------------- 1. KL value clamp
def kl_value_rho1(name: str, w: torch.Tensor) -> torch.Tensor:
    """The released rpg_* KL penalties, pi_ref = pi_old (w = pi_theta / pi_old), before the clamp."""
    return {
        "fkl": -w.log(),
        "rkl": w * w.log(),
        "ufkl": w - w.log() - 1,
        "urkl": w * (w.log() - 1) + 1,
    }[name]


@pytest.mark.parametrize("name", DIVS)
def test_kl_value_clamp_matches_the_released_penalty_and_zeroes_the_gradient(name):
    # A = 0: the PPO reward term is 0 and carries no gradient, so L = beta D_t alone.
    w = torch.tensor([[0.05, 0.5, 1.0, 2.0, 5.6, 5.8, 8.1, 8.3, 13.5, 13.7, 30.0, math.exp(-11)]], dtype=F64)
    old = torch.full_like(w, -2.0)
    logp = (old + w.log()).requires_grad_()
    adv = torch.zeros_like(w)
    clamped = LossConfig(beta=1.0, kl_value_clamp=10.0)
    loss, _, _ = token_losses(name, "differentiable", logp, old, adv, config=clamped)
    d_t = kl_value_rho1(name, w)
    want = d_t if name == "fkl" else d_t.clamp(-10, 10)  # the released rpg_fkl is not clamped
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-12)
    score = {"fkl": -torch.ones_like(w), "rkl": w * (w.log() + 1), "ufkl": w - 1, "urkl": w * w.log()}[name]
    inside = torch.ones_like(w, dtype=torch.bool) if name == "fkl" else d_t.abs() < 10
    g = grad_of(loss, logp)
    torch.testing.assert_close(g, torch.where(inside, score, 0.0), rtol=0, atol=1e-12)
    if name == "fkl":
        assert d_t[0, -1] > 10  # -log w = 11: beyond 10, still not clamped, gradient -1
        return
    # the released KL gradient vanishes past the clamp (w = 5.8, 8.3, 13.7 just past RKL's, URKL's,
    # UFKL's threshold of docs/losses.md); the paper's (default) gradient does not
    paper, _, _ = token_losses(name, "differentiable", logp, old, adv, config=LossConfig(beta=1.0))
    assert (~inside).any() and (grad_of(paper, logp)[~inside].abs() > 0.5).all()


def test_kl_value_clamp_clamps_grpo_k3_like_the_released_low_var_kl():
    w = torch.tensor([[1e-6, 0.05, 0.5, 1.0, 3.0]], dtype=F64)
    old = torch.full_like(w, -1.0)
    logp = (old + w.log()).requires_grad_()
    loss, _, _ = token_losses(
        "grpo_kl",
        "differentiable",
        logp,
        old,
        torch.zeros_like(w),
        config=LossConfig(beta=1.0, kl_value_clamp=10.0),
    )
    y = 1 / w  # pi_ref / pi_theta with pi_ref = pi_old
    k3 = y - 1 - y.log()
    torch.testing.assert_close(loss, k3.clamp(max=10), rtol=0, atol=1e-9)
    torch.testing.assert_close(grad_of(loss, logp), torch.where(k3 < 10, 1 - y, 0.0), rtol=0, atol=1e-9)
    assert k3[0, 0] > 10 and k3[0, 1] > 10 and k3[0, 2] < 10


def test_kl_value_clamp_is_rejected_where_there_is_no_kl_value():
    x = batch(1)
    with pytest.raises(ValueError, match=r"^kl_value_clamp:.*differentiable"):
        compute_loss("urkl", "reinforce_clip", config=LossConfig(kl_value_clamp=10.0), **x)


# --------------------------------------------------------------------- 2. released REINFORCE
def released_terms(x: dict, beta: float) -> dict[str, torch.Tensor]:
    """w, w_h = clamp(w, 1-eps_low, 1+eps_high), rho, A and beta s_t(w_h) for every divergence."""
    w = (x["logp"] - x["old_logp"]).detach().exp()
    rho = (x["ref_logp"] - x["old_logp"]).exp() if x["ref_logp"] is not None else torch.ones_like(w)
    wh = w.clamp(1 - EPS_LOW, 1 + EPS_HIGH)
    log_prh = (wh / rho).log()
    kl = {  # beta s_t at w_h, the KL part of the released coefficient (kl_term = -beta s_t)
        "fkl": -beta * rho,
        "rkl": beta * wh * (log_prh + 1),
        "ufkl": beta * (wh - rho),
        "urkl": beta * wh * log_prh,
    }
    return {"w": w, "wh": wh, "adv": x["advantages"], "kl": kl}


@pytest.mark.parametrize("with_ref", [False, True])
@pytest.mark.parametrize("name", DIVS)
def test_reinforce_released_puts_the_hard_clipped_weight_in_the_coefficient(name, with_ref):
    beta = 0.3
    x = batch(2, ref=with_ref)
    r = released_terms(x, beta)
    coef = r["wh"] * r["adv"] - r["kl"][name]  # A w_ + kl_term, both with w_ = clamp(w)
    cfg = LossConfig(beta=beta, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    loss, _, _ = token_losses(name, "reinforce_released", config=cfg, **x)
    torch.testing.assert_close(loss, -coef * x["logp"].detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(loss, x["logp"]), -coef, rtol=0, atol=1e-12)
    # The departure: the paper's REINFORCE coefficient uses w itself; they differ outside the window.
    paper, _, _ = token_losses(name, "reinforce", config=cfg, **x)
    outside = (r["w"] < 1 - EPS_LOW) | (r["w"] > 1 + EPS_HIGH)
    diff = (grad_of(paper, x["logp"]) - grad_of(loss, x["logp"])).abs()
    assert outside.any() and (diff[outside] > 1e-6).all() and (diff[~outside] < 1e-12).all()


# --------------------------------------------------------------------- 3. released RPG-Style Clip
@pytest.mark.parametrize("with_ref", [False, True])
@pytest.mark.parametrize("name", DIVS)
def test_reinforce_clip_released_branches_on_sign_a(name, with_ref):
    beta = 0.3
    x = batch(3, ref=with_ref, spread=0.7)
    x["advantages"][0, :8] = 0.0  # A = 0 takes the negative branch
    r = released_terms(x, beta)
    w, adv, kl = r["w"], r["adv"], r["kl"][name]
    # dp_actor/core_algos' clip_ppo branch, written out: loss_1 for A > 0, loss_2 otherwise.
    inside = torch.where(adv > 0, w < 1 + EPS_HIGH, (w >= 1 - EPS_LOW) & (w < C))
    coef = w * adv - kl  # Aw_detach's gradient: (A + kl_term / w) w
    k_high, k_low, k_dual = adv * (1 + EPS_HIGH) + kl, adv * (1 - EPS_LOW) + kl, adv * C - kl
    k_clip = torch.where(adv > 0, k_high, torch.where(w >= C, k_dual, k_low))
    cfg = LossConfig(beta=beta, eps_low=EPS_LOW, eps_high=EPS_HIGH, clip_c=C)
    loss, _, _ = token_losses(name, "reinforce_clip_released", config=cfg, **x)
    logp = x["logp"].detach()
    torch.testing.assert_close(loss, torch.where(inside, -coef * logp, -k_clip * logp), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(loss, x["logp"]), torch.where(inside, -coef, 0.0), rtol=0, atol=1e-12)
    # The departures from the paper's RPG-Style Clip (branch on sign(A'), KL part at w not w_h):
    paper, _, _ = token_losses(name, "reinforce_clip", config=cfg, **x)
    diff = (grad_of(paper, x["logp"]) - grad_of(loss, x["logp"])).abs() > 1e-9
    assert diff.any() and not diff.all()


# --------------------------------------------------------------------- 4. no rho weight
@pytest.mark.parametrize("name", DIVS)
def test_kl_rho_false_drops_the_rho_weight(name):
    beta = 1.0
    x = batch(4, spread=0.5)
    x["advantages"] = torch.zeros_like(x["old_logp"])  # isolate the KL part
    pr = (x["logp"] - x["ref_logp"]).exp()  # pi_theta / pi_ref: the released kl_penalty's w
    rho = (x["ref_logp"] - x["old_logp"]).exp()
    released = {
        "fkl": lambda: -pr.log(),
        "rkl": lambda: pr * pr.log(),
        "ufkl": lambda: pr - pr.log() - 1,
        "urkl": lambda: pr * (pr.log() - 1) + 1,
    }[name]()
    cfg = LossConfig(beta=beta, kl_rho=False)
    loss, _, _ = token_losses(name, "differentiable", config=cfg, **x)
    torch.testing.assert_close(loss, released.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(loss, x["logp"]), grad_of(released, x["logp"]), rtol=0, atol=1e-12)
    # the paper's KL part is rho times it (samples come from pi_old), value and gradient
    paper, _, _ = token_losses(name, "differentiable", config=LossConfig(beta=beta), **x)
    torch.testing.assert_close(paper, rho * released.detach(), rtol=0, atol=1e-12)
    assert (rho - 1).abs().max() > 0.5
    # REINFORCE with kl_rho False: coef = w A - beta s_t(pi_theta/pi_ref) (URKL: pr log pr)
    x["advantages"] = torch.randn_like(x["old_logp"])
    w = (x["logp"] - x["old_logp"]).detach().exp()
    loss, _, _ = token_losses("urkl", "reinforce", config=cfg, **x)
    prd = pr.detach()
    torch.testing.assert_close(grad_of(loss, x["logp"]), -(w * x["advantages"] - beta * prd * prd.log()))


# --------------------------------------------------------------------- 5. micro-batch aggregation
@pytest.fixture(scope="module")
def openrlhf_step_norm():
    """OpenRLHF's own per-optimizer-step normalizers (utils/loss_utils.py)."""
    if importlib.util.find_spec("openrlhf") is None:
        pytest.skip("openrlhf is not installed")
    from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

    return _optimizer_step_loss_norm


def micro_batches(dp: int, gas: int, sizes: list[int], t: int = 12) -> list[list[tuple]]:
    """ranks x gas micro-batches of (loss, mask) with ragged lengths, some short, some long."""
    g = torch.Generator().manual_seed(5)
    out = []
    for r in range(dp):
        rank = []
        for i in range(gas):
            b = sizes[(r * gas + i) % len(sizes)]
            lengths = torch.randint(1, t + 1, (b,), generator=g)
            mask = (torch.arange(t) < lengths[:, None]).to(F64)
            rank.append((torch.randn(b, t, generator=g, dtype=F64), mask))
        out.append(rank)
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("sizes", [[4], [2, 5, 3]], ids=["fixed", "dynamic"])
def test_micro_batch_scope_is_the_released_mean_of_micro_batch_means(mode, sizes, openrlhf_step_norm):
    dp, gas = 2, 3
    mbs = micro_batches(dp, gas, sizes)
    info = openrlhf_step_norm([m for rank in mbs for _, m in rank], None, dp, gas)

    def step_loss(scope: str) -> torch.Tensor:  # DeepSpeed: 1/gas per backward; DP: mean of ranks
        return (
            sum(aggregate(loss, mask, mode, scope=scope, **info) / gas for rank in mbs for loss, mask in rank)
            / dp
        )

    # verl: each micro-batch's own mean times len(data) / ppo_mini_batch_size, summed over the step
    n_step = sum(m.shape[0] for rank in mbs for _, m in rank)

    def own_mean(loss, mask):
        if mode == "token-mean":
            return (loss * mask).sum() / mask.sum()
        return ((loss * mask).sum(-1) / mask.sum(-1)).mean()

    want = sum(own_mean(loss, mask) * mask.shape[0] / n_step for rank in mbs for loss, mask in rank)
    torch.testing.assert_close(step_loss("micro_batch"), want, rtol=1e-6, atol=1e-7)
    if len(sizes) == 1:  # fixed micro-batches: the plain mean of the micro-batch means
        means = [own_mean(loss, mask) for rank in mbs for loss, mask in rank]
        torch.testing.assert_close(step_loss("micro_batch"), sum(means) / len(means), rtol=1e-6, atol=1e-7)
    # the paper's (and OpenRLHF's) step scope: one mean over the whole step, which differs
    all_loss = [(l_, m) for rank in mbs for l_, m in rank]
    if mode == "token-mean":
        one_mean = sum((l_ * m).sum() for l_, m in all_loss) / sum(m.sum() for _, m in all_loss)
        torch.testing.assert_close(step_loss("step"), one_mean, rtol=1e-6, atol=1e-7)
        assert abs(step_loss("step") - step_loss("micro_batch")) > 1e-3
    else:  # a mean over sequences is the n_b-weighted mean of micro-batch means: no departure
        torch.testing.assert_close(step_loss("step"), step_loss("micro_batch"))


# --------------------------------------------------------------------- all together
@pytest.mark.parametrize("name", DIVS)
def test_released_options_together_are_the_released_training_loss(name):
    """The released verl loop for a differentiable RPG run, written out: per micro-batch, the
    token mean of dual-clip PPO (clip_ratio_c 10) plus beta times the token mean of its
    clamped rpg_* KL penalty (pi_ref = pi_old), weighted len(data) / ppo_mini_batch_size (its
    dynamic batches, which the paper's scripts use; equal weights for equal sizes). compute_loss with
    clip_c=10, kl_value_clamp=10, kl_rho=False, aggregation_scope="micro_batch" and OpenRLHF's
    per-step normalizers gives the same value and gradient."""
    beta, c, gas = 0.05, 10.0, 3
    g = torch.Generator().manual_seed(7)
    mbs = []
    for b in (3, 2, 4):
        old = -torch.rand(b, 10, generator=g, dtype=F64) * 2
        logp = (old + 1.2 * torch.randn(b, 10, generator=g, dtype=F64)).requires_grad_()  # some w > 10
        adv = torch.randn(b, 1, generator=g, dtype=F64).expand(b, 10)
        lengths = torch.randint(2, 11, (b,), generator=g)
        mbs.append((logp, old, adv, (torch.arange(10) < lengths[:, None]).to(F64)))

    def released(logp, old, adv, mask):
        w = (logp - old).exp()
        pg1, pg2 = -adv * w, -adv * w.clamp(1 - EPS_LOW, 1 + EPS_HIGH)
        clip1 = torch.maximum(pg1, pg2)
        pg = torch.where(adv < 0, torch.minimum(clip1, -adv * c), clip1)
        kl = kl_value_rho1(name, w)
        kl = kl if name == "fkl" else kl.clamp(-10, 10)
        return ((pg * mask).sum() + beta * (kl * mask).sum()) / mask.sum()

    n_seq = sum(mb[0].shape[0] for mb in mbs)
    # verl's dynamic batches (the paper's scripts): each micro-batch's loss times len(data) / mini-batch size
    want = sum(released(*mb) * mb[0].shape[0] / n_seq for mb in mbs)
    cfg = LossConfig(beta=beta, eps_low=EPS_LOW, eps_high=EPS_HIGH, clip_c=c, kl_value_clamp=10.0, kl_rho=False,
                     aggregation_scope="micro_batch")  # fmt: skip
    got = (
        sum(
            compute_loss(name, "differentiable", *mb, config=cfg, global_batch_size=n_seq / gas)[0]
            for mb in mbs
        )
        / gas
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for _mb, g_got, g_want in zip(
        mbs,
        torch.autograd.grad(got, [mb[0] for mb in mbs], retain_graph=True),
        torch.autograd.grad(want, [mb[0] for mb in mbs]),
    ):
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
    w_all = torch.cat([(mb[0] - mb[1]).detach().exp().flatten() for mb in mbs])
    assert (w_all > c).any()  # the dual clip is exercised
