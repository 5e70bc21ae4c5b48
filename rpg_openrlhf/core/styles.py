"""The five styles of an RPG loss, each a formula over one divergence's D_t and score s_t (kl.py).

Notation (docs/losses.md; ../shared/docs/rpg-method.md): samples from pi_old, w = pi_theta/pi_old,
rho = pi_ref/pi_old, A the advantage, SG stop-gradient, s_t = dD_t/dlog pi_theta.
  REINFORCE coefficient  coef = w A - beta s_t    (the gradient of every style is -coef grad log pi_theta)
  regularized advantage  A'   = coef / w
  PPO(r, A)  dual clip:  A >= 0: -A min(r, 1+eps_high);  A < 0: -A clamp(r, 1-eps_low, c)

Every built-in loss is elementwise in log pi_theta, so its gradient is one per-token factor. The
differentiable and clipped styles compute the value and that factor (both written out below)
without autograd and attach the factor as the gradient (`with_gradient`): backward then holds one
[B, T] tensor where autograd through the formula would hold w, A' and masks (bench/loss_cost.py's
memory). The tests hold each value and gradient to the formulas and to autograd. Nothing here
writes into a tensor it was given: in-place operations touch only tensors the function made.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .kl import DIVERGENCES, Divergence
from .terms import ClipWindow, Measured, PolicyTerms


# ------------------------------------------------------------------ attaching a stated gradient
class _GivenGradient(torch.autograd.Function):
    """`value` in the forward; `grad_output * grad` w.r.t. log pi_theta in the backward."""

    @staticmethod
    def forward(ctx, logp: Tensor, value: Tensor, grad: Tensor) -> Tensor:
        ctx.save_for_backward(grad)
        return value

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None


def with_gradient(t: PolicyTerms, value: Tensor, grad: Tensor) -> Tensor:
    """The per-token loss `value` (computed without autograd) whose derivative w.r.t. log pi_theta
    is `grad` (the caller zeroes it where t.w_frozen, if it is a derivative through w)."""
    return _GivenGradient.apply(t.logp, value, grad)


# ------------------------------------------------------------------ PPO and the reward term
@torch.no_grad()
def ppo_value_and_grad(t: PolicyTerms, adv: Tensor) -> tuple[Tensor, Tensor, ClipWindow]:
    """Dual-clip PPO on (w, adv): (value, d value/dlog pi_theta, the window), fresh tensors.
    value    -adv r_eff,  r_eff = min(w, 1+eps_high) (adv >= 0), clamp(w, 1-eps_low, c) (adv < 0)
             (= max(-w A, -clip(w) A), and min(that, -c A) for A < 0: OpenRLHF's PolicyLoss)
    gradient -adv w inside the window (bounds inclusive, as clamp's gradient), 0 outside it and
             where the log-ratio clamp freezes w."""
    cfg = t.config
    lo, hi, c = 1 - cfg.eps_low, 1 + cfg.eps_high, cfg.clip_c
    w = t.w.detach()
    neg = adv < 0
    clipped = [(neg & (w < lo), lo), (~neg & (w > hi), hi)]  # strict: clamp passes the gradient at a bound
    if c is not None:
        clipped.append((neg & (w > c), c))
    no_grad_here = t.w_frozen  # a fresh mask: the clipped tokens join it
    for mask, _ in clipped:
        no_grad_here |= mask
    grad = torch.mul(adv, w).neg_().masked_fill_(no_grad_here, 0.0)
    del no_grad_here
    r_eff = w.clone()
    for mask, bound in clipped:
        r_eff.masked_fill_(mask, bound)
    return r_eff.mul_(adv).neg_(), grad, ClipWindow(w, adv, neg)


def ppo_surrogate(t: PolicyTerms, ratio: Tensor, adv: Tensor) -> tuple[Tensor, Measured]:
    """Dual-clip PPO(ratio, adv) as a per-token loss: -adv r_eff (ppo_value_and_grad's formula);
    for ratio = t.w with the stated gradient, else by autograd. Measured(clip=its window)."""
    if ratio is t.w:
        value, grad, window = ppo_value_and_grad(t, adv)
        return with_gradient(t, value, grad), Measured(clip=window)
    cfg = t.config
    neg = adv < 0
    r_eff = torch.where(neg, ratio.clamp(1 - cfg.eps_low, cfg.clip_c), ratio.clamp(max=1 + cfg.eps_high))
    return torch.mul(r_eff, adv).neg_(), Measured(clip=ClipWindow(ratio.detach(), adv, neg))


@torch.no_grad()
def reward_value_and_grad(
    t: PolicyTerms, adv: Tensor | None = None
) -> tuple[Tensor, Tensor, ClipWindow | bool]:
    """The reward part of the differentiable styles, (value, gradient, window), fresh tensors:
    PPO(w, A) if config.clip_reward, else -w A (gradient -w A; no clip: window False)."""
    adv = t.adv if adv is None else adv
    if t.config.clip_reward:
        return ppo_value_and_grad(t, adv)
    value = torch.mul(t.w.detach(), adv).neg_()
    return value, value.masked_fill(t.w_frozen, 0.0), False


def reward_term(t: PolicyTerms) -> tuple[Tensor, Measured]:
    """The reward part alone as a per-token loss: PPO(w, A) if clip_reward, else -w A."""
    value, grad, window = reward_value_and_grad(t)
    return with_gradient(t, value, grad), Measured(clip=window)


# ------------------------------------------------------------------ a divergence's pieces
def kl_inputs(
    t: PolicyTerms, log_w: Tensor | None = None, w: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | float]:
    """(log(pi_theta/pi_ref), w, rho): the arguments of a divergence's value and score, at the
    terms' own weight or at (log_w, w). With config.kl_rho False (the released code's
    kl_penalty(log_prob, ref_log_prob)) the KL part is taken as if sampled from pi_ref:
    w -> pi_theta/pi_ref and rho -> 1, i.e. D_t / rho and s_t / rho."""
    if log_w is None or w is None:
        log_w, w = t.log_w, t.w
    if t.log_rho is None:
        return log_w, w, t.rho
    log_pr = log_w - t.log_rho
    if t.config.kl_rho:
        return log_pr, w, t.rho
    return log_pr, log_pr.exp(), 1.0


@torch.no_grad()
def clamp_kl_value(t: PolicyTerms, value: Tensor, score: Tensor | float) -> tuple[Tensor, Tensor | float]:
    """(clamp(D_t, -K, K), the score where |D_t| <= K else 0), K = config.kl_value_clamp (None: both
    as they are). The released code clamps its KL penalties to [-10, 10], beyond which their
    gradient is zero."""
    k = t.config.kl_value_clamp
    if k is None:
        return value, score
    return value.clamp(-k, k), torch.where(value.abs() <= k, score, 0.0)


@torch.no_grad()
def kl_value_and_score(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Tensor | float]:
    """(D_t, s_t) of a divergence; kl_rho and kl_value_clamp honoured."""
    args = kl_inputs(t)
    value, score = div.value(*args), div.score(*args)
    return clamp_kl_value(t, value, score) if div.value_clamped else (value, score)


def kl_value(t: PolicyTerms, divergence: str) -> Tensor:
    """D_t of `divergence` as a per-token loss with its gradient s_t; kl_rho and kl_value_clamp honoured."""
    with torch.no_grad():
        value, score = kl_value_and_score(t, DIVERGENCES[divergence])
        grad = torch.where(t.w_frozen, 0.0, score).expand_as(value)
    return with_gradient(t, value, grad)


def measured_kl(t: PolicyTerms, divergence: str | Divergence) -> Measured:
    """Measured(kl=D_t) (kl_rho honoured, no value clamp), for a loss whose KL enters only through
    its gradient: computed with the metrics, once the loss's temporaries are gone (peak memory)."""
    div = DIVERGENCES[divergence] if isinstance(divergence, str) else divergence
    return Measured(kl=lambda: div.value(*kl_inputs(t)))


@torch.no_grad()
def reinforce_coef(t: PolicyTerms, divergence: str | Divergence) -> Tensor:
    """coef = w A - beta s_t (stop-gradient, a fresh tensor): the REINFORCE coefficient."""
    div = DIVERGENCES[divergence] if isinstance(divergence, str) else divergence
    score = div.score(*kl_inputs(t))
    if isinstance(score, Tensor):  # -beta s_t + w A: one fresh tensor
        return torch.mul(score, -t.config.beta).addcmul_(t.w, t.adv)
    return torch.addcmul(t.w.new_tensor(-t.config.beta * score), t.w, t.adv)


@torch.no_grad()
def regularized_advantage(t: PolicyTerms, divergence: str | Divergence) -> Tensor:
    """A' = coef / w (stop-gradient), so that coef = w A'."""
    return reinforce_coef(t, divergence).div_(t.w)


# ------------------------------------------------------------------ the five styles
def differentiable(t: PolicyTerms, d_t: Tensor, s_t: Tensor | float) -> tuple[Tensor, Measured]:
    """The differentiable style with KL value d_t and its score s_t = dd_t/dlog pi_theta:
        L_t = PPO(w, A) + beta d_t        (clip_reward False: -w A + beta d_t)
        gradient  -A w inside the PPO window (0 outside) + beta s_t, zero where w is frozen
    The KL part is never clipped (the paper's code). Measures d_t and the reward's clip."""
    beta, w = t.config.beta, t.w.detach()
    with torch.no_grad():
        if t.config.clip_reward:
            value, grad, window = ppo_value_and_grad(t, t.adv)
        else:
            value, window = torch.mul(w, t.adv).neg_(), False
            grad = value.clone()
        value.add_(d_t, alpha=beta)
        grad.add_(s_t, alpha=beta)  # s_t a tensor or a number
        grad.masked_fill_(t.w_frozen, 0.0)
    return with_gradient(t, value, grad), Measured(kl=d_t, clip=window)


def reinforce(t: PolicyTerms, div: Divergence | str) -> tuple[Tensor, Measured]:
    """L_t = -SG(coef) log pi_theta, coef = w A - beta s_t. Measures D_t; no clip."""
    loss = torch.mul(reinforce_coef(t, div).neg_(), t.logp)
    return loss, measured_kl(t, div) | Measured(clip=False)


def reinforce_clip(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """RPG-Style Clip: L_t = PPO(w, A'), A' = coef / w; gradient -coef inside the window, 0 outside.
    Measures D_t and the clip on A'."""
    a_prime = reinforce_coef(t, div).div_(t.w)  # A' = coef / w
    value, grad, window = ppo_value_and_grad(t, a_prime)
    return with_gradient(t, value, grad), measured_kl(t, div) | Measured(clip=window)


@torch.no_grad()
def hard_clipped_weight(t: PolicyTerms) -> tuple[Tensor, Tensor]:
    """(log w_h, w_h) with w_h = clamp(w, 1 - eps_low, 1 + eps_high), no gradient."""
    cfg = t.config
    low = math.log(1 - cfg.eps_low) if cfg.eps_low < 1 else -math.inf
    log_wh = t.log_w.detach().clamp(low, math.log1p(cfg.eps_high))
    return log_wh, log_wh.exp()


@torch.no_grad()
def released_kl_score(t: PolicyTerms, div: Divergence) -> Tensor | float:
    """beta s_t(w_h): the released code's KL part, its score taken at the hard-clipped weight."""
    return t.config.beta * div.score(*kl_inputs(t, *hard_clipped_weight(t)))


def reinforce_released(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """The released code's REINFORCE: L_t = -SG(w_h A - beta s_t(w_h)) log pi_theta,
    w_h = clamp(w, 1-eps_low, 1+eps_high). Measures D_t (at w); no clip."""
    with torch.no_grad():
        neg_coef = released_kl_score(t, div) - hard_clipped_weight(t)[1] * t.adv
    return torch.mul(neg_coef, t.logp), measured_kl(t, div) | Measured(clip=False)


def reinforce_clip_released(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """The released code's RPG-Style Clip: the branch follows sign(A), not sign(A') (A = 0 goes
    negative): A > 0 passes iff w < 1+eps_high; A <= 0 passes iff 1-eps_low <= w < c.
    Passing tokens:  L_t = -SG(w A - beta s_t(w_h)) log pi_theta.
    Clipped tokens:  L_t = -SG(K) SG(log pi_theta), no gradient, K = A (1+eps_high) + beta s_t(w_h)
    (high), A (1-eps_low) + beta s_t(w_h) (low), A c - beta s_t(w_h) (dual).
    Measures D_t (at w) and the clip."""
    cfg = t.config
    with torch.no_grad():
        w, adv, kl = t.w.detach(), t.adv, released_kl_score(t, div)
        neg = adv <= 0
        branches = [  # (the tokens, the bound, the sign of beta s_t(w_h) in K)
            (~neg & (w >= 1 + cfg.eps_high), 1 + cfg.eps_high, 1.0),
            (neg & (w < 1 - cfg.eps_low), 1 - cfg.eps_low, 1.0),
        ]
        if cfg.clip_c is not None:
            branches.append((neg & (w >= cfg.clip_c), cfg.clip_c, -1.0))
        k = torch.mul(w, adv).sub_(kl)  # K of the passing tokens; each clipped branch's replaces it
        clipped = torch.zeros_like(w, dtype=torch.bool)
        for cond, bound, kl_sign in branches:
            k_branch = torch.mul(adv.expand_as(w), bound).add_(kl, alpha=kl_sign)  # A bound +- beta s_t(w_h)
            k = torch.where(cond, k_branch, k, out=k)  # k is this function's own tensor
            del k_branch  # not held while the next branch's is computed (peak memory)
            clipped |= cond
    loss = torch.mul(k.neg_(), torch.where(clipped, t.logp.detach(), t.logp))
    return loss, measured_kl(t, div) | Measured(clip=ClipWindow(w, adv, neg))
