"""Every framework's KL option as a registered core loss, each its framework's formula (docs/kl-options.md),
registered under the framework's name with style "differentiable" (ALIASES: the same function under
another name). Per token, from the raw log-probs as the frameworks form them (not the core's clamped
log_w, log_rho): l = log pi_theta - log pi_ref (pi_ref = pi_old without a reference), w = exp(log
pi_theta - log pi_old), k3 = e^-l - 1 + l = k3(pi_ref/pi_theta), SG = .detach().
  KL as a loss:   L = PPO(w, A) + beta v_t, v_t with the framework's SG and clamps (no others).
  KL in the reward (OpenRLHF without --algo.kl.use_loss): L = PPO(w, A'_t), A'_t = A - beta sum_{s>=t} k_s.
PPO(w, A) is OpenRLHF's PolicyLoss; kl_rho, kl_value_clamp are refused (check_loss); `rpg-mechanisms
conformance` (exp6) runs the frameworks' own functions against these."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .aggregation import masked
from .losses import reward_term
from .terms import LOSSES, LossOutput, Measured, PolicyTerms, register_loss

VALUE_CLAMP = 10.0  # |v_t| <= 10: OpenRLHF's compute_approx_kl, verl's low_var_kl, NeMo-RL's output clamp
IS_WEIGHT_CLIP = 10.0  # OpenRLHF's KL_IS_WEIGHT_CLIP: w <= 10 in --algo.kl.unbiased_gradient
NEMO_RL_INPUT_CLAMP = 20.0  # NeMo-RL's calculate_kl clamps l to +-20 before exp


def _l(t: PolicyTerms) -> Tensor:  # l = log pi_theta - log pi_ref (pi_ref = pi_old without one)
    return t.logp - (t.old_logp if t.ref_logp is None else t.ref_logp)


def _w(t: PolicyTerms) -> Tensor:  # w = exp(log pi_theta - log pi_old), no clamp
    return (t.logp - t.old_logp).exp()


def _k3(lpr: Tensor) -> Tensor:  # k3(pi_ref/pi_theta) = e^-l - 1 + l (expm1: exact near l = 0)
    return torch.expm1(-lpr) + lpr


def _k2(lpr: Tensor) -> Tensor:  # l^2 / 2 as l * l: square's backward (2 l) overflows under clamps
    return 0.5 * (lpr * lpr)


def _kl_loss(t: PolicyTerms, v_t: Tensor) -> LossOutput:
    """L = PPO(w, A) + beta v_t (the reward term is OpenRLHF's PolicyLoss). Measures v_t."""
    reward, clip = reward_term(t)
    return torch.add(reward, v_t, alpha=t.config.beta), clip | Measured(kl=v_t.detach())


# ------------------------------------------------------------------ KL as a loss
def openrlhf_k1_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss, estimator k1: L = PPO(w, A) + beta clamp(l, -10, 10); gradient beta
    grad logp, zero in expectation on-policy.  (openrlhf/models/utils.py compute_approx_kl)"""
    return _kl_loss(t, _l(t).clamp(-VALUE_CLAMP, VALUE_CLAMP))


def verl_k1(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k1 (kl): L = PPO(w, A) + beta l.  (verl/trainer/ppo/core_algos.py kl_penalty_forward)"""
    return _kl_loss(t, _l(t))


def openrlhf_k2_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss, estimator k2: L = PPO(w, A) + beta min(l^2 / 2, 10).
    (openrlhf/models/utils.py compute_approx_kl)"""
    return _kl_loss(t, _k2(_l(t)).clamp(-VALUE_CLAMP, VALUE_CLAMP))


def verl_k2(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k2 (mse), slime k2: L = PPO(w, A) + beta l^2 / 2.
    (verl/trainer/ppo/core_algos.py kl_penalty_forward)"""
    return _kl_loss(t, _k2(_l(t)))


def openrlhf_k3_loss(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.use_loss, estimator k3, verl low_var_kl: L = PPO(w, A) + beta min(k3, 10), l
    clamped at -10 before exp (where k3 > 10 already).  (openrlhf/models/utils.py compute_approx_kl)"""
    return _kl_loss(t, _k3(_l(t).clamp(min=-VALUE_CLAMP)).clamp(-VALUE_CLAMP, VALUE_CLAMP))


def verl_abs(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type abs: L = PPO(w, A) + beta |l|.  (verl/trainer/ppo/core_algos.py kl_penalty_forward)"""
    return _kl_loss(t, _l(t).abs())


def verl_k3plus(t: PolicyTerms) -> LossOutput:
    """verl kl_loss_type k3+ (low_var_kl+): L = PPO(w, A) + beta [SG(min(k3, 10)) + l^2/2 - SG(l^2/2)]: k3's
    value, k2's gradient (= k1+, abs+ gradients).  (verl/trainer/ppo/core_algos.py kl_penalty)"""
    lpr = _l(t)
    k2_grad = lpr.detach() * (lpr - lpr.detach())  # l^2/2 - SG(l^2/2) as SG(l) (l - SG(l)): no inf - inf
    return _kl_loss(t, _k3(lpr).clamp(-VALUE_CLAMP, VALUE_CLAMP).detach() + k2_grad)


def _weighted_k3(weight: Tensor, lpr: Tensor) -> tuple[Tensor, Tensor]:
    """SG(weight k3), SG(weight l): with (l - SG(l)) w k3's value and gradient w l, without the two ~w e^-l
    terms autograd adds and cancels (TRL's float32 is 12x off at l < -8). weight: w, or NeMo-RL's 1."""
    return weight * _k3(lpr), weight * lpr


def _nemo_rl(t: PolicyTerms, weight: Tensor) -> LossOutput:
    """NeMo-RL: L = PPO(w, A) + beta clamp(weight k3(clamp(l, -20, 20)), -10, 10), no gradient where a
    clamp binds.  (nemo_rl/algorithms/utils.py calculate_kl; loss_functions.py ClippedPGLossFn)"""
    lpr = _l(t)
    value, score = _weighted_k3(weight, lpr.detach().clamp(-NEMO_RL_INPUT_CLAMP, NEMO_RL_INPUT_CLAMP))
    score = torch.where((lpr.detach().abs() <= NEMO_RL_INPUT_CLAMP) & ~(value > VALUE_CLAMP), score, 0.0)
    return _kl_loss(t, value.clamp(-VALUE_CLAMP, VALUE_CLAMP) + score * (lpr - lpr.detach()))


def nemo_rl_k3(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation False: L = PPO(w, A) + beta clamp(exp(logp - SG(logp)) k3,
    -10, 10): gradient beta l grad logp where |l| <= 20 and k3 <= 10."""
    return _nemo_rl(t, torch.ones_like(t.w.detach()))


def nemo_rl_k3_on_policy(t: PolicyTerms) -> LossOutput:
    """NeMo-RL k3, use_on_policy_kl_approximation True: L = PPO(w, A) + beta clamp(w k3, -10, 10), l clamped
    to +-20: gradient beta w l grad logp (URKL's) where |l| <= 20 and |w k3| <= 10."""
    return _nemo_rl(t, _w(t).detach())


def openrlhf_k3_unbiased_gradient(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.unbiased_gradient: L = PPO(w, A) + beta [SG(min(k3, 10)) + SG(min(w, 10)) (l^2/2 -
    SG(l^2/2))]: gradient beta min(w, 10) l grad logp.  (openrlhf/models/utils.py compute_approx_kl)"""
    lpr = _l(t)
    k2, is_weight = _k2(lpr), _w(t).clamp(max=IS_WEIGHT_CLIP).detach()
    return _kl_loss(t, _k3(lpr).clamp(-VALUE_CLAMP, VALUE_CLAMP).detach() + is_weight * (k2 - k2.detach()))


def trl_k3(t: PolicyTerms) -> LossOutput:
    """TRL GRPO beta > 0 without use_bias_correction_kl, GRPO's k3, slime k3: L = PPO(w, A) + beta k3, no
    clamp (= grpo_kl without RPG's clamps).  (trl/trainer/grpo_trainer.py _compute_loss)"""
    return _kl_loss(t, _k3(_l(t)))


def trl_k3_bias_corrected(t: PolicyTerms) -> LossOutput:
    """TRL use_bias_correction_kl (its default), DeepSeek-V3.2, slime k3 --use-unbiased-kl: L = PPO(w, A) +
    beta w k3, gradient through w (URKL's), no clamp.  (trl/trainer/grpo_trainer.py _compute_loss)"""
    lpr = _l(t)
    value, score = _weighted_k3(_w(t).detach(), lpr.detach())
    return _kl_loss(t, value + score * (lpr - lpr.detach()))


def slime_k1_unbiased(t: PolicyTerms) -> LossOutput:
    """slime k1 --use-unbiased-kl: L = PPO(w, A) + beta w l, gradient through w (RKL's), no clamp.
    (slime/utils/ppo_utils.py compute_approx_kl(importance_ratio=...))"""
    return _kl_loss(t, _l(t) * _w(t))


# ------------------------------------------------------------------ KL in the reward
def _in_reward(t: PolicyTerms, k: Callable[[Tensor], Tensor]) -> LossOutput:
    """PPO(w, A'), A'_t = A - beta sum_{s>=t} k_s, k_s = k(log pi_old - log pi_ref) (0 when pi_ref = pi_old),
    as OpenRLHF's compute_reward and get_cumulative_returns. Measures k_t."""
    with torch.no_grad():
        k_t = torch.zeros_like(t.w.detach()) if t.ref_logp is None else masked(k(t.old_logp - t.ref_logp), t.mask)  # fmt: skip
        to_go = k_t.flip(-1).cumsum(-1).flip(-1)  # returns-to-go (OpenRLHF's gamma = 1)
    loss, clip = reward_term(t, t.adv - t.config.beta * to_go)
    return loss, clip | Measured(kl=k_t)


def _k3_of(x: Tensor) -> Tensor:  # OpenRLHF's k3 of log_ratio x: x clamped at -10 before exp, the value at 10
    return _k3(x.clamp(min=-VALUE_CLAMP)).clamp(-VALUE_CLAMP, VALUE_CLAMP)


def openrlhf_k1_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k1 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} clamp(log(pi_old/pi_ref), -10, 10)_s."""
    return _in_reward(t, lambda x: x.clamp(-VALUE_CLAMP, VALUE_CLAMP))


def openrlhf_k2_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k2 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(log(pi_old/pi_ref)^2 / 2, 10)_s."""
    return _in_reward(t, lambda x: _k2(x).clamp(-VALUE_CLAMP, VALUE_CLAMP))


def openrlhf_k3_reward(t: PolicyTerms) -> LossOutput:
    """OpenRLHF --algo.kl.estimator k3 in the reward: L = PPO(w, A'), A'_t = A - beta sum_{s>=t} min(k3(pi_ref/pi_old), 10)_s."""
    return _in_reward(t, _k3_of)


# ------------------------------------------------------------------ the registry
#: name -> (the function, its --help note); docs/kl-options.md: each one's source and measured verdict
KL_OPTIONS: dict[str, tuple[Callable[[PolicyTerms], LossOutput], str]] = {
    "openrlhf_k1_loss": (openrlhf_k1_loss, "OpenRLHF --algo.kl.use_loss, estimator k1 (no KL gradient on-policy)"),
    "openrlhf_k2_loss": (openrlhf_k2_loss, "OpenRLHF --algo.kl.use_loss, estimator k2 (value clamped at 10)"),
    "openrlhf_k3_loss": (openrlhf_k3_loss, "OpenRLHF --algo.kl.use_loss, estimator k3 (GRPO's k3 clamped at 10)"),
    "openrlhf_k3_unbiased_gradient": (openrlhf_k3_unbiased_gradient, "OpenRLHF --algo.kl.unbiased_gradient (k3 value, gradient min(w, 10) lpr)"),
    "openrlhf_k1_reward": (openrlhf_k1_reward, "OpenRLHF k1 in the reward (at pi_old, returns-to-go)"),
    "openrlhf_k2_reward": (openrlhf_k2_reward, "OpenRLHF k2 in the reward (at pi_old, returns-to-go)"),
    "openrlhf_k3_reward": (openrlhf_k3_reward, "OpenRLHF k3 in the reward (at pi_old, returns-to-go)"),
    "verl_k1": (verl_k1, "verl kl_loss_type k1/kl (no KL gradient on-policy)"),
    "verl_k2": (verl_k2, "verl kl_loss_type k2/mse, slime k2"),
    "verl_abs": (verl_abs, "verl kl_loss_type abs"),
    "verl_k3plus": (verl_k3plus, "verl kl_loss_type k3+ (k3's value, k2's gradient; = k1+, abs+ gradients)"),
    "trl_k3": (trl_k3, "TRL GRPO beta > 0 without use_bias_correction_kl, GRPO's original k3, slime k3 (no clamp)"),
    "trl_k3_bias_corrected": (trl_k3_bias_corrected, "TRL use_bias_correction_kl (w k3, no clamp)"),
    "slime_k1_unbiased": (slime_k1_unbiased, "slime k1 --use-unbiased-kl (w lpr, no clamp)"),
    "nemo_rl_k3": (nemo_rl_k3, "NeMo-RL k3, use_on_policy_kl_approximation False (value-1 weight with gradient)"),
    "nemo_rl_k3_on_policy": (nemo_rl_k3_on_policy, "NeMo-RL use_on_policy_kl_approximation True (w k3 clamped at 10)"),
}  # fmt: skip

#: another framework's name for a function registered already -> (that key, its --help note)
ALIASES: dict[str, tuple[tuple[str, str], str]] = {
    "verl_low_var_kl": (("openrlhf_k3_loss", "differentiable"), "verl kl_loss_type low_var_kl/k3, slime low_var_kl: = openrlhf_k3_loss"),
    "deepseek_v32_k3": (("trl_k3_bias_corrected", "differentiable"), "DeepSeek-V3.2's k3 times pi_theta/pi_old: = trl_k3_bias_corrected"),
    "slime_k3_unbiased": (("trl_k3_bias_corrected", "differentiable"), "slime k3 --use-unbiased-kl: = trl_k3_bias_corrected"),
}  # fmt: skip

for _name, (_fn, _) in KL_OPTIONS.items():
    register_loss(_name, "differentiable", framework=True)(_fn)
for _name, (_key, _) in ALIASES.items():
    register_loss(_name, "differentiable", framework=True)(LOSSES[_key])
del _name, _fn, _key

#: every name this module adds to --rpg.loss, with its --help note
KL_OPTION_NAMES: tuple[str, ...] = (*KL_OPTIONS, *ALIASES)
KL_OPTION_HELP: dict[str, str] = {n: h for n, (_, h) in (*KL_OPTIONS.items(), *ALIASES.items())}
