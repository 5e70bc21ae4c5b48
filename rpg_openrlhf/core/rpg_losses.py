"""The paper's losses, one function each, registered under (divergence, style) (arXiv 2505.17508).

Notation (docs/losses.md): samples from pi_old; w = pi_theta/pi_old, rho = pi_ref/pi_old (rho = 1
when pi_ref = pi_old), A the advantage, beta the KL coefficient, SG stop-gradient, and
w_h = clamp(w, 1-eps_low, 1+eps_high) (the released code's hard-clipped weight). Each docstring
states the per-token loss L; the body names the style (styles.py: the formula) and the divergence
(kl.py: its D_t and score s_t). tests/test_core_losses.py checks every docstring's
formula against the loss's value, tests/test_core_exact.py every gradient against the exact one.

    differentiable            L = PPO(w, A) + beta D_t
    reinforce                 L = -SG(coef) log pi_theta,   coef = w A - beta s_t
    reinforce_clip            L = PPO(w, A'),               A' = coef / w   (RPG-Style Clip)
    reinforce_released        the released code's REINFORCE (s_t and w A at w_h)
    reinforce_clip_released   the released code's RPG-Style Clip (branch on sign(A), s_t at w_h)
"""

from __future__ import annotations

import torch

from .kl import DIVERGENCES
from .styles import (
    clamp_kl_value,
    differentiable,
    kl_value_and_score,
    reinforce,
    reinforce_clip,
    reinforce_clip_released,
    reinforce_released,
)
from .terms import LossOutput, PolicyTerms, register_loss

FKL, RKL, UFKL, URKL = (DIVERGENCES[n] for n in ("fkl", "rkl", "ufkl", "urkl"))


# ------------------------------------------------------------------ FKL = KL(pi_ref || pi_theta), s_t = -rho
@register_loss("fkl", "differentiable")
def fkl_differentiable(t: PolicyTerms) -> LossOutput:
    """L = PPO(w, A) + beta rho log(pi_ref/pi_theta)   (paper: -w A - beta rho log pi_theta)."""
    return differentiable(t, *kl_value_and_score(t, FKL))


@register_loss("fkl", "reinforce")
def fkl_reinforce(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A + beta rho) log pi_theta."""
    return reinforce(t, FKL)


@register_loss("fkl", "reinforce_clip")
def fkl_reinforce_clip(t: PolicyTerms) -> LossOutput:
    """L = dual-clip PPO(w, A'),  A' = A + beta rho / w."""
    return reinforce_clip(t, FKL)


@register_loss("fkl", "reinforce_released")
def fkl_reinforce_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w_h A + beta rho) log pi_theta."""
    return reinforce_released(t, FKL)


@register_loss("fkl", "reinforce_clip_released")
def fkl_reinforce_clip_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A + beta rho) log pi_theta where the sign(A) clip passes, else no gradient."""
    return reinforce_clip_released(t, FKL)


# ------------------------------------------------------------------ RKL = KL(pi_theta || pi_ref), s_t = w (log(pi_theta/pi_ref) + 1)
@register_loss("rkl", "differentiable")
def rkl_differentiable(t: PolicyTerms) -> LossOutput:
    """L = PPO(w, A) + beta w log(pi_theta/pi_ref)   (rho = 1: w (-A + beta log w))."""
    return differentiable(t, *kl_value_and_score(t, RKL))


@register_loss("rkl", "reinforce")
def rkl_reinforce(t: PolicyTerms) -> LossOutput:
    """L = -SG(w (A - beta log(pi_theta/pi_ref) - beta)) log pi_theta."""
    return reinforce(t, RKL)


@register_loss("rkl", "reinforce_clip")
def rkl_reinforce_clip(t: PolicyTerms) -> LossOutput:
    """L = dual-clip PPO(w, A'),  A' = A - beta (log(pi_theta/pi_ref) + 1)."""
    return reinforce_clip(t, RKL)


@register_loss("rkl", "reinforce_released")
def rkl_reinforce_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w_h (A - beta log(w_h/rho) - beta)) log pi_theta."""
    return reinforce_released(t, RKL)


@register_loss("rkl", "reinforce_clip_released")
def rkl_reinforce_clip_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A - beta w_h (log(w_h/rho) + 1)) log pi_theta where the sign(A) clip passes, else no gradient."""
    return reinforce_clip_released(t, RKL)


# ------------------------------------------------------------------ UFKL = UKL(pi_ref || pi_theta), s_t = w - rho
@register_loss("ufkl", "differentiable")
def ufkl_differentiable(t: PolicyTerms) -> LossOutput:
    """L = PPO(w, A) + beta (w - rho - rho log(pi_theta/pi_ref))   (rho = 1: beta k3 of w)."""
    return differentiable(t, *kl_value_and_score(t, UFKL))


@register_loss("ufkl", "reinforce")
def ufkl_reinforce(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A - beta (w - rho)) log pi_theta."""
    return reinforce(t, UFKL)


@register_loss("ufkl", "reinforce_clip")
def ufkl_reinforce_clip(t: PolicyTerms) -> LossOutput:
    """L = dual-clip PPO(w, A'),  A' = A - beta (1 - rho / w)."""
    return reinforce_clip(t, UFKL)


@register_loss("ufkl", "reinforce_released")
def ufkl_reinforce_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w_h A - beta (w_h - rho)) log pi_theta."""
    return reinforce_released(t, UFKL)


@register_loss("ufkl", "reinforce_clip_released")
def ufkl_reinforce_clip_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A - beta (w_h - rho)) log pi_theta where the sign(A) clip passes, else no gradient."""
    return reinforce_clip_released(t, UFKL)


# ------------------------------------------------------------------ URKL = UKL(pi_theta || pi_ref), s_t = w log(pi_theta/pi_ref)
@register_loss("urkl", "differentiable")
def urkl_differentiable(t: PolicyTerms) -> LossOutput:
    """L = PPO(w, A) + beta (w log(pi_theta/pi_ref) - w + rho)   (rho = 1: w log w - w + 1)."""
    return differentiable(t, *kl_value_and_score(t, URKL))


@register_loss("urkl", "reinforce")
def urkl_reinforce(t: PolicyTerms) -> LossOutput:
    """L = -SG(w (A - beta log(pi_theta/pi_ref))) log pi_theta."""
    return reinforce(t, URKL)


@register_loss("urkl", "reinforce_clip")
def urkl_reinforce_clip(t: PolicyTerms) -> LossOutput:
    """L = dual-clip PPO(w, A'),  A' = A - beta log(pi_theta/pi_ref)."""
    return reinforce_clip(t, URKL)


@register_loss("urkl", "reinforce_released")
def urkl_reinforce_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w_h (A - beta log(w_h/rho))) log pi_theta."""
    return reinforce_released(t, URKL)


@register_loss("urkl", "reinforce_clip_released")
def urkl_reinforce_clip_released(t: PolicyTerms) -> LossOutput:
    """L = -SG(w A - beta w_h log(w_h/rho)) log pi_theta where the sign(A) clip passes, else no gradient."""
    return reinforce_clip_released(t, URKL)


# ------------------------------------------------------------------ GRPO's KL term
@register_loss("grpo_kl", "differentiable")
def grpo_kl(t: PolicyTerms) -> LossOutput:
    """GRPO: L = PPO(w, A) + beta k3(pi_ref/pi_theta),  k3(y) = y - 1 - log y, no importance weight.
    Gradient beta (1 - pi_ref/pi_theta) grad log pi_theta: the FKL gradient on-policy only."""
    with torch.no_grad():  # y = pi_ref/pi_theta: k3 = (y - 1) - log y, dk3/dlog pi_theta = 1 - y
        log_y = t.log_rp
        y_minus_1 = torch.expm1(log_y)  # exact near y = 1
        k3, score = clamp_kl_value(t, y_minus_1 - log_y, y_minus_1.neg_())
        del log_y, y_minus_1  # not held through the reward's temporaries (peak memory)
    return differentiable(t, k3, score)


@register_loss("grpo_kl_corrected", "differentiable")
def grpo_kl_corrected(t: PolicyTerms) -> LossOutput:
    """Corrected GRPO: L = PPO(w, A) + beta w k3(pi_ref/pi_theta), gradient through w.
    Gradient beta w log(pi_theta/pi_ref) grad log pi_theta: exactly the URKL gradient."""
    # w k3(rho / w) = w log(w / rho) - w + rho is the URKL value term for term (the tests check the
    # literal w k3 value and gradient): computed as URKL's value and score.
    return differentiable(t, *kl_value_and_score(t, URKL))
