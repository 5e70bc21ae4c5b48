"""Every framework's KL option as a registered core loss (issue 30; docs/kl-options.md, "the KL atlas").

Samples come from pi_old. Per token: l = log(pi_theta / pi_ref) (from the clamped log-ratios, carries
gradient), w = pi_theta / pi_old, rho = pi_ref / pi_old, k3(y) = y - 1 - log y; "SG" stop-gradient.

KL as a loss (a value v_t added to the policy loss):   L = PPO(w, A) + beta v_t
  each function gives v_t and s_t = dv_t/dlog pi_theta, the gradient the framework's autograd produces
  (a straight-through form has a gradient that is not its value's; a clamped value has none beyond it).
KL in the reward (OpenRLHF without --algo.kl.use_loss):  L = PPO(w, A'_t),  A'_t = A - beta sum_{s>=t} k_s
  k_s = the estimator at the rollout, of pi_old against pi_ref (no gradient), summed as returns-to-go.

Every option is registered under the name of the framework's option with style "differentiable"
(`--rpg.loss NAME`); names in ALIASES are the same function registered again under another
framework's name. The frameworks take no rho: with a reference model (pi_ref != pi_old) the KL term is
the framework's, not the paper's rho-weighted one (LossConfig.kl_rho does not apply here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from . import rpg_losses as _rpg_losses  # noqa: F401  (the aliases below name grpo_kl, rkl, ...)
from .aggregation import masked
from .styles import differentiable, reward_value_and_grad, with_gradient
from .terms import LOSSES, LossOutput, Measured, PolicyTerms, register_loss

VALUE_CLAMP = 10.0  # |v_t| <= 10: OpenRLHF's compute_approx_kl, verl's low_var_kl, NeMo-RL's output clamp
IS_WEIGHT_CLIP = 10.0  # OpenRLHF's KL_IS_WEIGHT_CLIP: w <= 10 in --algo.kl.unbiased_gradient


# ------------------------------------------------------------------ building blocks (no gradient)
@torch.no_grad()
def _l(t: PolicyTerms) -> Tensor:
    """l = log(pi_theta / pi_ref), a fresh tensor (callers write into what they derive from it)."""
    return t.log_pr.detach().clone()


@torch.no_grad()
def _k3(x: Tensor) -> Tensor:
    """k3(e^-x) = e^-x - 1 + x: k3 of pi_ref/pi_theta for x = l (expm1: exact near x = 0)."""
    return torch.expm1(-x).add_(x)


@torch.no_grad()
def _clamp(value: Tensor, score: Tensor, bound: float = VALUE_CLAMP) -> tuple[Tensor, Tensor]:
    """(clamp(v, -bound, bound), s where |v| <= bound else 0): autograd through clamp."""
    return value.clamp(-bound, bound), torch.where(value.abs() <= bound, score, 0.0)


# ------------------------------------------------------------------ KL as a loss
def openrlhf_k1_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k1: L = PPO(w, A) + beta clamp(l, -10, 10).
    Gradient beta grad logp (|l| <= 10): zero in expectation on-policy."""
    lpr = _l(t)
    return differentiable(t, *_clamp(lpr, torch.ones_like(lpr)))


def verl_k1(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k1 (kl): L = PPO(w, A) + beta l. Gradient beta grad logp: zero in expectation on-policy."""
    lpr = _l(t)
    return differentiable(t, lpr, torch.ones_like(lpr))


def openrlhf_k2_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k2: L = PPO(w, A) + beta min(l^2 / 2, 10).
    Gradient beta l grad logp where l^2/2 <= 10."""
    lpr = _l(t)
    return differentiable(t, *_clamp(0.5 * lpr.square(), lpr))


def verl_k2(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k2 (mse), slime k2: L = PPO(w, A) + beta l^2 / 2. Gradient beta l grad logp."""
    lpr = _l(t)
    return differentiable(t, 0.5 * lpr.square(), lpr)


def openrlhf_k3_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.estimator k3, verl low_var_kl: L = PPO(w, A) + beta min(k3(pi_ref/pi_theta), 10).
    Gradient beta (1 - pi_ref/pi_theta) grad logp where k3 <= 10 (GRPO's k3 with its value clamped)."""
    lpr = _l(t)
    return differentiable(t, *_clamp(_k3(lpr), torch.expm1(-lpr).neg_()))


def verl_abs(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type abs: L = PPO(w, A) + beta |l|. Gradient beta sign(l) grad logp."""
    lpr = _l(t)
    return differentiable(t, lpr.abs(), lpr.sign())


def verl_k3plus(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k3+ (low_var_kl+): L = PPO(w, A) + beta [min(k3(pi_ref/pi_theta), 10) + l^2/2 - SG(l^2/2)].
    Straight-through: k3's value, k2's gradient beta l grad logp (k1+ and abs+ have the same gradient)."""
    lpr = _l(t)
    return differentiable(t, _k3(lpr).clamp_(-VALUE_CLAMP, VALUE_CLAMP), lpr)


def _nemo_rl(t: PolicyTerms, w: Tensor | float) -> LossOutput:
    """NeMo-RL's calculate_kl(k3) times a weight w (value w, gradient w grad logp): l clamped to
    +-20 (the weight detached there: no gradient beyond), then w k3 clamped to +-10."""
    lpr = _l(t)
    inside = lpr.abs() <= 20.0
    value = _k3(lpr.clamp(-20.0, 20.0)).mul_(w)
    return differentiable(t, *_clamp(value, torch.where(inside, lpr * w, 0.0)))


def nemo_rl_k3(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation False: L = PPO(w, A) + beta clamp(exp(logp - SG(logp)) k3(pi_ref/pi_theta), -10, 10).
    The weight is 1 with gradient grad logp: gradient beta l grad logp where |l| <= 20 and k3 <= 10."""
    return _nemo_rl(t, 1.0)


def nemo_rl_k3_on_policy(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation True; slime low_var_kl with --use-unbiased-kl:
    L = PPO(w, A) + beta clamp(w k3(pi_ref/pi_theta), -10, 10), gradient through w.
    Gradient beta w l grad logp where |l| <= 20 and |w k3| <= 10 (the URKL gradient, clamped)."""
    return _nemo_rl(t, t.w.detach())


def openrlhf_k3_unbiased_gradient(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss --algo.kl.unbiased_gradient (estimator k3):
    L = PPO(w, A) + beta [SG(min(k3(pi_ref/pi_theta), 10)) + SG(min(w, 10)) (l^2/2 - SG(l^2/2))].
    Gradient beta min(w, 10) l grad logp (the URKL gradient where w <= 10), whatever the estimator."""
    lpr, w = _l(t), t.w.detach()
    return differentiable(t, _k3(lpr).clamp_(-VALUE_CLAMP, VALUE_CLAMP), lpr.mul(w.clamp(max=IS_WEIGHT_CLIP)))


# ------------------------------------------------------------------ KL in the reward
def _in_reward(t: PolicyTerms, k: Callable[[Tensor], Tensor]) -> LossOutput:
    """PPO(w, A'), A'_t = A - beta sum_{s>=t} k_s, k_s = k(log(pi_old/pi_ref)) per token (0 when
    pi_ref = pi_old). At sequence level the one entry's k is of the sequence log-ratio. Measures k_t."""
    with torch.no_grad():
        k_t = torch.zeros_like(t.w.detach()) if t.log_rho is None else masked(k(-t.log_rho), t.mask)
        to_go = k_t.flip(-1).cumsum(-1).flip(-1)  # returns-to-go (OpenRLHF's gamma = 1)
        value, g, window = reward_value_and_grad(dataclasses.replace(t, adv=t.adv - t.config.beta * to_go))
    return with_gradient(t, value, g), Measured(kl=k_t, clip=window)


def openrlhf_k1_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k1 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} clamp(log(pi_old/pi_ref), -10, 10)_s.
    On-policy its gradient is the sequence reverse KL's (RKL), at either weight level."""
    return _in_reward(t, lambda x: x.clamp(-VALUE_CLAMP, VALUE_CLAMP))


def openrlhf_k2_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k2 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(log(pi_old/pi_ref)^2 / 2, 10)_s."""
    return _in_reward(t, lambda x: (0.5 * x.square()).clamp(max=VALUE_CLAMP))


def openrlhf_k3_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k3 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(k3(pi_ref/pi_old), 10)_s."""
    return _in_reward(t, lambda x: _k3(x).clamp_(max=VALUE_CLAMP))


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
    "nemo_rl_k3": (nemo_rl_k3, "NeMo-RL k3, use_on_policy_kl_approximation False (value-1 weight with gradient)"),
    "nemo_rl_k3_on_policy": (nemo_rl_k3_on_policy, "NeMo-RL use_on_policy_kl_approximation True; slime "
                             "low_var_kl --use-unbiased-kl (w k3 clamped at 10)"),
}  # fmt: skip

#: another framework's name for a function registered already -> (that key, its --help note)
ALIASES: dict[str, tuple[tuple[str, str], str]] = {
    "verl_low_var_kl": (("openrlhf_k3_loss", "differentiable"), "verl kl_loss_type low_var_kl/k3, slime "
                        "low_var_kl: = openrlhf_k3_loss"),
    "trl_k3": (("grpo_kl", "differentiable"), "TRL GRPO beta > 0, GRPO's original k3, slime k3: = grpo_kl"),
    "trl_k3_bias_corrected": (("grpo_kl_corrected", "differentiable"), "TRL use_bias_correction_kl: = "
                              "grpo_kl_corrected"),
    "deepseek_v32_k3": (("grpo_kl_corrected", "differentiable"), "DeepSeek-V3.2's k3 times pi_theta/pi_old: "
                        "= grpo_kl_corrected"),
    "slime_k3_unbiased": (("grpo_kl_corrected", "differentiable"), "slime k3 --use-unbiased-kl: = grpo_kl_corrected"),
    "slime_k1_unbiased": (("rkl", "differentiable"), "slime k1 --use-unbiased-kl (w lpr): = rkl, differentiable"),
}  # fmt: skip

for _name, (_fn, _) in KL_OPTIONS.items():
    register_loss(_name, "differentiable")(_fn)
for _name, (_key, _) in ALIASES.items():
    register_loss(_name, "differentiable")(LOSSES[_key])
del _name, _fn, _key

#: every name this module adds to --rpg.loss, with its --help note
KL_OPTION_NAMES: tuple[str, ...] = (*KL_OPTIONS, *ALIASES)
KL_OPTION_HELP: dict[str, str] = {
    **{n: h for n, (_, h) in KL_OPTIONS.items()},
    **{n: h for n, (_, h) in ALIASES.items()},
}

__all__ = ["ALIASES", "KL_OPTIONS", "KL_OPTION_HELP", "KL_OPTION_NAMES", *KL_OPTIONS]
