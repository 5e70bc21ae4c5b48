"""KL estimators and the four RPG divergences (the paper's Table 2), samples from pi_old.

  log_w = log(pi_theta / pi_old), w = e^log_w;  log_rho = log(pi_ref / pi_old), rho = e^log_rho
  (rho = 1 when pi_ref = pi_old);  log_pr = log(pi_theta / pi_ref) = log_w - log_rho
Each divergence D = E_old[D_t] has a per-token value D_t and a score s_t = dD_t/dlog pi_theta, so
that grad D = E_old[s_t grad log pi_theta]. The differentiable style takes D_t's gradient from
autograd; the REINFORCE styles use s_t in their coefficient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor

LOG_RATIO_CLAMP = 20.0  # OpenRLHF's PolicyLoss clamps log(pi_theta/pi_old) to [-20, 20] before exp


def clamped_log_ratio(logp: Tensor, base_logp: Tensor, clamp: float = LOG_RATIO_CLAMP) -> Tensor:
    """log(p / q) = logp - base_logp, clamped to [-clamp, clamp] so exp() stays finite (as OpenRLHF)."""
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
    return (log_ratio.exp() if ratio is None else ratio) - 1 - log_ratio


Part = Callable[[Tensor, Tensor, "Tensor | float"], "Tensor | float"]  # (log_pr, w, rho) -> D_t or s_t


class Divergence(NamedTuple):
    value: Part  # D_t
    score: Part  # s_t = dD_t/dlog pi_theta
    # Whether LossConfig.kl_value_clamp clamps D_t: the released code clamps its rpg_rkl,
    # rpg_ufkl and rpg_urkl penalties (and GRPO's k3) to [-10, 10], but not rpg_fkl's -log w.
    value_clamped: bool = True


#: name -> (D_t, s_t): FKL = KL(pi_ref || pi_theta), RKL = KL(pi_theta || pi_ref), and the unnormalized
#: UFKL = UKL(pi_ref || pi_theta) = rho k3(w / rho), URKL = UKL(pi_theta || pi_ref)
DIVERGENCES: dict[str, Divergence] = {
    "fkl": Divergence(lambda lpr, w, rho: -rho * lpr, lambda lpr, w, rho: -rho, value_clamped=False),
    "rkl": Divergence(lambda lpr, w, rho: w * lpr, lambda lpr, w, rho: (lpr + 1) * w),
    "ufkl": Divergence(lambda lpr, w, rho: w - rho * lpr - rho, lambda lpr, w, rho: w - rho),
    "urkl": Divergence(lambda lpr, w, rho: w * lpr - w + rho, lambda lpr, w, rho: w * lpr),
}


def kl_components(
    name: str, logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None = None, clamp: float = LOG_RATIO_CLAMP
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
    "LOG_RATIO_CLAMP",
    "Divergence",
    "clamped_log_ratio",
    "k1",
    "k2",
    "k3",
    "kl_components",
]
