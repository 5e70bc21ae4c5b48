"""KL estimators and the per-token components of the four RPG divergences.

Conventions (samples drawn from pi_old; see docs/losses.md):
  log_w  = log(pi_theta / pi_old)   w   = exp(log_w)     (importance weight, carries gradient)
  log_rho = log(pi_ref / pi_old)    rho = exp(log_rho)   (rho = 1 when pi_ref = pi_old)
  log_pr = log(pi_theta / pi_ref) = log_w - log_rho

Every divergence D is written as E_old[D_t] with a per-token component D_t(log_w) whose value is
an unbiased estimate of D and whose derivative ("score") dD_t/dlog pi_theta gives the exact
gradient grad D = E_old[score * grad log pi_theta]. The value and the score are the only two
formulas per divergence; the losses build everything else (REINFORCE coefficient, A') from them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # OpenRLHF's PolicyLoss clamps log(pi_theta/pi_old) to [-20, 20] before exp


class _ClampedDifference(torch.autograd.Function):
    """(a - b).clamp(-c, c) for a constant b, saving only its inputs: clamp would save the [B, T]
    difference for its backward, which here recomputes the band instead (|a - b| <= c passes the
    gradient of a, as clamp's backward does)."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, c: float) -> Tensor:
        ctx.save_for_backward(a, b)
        ctx.c = c
        return (a - b).clamp_(-c, c)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        a, b = ctx.saved_tensors
        return torch.where((a - b).abs_() <= ctx.c, grad, 0.0), None, None


def clamped_log_ratio(logp: Tensor, base_logp: Tensor, clamp: float = LOG_RATIO_CLAMP) -> Tensor:
    """log(p / q) = logp - base_logp, clamped to [-clamp, clamp] so exp() stays finite (as OpenRLHF)."""
    if logp.requires_grad and not base_logp.requires_grad and torch.is_grad_enabled():
        return _ClampedDifference.apply(logp, base_logp, clamp)
    return (logp - base_logp).clamp(-clamp, clamp)


# Schulman's estimators of KL(q || p) from samples of q, written in log y with y = p(x) / q(x).
def k1(log_ratio: Tensor) -> Tensor:
    """k1(y) = -log y.   E_q[k1(p/q)] = KL(q || p)."""
    return -log_ratio


def k2(log_ratio: Tensor) -> Tensor:
    """k2(y) = (log y)^2 / 2.   Low-variance, biased estimate of KL(q || p)."""
    return 0.5 * log_ratio.square()


def k3(log_ratio: Tensor, ratio: Tensor | float | None = None) -> Tensor:
    """k3(y) = y - 1 - log y.   E_q[k3(p/q)] = UKL(q || p) = sum q log(q/p) - q + p exactly.

    `ratio` = y may be passed when the caller already has it (saves one exp)."""
    if ratio is None:
        ratio = log_ratio.exp()
    return ratio - 1 - log_ratio


# ---- the four divergences: value D_t and score dD_t/dlog pi_theta (log_pr = log pi_theta/pi_ref) ----
def fkl_value(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """FKL = KL(pi_ref || pi_theta):  D_t = rho log(pi_ref / pi_theta) = -rho log_pr."""
    if isinstance(rho, Tensor):
        # in-place negation of the product: no separate -rho temporary (mul saves its inputs, not
        # its output, so neg_ is safe for autograd)
        return torch.mul(log_pr, rho).neg_()
    return -rho * log_pr


def fkl_score(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor | float:
    """dD_t/dlog pi_theta = -rho."""
    return -rho


def rkl_value(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """RKL = KL(pi_theta || pi_ref):  D_t = w log(pi_theta / pi_ref)."""
    return w * log_pr


def rkl_score(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """dD_t/dlog pi_theta = w (log(pi_theta / pi_ref) + 1)."""
    return torch.add(log_pr, 1).mul_(w)  # one fresh tensor


def ufkl_value(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """UFKL = UKL(pi_ref || pi_theta):  D_t = w - rho - rho log(pi_theta / pi_ref) = rho k3(w / rho)."""
    # One fresh tensor, then in place (mul/sub save their inputs, not their output: autograd-safe).
    if isinstance(rho, Tensor):
        return torch.mul(rho, log_pr).neg_().add_(w).sub_(rho)
    return torch.sub(w, log_pr, alpha=rho).sub_(rho)


def ufkl_score(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """dD_t/dlog pi_theta = w - rho."""
    return w - rho


def urkl_value(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """URKL = UKL(pi_theta || pi_ref):  D_t = w log(pi_theta / pi_ref) - w + rho."""
    return torch.mul(w, log_pr).sub_(w).add_(rho)  # one fresh tensor, then in place (autograd-safe)


def urkl_score(log_pr: Tensor, w: Tensor, rho: Tensor | float) -> Tensor:
    """dD_t/dlog pi_theta = w log(pi_theta / pi_ref)."""
    return w * log_pr


class Divergence(NamedTuple):
    value: Callable[[Tensor, Tensor, Tensor | float], Tensor]
    score: Callable[[Tensor, Tensor, Tensor | float], Tensor | float]
    # Whether LossConfig.kl_value_clamp clamps D_t: the released code clamps its rpg_rkl,
    # rpg_ufkl and rpg_urkl penalties (and GRPO's k3) to [-10, 10], but not rpg_fkl's -log w.
    value_clamped: bool = True


DIVERGENCES: dict[str, Divergence] = {
    "fkl": Divergence(fkl_value, fkl_score, value_clamped=False),
    "rkl": Divergence(rkl_value, rkl_score),
    "ufkl": Divergence(ufkl_value, ufkl_score),
    "urkl": Divergence(urkl_value, urkl_score),
}


def kl_components(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None = None,
    clamp: float = LOG_RATIO_CLAMP,
) -> Tensor:
    """Per-token D_t of divergence `name` (fkl, rkl, ufkl, urkl) with samples from pi_old.

    E_old[sum over a sequence of D_t] with sequence-level log-probs is the divergence itself;
    the gradient flows through log pi_theta. ref_logp=None means pi_ref = pi_old. Log ratios
    are clamped to [-clamp, clamp] before exp."""
    if name not in DIVERGENCES:
        raise ValueError(f"name: unknown divergence {name!r}, expected one of {sorted(DIVERGENCES)}")
    log_w = clamped_log_ratio(logp, old_logp.detach(), clamp)
    if ref_logp is None:
        return DIVERGENCES[name].value(log_w, log_w.exp(), 1.0)
    log_rho = clamped_log_ratio(ref_logp.detach(), old_logp.detach(), clamp)
    return DIVERGENCES[name].value(log_w - log_rho, log_w.exp(), log_rho.exp())


__all__ = [
    "DIVERGENCES",
    "Divergence",
    "LOG_RATIO_CLAMP",
    "clamped_log_ratio",
    "k1",
    "k2",
    "k3",
    "kl_components",
]
