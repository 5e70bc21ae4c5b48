"""Every framework's KL option as a registered core loss (issues 30 and 39; docs/kl-options.md).

Samples come from pi_old. Per token, as the frameworks form them from the log-probs they are given:
l = log pi_theta - log pi_ref (pi_ref = pi_old without a reference model), w = exp(log pi_theta -
log pi_old), k3 = e^-l - 1 + l = k3(pi_ref/pi_theta); "SG" stop-gradient.

KL as a loss (a value v_t added to the policy loss):   L = PPO(w, A) + beta v_t
  each option gives v_t and s_t = dv_t/dlog pi_theta, the gradient the framework's autograd produces
  (a straight-through form has a gradient that is not its value's; a clamped value has none beyond it).
KL in the reward (OpenRLHF without --algo.kl.use_loss):  L = PPO(w, A'_t),  A'_t = A - beta sum_{s>=t} k_s
  k_s = the estimator at the rollout, of pi_old against pi_ref (no gradient), summed as returns-to-go.

A framework-named option computes exactly what that framework's code computes, its own clamps included
and no others (`rpg-mechanisms conformance` runs the frameworks' own functions against these, exp6 in
results/mechanisms): its l and w are the raw differences above, not the core's +-20-clamped log_w and
log_rho, and its KL gradient stands wherever the framework's does. The reward term PPO(w, A) is
OpenRLHF's PolicyLoss (the run is OpenRLHF's), with its log-ratio clamp at +-20. The released code's KL
settings (LossConfig.kl_rho, kl_value_clamp) belong to RPG's own losses and are refused here
(terms.check_loss). Every option is registered under its framework's name with style "differentiable"
(`--rpg.loss NAME`); names in ALIASES are the same function under another framework's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from . import rpg_losses as _rpg_losses  # noqa: F401  (registered first: --rpg.loss lists RPG's losses first)
from .aggregation import masked
from .styles import reward_value_and_grad, with_gradient
from .terms import LOSSES, LossOutput, Measured, PolicyTerms, register_loss

VALUE_CLAMP = 10.0  # |v_t| <= 10: OpenRLHF's compute_approx_kl, verl's low_var_kl, NeMo-RL's output clamp
IS_WEIGHT_CLIP = 10.0  # OpenRLHF's KL_IS_WEIGHT_CLIP: w <= 10 in --algo.kl.unbiased_gradient
NEMO_RL_INPUT_CLAMP = 20.0  # NeMo-RL's calculate_kl clamps l to +-20 before exp

KLPart = tuple[Tensor, Tensor | float]  # (v_t, s_t), fresh tensors (or a constant score)


# ------------------------------------------------------------------ building blocks (no gradient)
@torch.no_grad()
def _l(t: PolicyTerms) -> Tensor:
    """l = log pi_theta - log pi_ref, the raw difference (pi_ref = pi_old without a reference), fresh."""
    return torch.sub(t.logp.detach(), t.old_logp if t.ref_logp is None else t.ref_logp)


@torch.no_grad()
def _w(t: PolicyTerms) -> Tensor:
    """w = exp(log pi_theta - log pi_old), the raw ratio (no clamp), fresh."""
    return torch.sub(t.logp.detach(), t.old_logp).exp_()


@torch.no_grad()
def _k3_and_score(lpr: Tensor) -> KLPart:
    """(k3 = e^-l - 1 + l, dk3/dlog pi_theta = 1 - e^-l) from l (expm1: exact near l = 0)."""
    e = torch.neg(lpr).expm1_()  # e^-l - 1
    return torch.add(e, lpr), e.neg_()


@torch.no_grad()
def _value_clamped(value: Tensor, score: Tensor, bound: float = VALUE_CLAMP) -> KLPart:
    """(clamp(v, -bound, bound), s where v <= bound else 0) of a value v >= 0 (k2, k3, w k3), in place:
    autograd through clamp."""
    score.masked_fill_(value > bound, 0.0)
    return value.clamp_(max=bound), score


def _framework_loss(t: PolicyTerms, kl_part: Callable[[PolicyTerms], KLPart]) -> LossOutput:
    """L_t = PPO(w, A) + beta v_t with (v_t, s_t) = kl_part(t):
        gradient  the reward term's (-A w inside the PPO window, 0 outside it and where OpenRLHF's
                  log-ratio clamp freezes w) + beta s_t (everywhere: the framework's clamps are in s_t)
    The reward term first, then the KL part (one pair of [B, T] temporaries at a time). Measures v_t."""
    beta = t.config.beta
    with torch.no_grad():
        value, grad, window = reward_value_and_grad(t)
        v_t, s_t = kl_part(t)
        grad.add_(s_t, alpha=beta)
        del s_t
        value.add_(v_t, alpha=beta)
    return with_gradient(t, value, grad), Measured(kl=v_t, clip=window)


# ------------------------------------------------------------------ the KL values and scores
@torch.no_grad()
def _verl_k1(t: PolicyTerms) -> KLPart:
    return _l(t), 1.0


@torch.no_grad()
def _verl_k2(t: PolicyTerms) -> KLPart:
    lpr = _l(t)
    return lpr.square().mul_(0.5), lpr


@torch.no_grad()
def _verl_abs(t: PolicyTerms) -> KLPart:
    lpr = _l(t)
    return lpr.abs(), lpr.sign_()


@torch.no_grad()
def _openrlhf_k1(t: PolicyTerms) -> KLPart:
    lpr = _l(t)
    value = lpr.clamp(-VALUE_CLAMP, VALUE_CLAMP)
    return value, torch.eq(value, lpr).to(lpr.dtype)


@torch.no_grad()
def _openrlhf_k2(t: PolicyTerms) -> KLPart:
    lpr = _l(t)
    return _value_clamped(lpr.square().mul_(0.5), lpr)


@torch.no_grad()
def _openrlhf_k3(t: PolicyTerms) -> KLPart:
    """OpenRLHF clamps l at -10 before exp; there k3 > 10 already, so the value clamp decides alike."""
    return _value_clamped(*_k3_and_score(_l(t)))


@torch.no_grad()
def _k3_value_k2_score(t: PolicyTerms) -> KLPart:
    """(min(k3, 10), l): a k3 value with the k2 score (straight-through)."""
    lpr = _l(t)
    value, _ = _k3_and_score(lpr)
    return value.clamp_(-VALUE_CLAMP, VALUE_CLAMP), lpr


@torch.no_grad()
def _unbiased_gradient(t: PolicyTerms) -> KLPart:
    lpr = _l(t)
    value, _ = _k3_and_score(lpr)
    return value.clamp_(-VALUE_CLAMP, VALUE_CLAMP), _w(t).clamp_(max=IS_WEIGHT_CLIP).mul_(lpr)


@torch.no_grad()
def _nemo_rl(t: PolicyTerms, weighted: bool) -> KLPart:
    """NeMo-RL's calculate_kl(k3) times a weight (value w or 1, gradient w grad logp): l clamped to
    +-20 (the weight detached there: no gradient beyond), then w k3 clamped to +-10."""
    lpr = _l(t)
    clamped = lpr.clamp(-NEMO_RL_INPUT_CLAMP, NEMO_RL_INPUT_CLAMP)
    outside = torch.ne(clamped, lpr)
    value = torch.neg(clamped).expm1_().add_(clamped)  # k3 of the clamped l
    del clamped
    if weighted:
        w = _w(t)
        value.mul_(w)
        lpr.mul_(w)
        del w
    return _value_clamped(value, lpr.masked_fill_(outside, 0.0))


@torch.no_grad()
def _trl_k3(t: PolicyTerms) -> KLPart:
    return _k3_and_score(_l(t))


@torch.no_grad()
def _weighted_k3(t: PolicyTerms) -> KLPart:
    """(w k3, w l): d(w k3)/dlog pi_theta = w k3 + w (1 - e^-l) = w l."""
    lpr, w = _l(t), _w(t)
    value, _ = _k3_and_score(lpr)
    return value.mul_(w), lpr.mul_(w)


@torch.no_grad()
def _weighted_k1(t: PolicyTerms) -> KLPart:
    """(w l, w (l + 1))."""
    lpr, w = _l(t), _w(t)
    value = torch.mul(lpr, w)
    return value, lpr.add_(1.0).mul_(w)


# ------------------------------------------------------------------ KL as a loss
def openrlhf_k1_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k1: L = PPO(w, A) + beta clamp(l, -10, 10).
    Gradient beta grad logp (|l| <= 10): zero in expectation on-policy."""
    return _framework_loss(t, _openrlhf_k1)


def verl_k1(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k1 (kl): L = PPO(w, A) + beta l. Gradient beta grad logp: zero in expectation on-policy."""
    return _framework_loss(t, _verl_k1)


def openrlhf_k2_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k2: L = PPO(w, A) + beta min(l^2 / 2, 10).
    Gradient beta l grad logp where l^2/2 <= 10."""
    return _framework_loss(t, _openrlhf_k2)


def verl_k2(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k2 (mse), slime k2: L = PPO(w, A) + beta l^2 / 2. Gradient beta l grad logp."""
    return _framework_loss(t, _verl_k2)


def openrlhf_k3_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k3, verl low_var_kl: L = PPO(w, A) + beta min(k3(pi_ref/pi_theta), 10).
    Gradient beta (1 - pi_ref/pi_theta) grad logp where k3 <= 10 (GRPO's k3 with its value clamped)."""
    return _framework_loss(t, _openrlhf_k3)


def verl_abs(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type abs: L = PPO(w, A) + beta |l|. Gradient beta sign(l) grad logp."""
    return _framework_loss(t, _verl_abs)


def verl_k3plus(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k3+ (low_var_kl+): L = PPO(w, A) + beta [min(k3(pi_ref/pi_theta), 10) + l^2/2 - SG(l^2/2)].
    Straight-through: k3's value, k2's gradient beta l grad logp (k1+ and abs+ have the same gradient)."""
    return _framework_loss(t, _k3_value_k2_score)


def nemo_rl_k3(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation False: L = PPO(w, A) + beta clamp(exp(logp - SG(logp)) k3(pi_ref/pi_theta), -10, 10).
    The weight is 1 with gradient grad logp: gradient beta l grad logp where |l| <= 20 and k3 <= 10."""
    return _framework_loss(t, lambda t: _nemo_rl(t, weighted=False))


def nemo_rl_k3_on_policy(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation True: L = PPO(w, A) + beta clamp(w k3(pi_ref/pi_theta), -10, 10),
    l clamped to +-20, gradient through w: beta w l grad logp where |l| <= 20 and |w k3| <= 10 (the
    URKL gradient, clamped; slime's low_var_kl with --use-unbiased-kl where |l| <= 20)."""
    return _framework_loss(t, lambda t: _nemo_rl(t, weighted=True))


def openrlhf_k3_unbiased_gradient(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.unbiased_gradient (estimator k3):
    L = PPO(w, A) + beta [SG(min(k3(pi_ref/pi_theta), 10)) + SG(min(w, 10)) (l^2/2 - SG(l^2/2))].
    Gradient beta min(w, 10) l grad logp (the URKL gradient where w <= 10), whatever the estimator."""
    return _framework_loss(t, _unbiased_gradient)


def trl_k3(t: PolicyTerms) -> LossOutput:
    """TRL GRPO beta > 0 (use_bias_correction_kl False), GRPO's original k3, slime k3:
    L = PPO(w, A) + beta k3(pi_ref/pi_theta), no clamp. Gradient beta (1 - pi_ref/pi_theta) grad logp
    (the FKL gradient on-policy only; = grpo_kl without RPG's clamps)."""
    return _framework_loss(t, _trl_k3)


def trl_k3_bias_corrected(t: PolicyTerms) -> LossOutput:
    """TRL use_bias_correction_kl (TRL's default), DeepSeek-V3.2, slime k3 --use-unbiased-kl:
    L = PPO(w, A) + beta w k3(pi_ref/pi_theta), gradient through w, no clamp. Gradient beta w l grad logp:
    the URKL gradient (= grpo_kl_corrected without RPG's clamps)."""
    return _framework_loss(t, _weighted_k3)


def slime_k1_unbiased(t: PolicyTerms) -> LossOutput:
    """slime k1 --use-unbiased-kl: L = PPO(w, A) + beta w l, gradient through w, no clamp.
    Gradient beta w (l + 1) grad logp: RKL's (= rkl, differentiable, without RPG's clamps)."""
    return _framework_loss(t, _weighted_k1)


# ------------------------------------------------------------------ KL in the reward
def _in_reward(t: PolicyTerms, k: Callable[[Tensor], Tensor]) -> LossOutput:
    """PPO(w, A'), A'_t = A - beta sum_{s>=t} k_s, k_s = k(log pi_old - log pi_ref) per token (0 when
    pi_ref = pi_old), as OpenRLHF's experience maker forms it. At sequence level the one entry's k is
    of the sequence log-ratio. Measures k_t."""
    with torch.no_grad():
        if t.ref_logp is None:
            k_t = torch.zeros_like(t.w.detach())
        else:
            k_t = masked(k(torch.sub(t.old_logp, t.ref_logp)), t.mask)
        to_go = k_t.flip(-1).cumsum(-1).flip(-1)  # returns-to-go (OpenRLHF's gamma = 1)
        value, g, window = reward_value_and_grad(dataclasses.replace(t, adv=t.adv - t.config.beta * to_go))
    return with_gradient(t, value, g), Measured(kl=k_t, clip=window)


def _k3_of(x: Tensor) -> Tensor:
    """OpenRLHF's k3 of log_ratio x: x clamped at -10 before exp, the value at 10 (fresh)."""
    x = x.clamp(min=-VALUE_CLAMP)
    return torch.neg(x).expm1_().add_(x).clamp_(-VALUE_CLAMP, VALUE_CLAMP)


def openrlhf_k1_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k1 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} clamp(log(pi_old/pi_ref), -10, 10)_s.
    On-policy its gradient is the sequence reverse KL's (RKL), at either weight level."""
    return _in_reward(t, lambda x: x.clamp(-VALUE_CLAMP, VALUE_CLAMP))


def openrlhf_k2_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k2 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(log(pi_old/pi_ref)^2 / 2, 10)_s."""
    return _in_reward(t, lambda x: (0.5 * x.square()).clamp_(-VALUE_CLAMP, VALUE_CLAMP))


def openrlhf_k3_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k3 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(k3(pi_ref/pi_old), 10)_s."""
    return _in_reward(t, _k3_of)


# ------------------------------------------------------------------ the registry
#: name -> (the function, its one-line --help note). One registry line each; docs/kl-options.md has
#: the source (repository, file, function) of each and the measured verdict.
KL_OPTIONS: dict[str, tuple[Callable[[PolicyTerms], LossOutput], str]] = {
    "openrlhf_k1_loss": (openrlhf_k1_loss, "OpenRLHF --algo.kl.use_loss, estimator k1 (no KL gradient on-policy)"),
    "openrlhf_k2_loss": (openrlhf_k2_loss, "OpenRLHF --algo.kl.use_loss, estimator k2 (value clamped at 10)"),
    "openrlhf_k3_loss": (openrlhf_k3_loss, "OpenRLHF --algo.kl.use_loss, estimator k3 (GRPO's k3 clamped at 10)"),
    "openrlhf_k3_unbiased_gradient": (openrlhf_k3_unbiased_gradient, "OpenRLHF --algo.kl.unbiased_gradient "
                                      "(k3 value, gradient min(w, 10) lpr)"),
    "openrlhf_k1_reward": (openrlhf_k1_reward, "OpenRLHF k1 in the reward (at pi_old, returns-to-go)"),
    "openrlhf_k2_reward": (openrlhf_k2_reward, "OpenRLHF k2 in the reward (at pi_old, returns-to-go)"),
    "openrlhf_k3_reward": (openrlhf_k3_reward, "OpenRLHF k3 in the reward (at pi_old, returns-to-go)"),
    "verl_k1": (verl_k1, "verl kl_loss_type k1/kl (no KL gradient on-policy)"),
    "verl_k2": (verl_k2, "verl kl_loss_type k2/mse, slime k2"),
    "verl_abs": (verl_abs, "verl kl_loss_type abs"),
    "verl_k3plus": (verl_k3plus, "verl kl_loss_type k3+ (k3's value, k2's gradient; = k1+, abs+ gradients)"),
    "trl_k3": (trl_k3, "TRL GRPO beta > 0 without use_bias_correction_kl, GRPO's original k3, slime k3 "
               "(no clamp)"),
    "trl_k3_bias_corrected": (trl_k3_bias_corrected, "TRL use_bias_correction_kl (w k3, no clamp)"),
    "slime_k1_unbiased": (slime_k1_unbiased, "slime k1 --use-unbiased-kl (w lpr, no clamp)"),
    "nemo_rl_k3": (nemo_rl_k3, "NeMo-RL k3, use_on_policy_kl_approximation False (value-1 weight with gradient)"),
    "nemo_rl_k3_on_policy": (nemo_rl_k3_on_policy, "NeMo-RL use_on_policy_kl_approximation True (w k3 "
                             "clamped at 10)"),
}  # fmt: skip

#: another framework's name for a function registered already -> (that key, its --help note)
ALIASES: dict[str, tuple[tuple[str, str], str]] = {
    "verl_low_var_kl": (("openrlhf_k3_loss", "differentiable"), "verl kl_loss_type low_var_kl/k3, slime "
                        "low_var_kl: = openrlhf_k3_loss"),
    "deepseek_v32_k3": (("trl_k3_bias_corrected", "differentiable"), "DeepSeek-V3.2's k3 times "
                        "pi_theta/pi_old: = trl_k3_bias_corrected"),
    "slime_k3_unbiased": (("trl_k3_bias_corrected", "differentiable"), "slime k3 --use-unbiased-kl: = "
                          "trl_k3_bias_corrected"),
}  # fmt: skip

for _name, (_fn, _) in KL_OPTIONS.items():
    register_loss(_name, "differentiable", framework=True)(_fn)
for _name, (_key, _) in ALIASES.items():
    register_loss(_name, "differentiable", framework=True)(LOSSES[_key])
del _name, _fn, _key

#: every name this module adds to --rpg.loss, with its --help note
KL_OPTION_NAMES: tuple[str, ...] = (*KL_OPTIONS, *ALIASES)
KL_OPTION_HELP: dict[str, str] = {
    **{n: h for n, (_, h) in KL_OPTIONS.items()},
    **{n: h for n, (_, h) in ALIASES.items()},
}

__all__ = ["ALIASES", "KL_OPTIONS", "KL_OPTION_HELP", "KL_OPTION_NAMES", *KL_OPTIONS]
