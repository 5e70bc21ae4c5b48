"""KL estimators and the four RPG divergences (the paper's Table 2), samples from pi_old: w = pi_theta/pi_old,
rho = pi_ref/pi_old (1 when pi_ref = pi_old), log_pr = log(pi_theta/pi_ref). A divergence D = E_old[D_t]
has a value D_t and a score s_t = dD_t/dlog pi_theta per token: grad D = E_old[s_t grad log pi_theta]."""

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
    """k3(y) = y - 1 - log y (y = `ratio` if given).   E_q[k3(p/q)] = UKL(q || p) exactly."""
    return (log_ratio.exp() if ratio is None else ratio) - 1 - log_ratio


Part = Callable[[Tensor, Tensor, "Tensor | float"], "Tensor | float"]  # (log_pr, w, rho) -> D_t or s_t


class Divergence(NamedTuple):
    value: Part  # D_t
    score: Part  # s_t = dD_t/dlog pi_theta
    value_clamped: bool = True  # LossConfig.kl_value_clamp applies (the released code: not to rpg_fkl)


#: FKL = KL(pi_ref || pi_theta), RKL = KL(pi_theta || pi_ref), UFKL = UKL(pi_ref || pi_theta) =
#: rho k3(w / rho), URKL = UKL(pi_theta || pi_ref), with UKL(p || q) = sum p log(p/q) - p + q
DIVERGENCES: dict[str, Divergence] = {
    "fkl": Divergence(lambda lpr, w, rho: -rho * lpr, lambda lpr, w, rho: -rho, value_clamped=False),
    "rkl": Divergence(lambda lpr, w, rho: w * lpr, lambda lpr, w, rho: (lpr + 1) * w),
    "ufkl": Divergence(lambda lpr, w, rho: w - rho * lpr - rho, lambda lpr, w, rho: w - rho),
    "urkl": Divergence(lambda lpr, w, rho: w * lpr - w + rho, lambda lpr, w, rho: w * lpr),
}


def kl_components(name: str, logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None = None,
                  clamp: float = LOG_RATIO_CLAMP) -> Tensor:  # fmt: skip
    """Per-token D_t of divergence `name`, samples from pi_old, gradient through logp (ref_logp None:
    pi_ref = pi_old; log ratios clamped to +-clamp); on sequence log-probs E_old[D_t] is the divergence."""
    if name not in DIVERGENCES:
        raise ValueError(f"name: unknown divergence {name!r}, expected one of {sorted(DIVERGENCES)}")
    log_w = clamped_log_ratio(logp, old_logp.detach(), clamp)
    if ref_logp is None:
        return DIVERGENCES[name].value(log_w, log_w.exp(), 1.0)
    log_rho = clamped_log_ratio(ref_logp.detach(), old_logp.detach(), clamp)
    return DIVERGENCES[name].value(log_w - log_rho, log_w.exp(), log_rho.exp())
