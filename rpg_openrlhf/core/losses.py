"""RPG policy losses (arXiv 2505.17508): the entry points compute_loss and token_losses.

J(theta) = E_theta[R] - beta * D(pi_theta, pi_ref), estimated from samples of pi_old. Where to read:
  rpg_losses.py   every registered (divergence, style), one function each, its formula in its docstring
  styles.py       the five styles: differentiable, reinforce, reinforce_clip (RPG-Style Clip) and the
                  released code's two, each a formula over a divergence's D_t and score s_t
  kl.py           the four divergences: D_t and s_t = dD_t/dlog pi_theta
  kl_options.py   every framework's KL option (OpenRLHF, verl, TRL, slime, NeMo-RL)
  terms.py        PolicyTerms (what a loss sees), Measured (what it reports), LossConfig, the registry
One call: compute_loss -> _loss_and_terms (checks, PolicyTerms, LOSSES[(name, style)], the rollout
correction) -> the registered function -> its style -> PPO / the stated gradient; then the metrics.

All log ratios are clamped to [-log_ratio_clamp, log_ratio_clamp] (default 20, as OpenRLHF's
PolicyLoss) before exp; outside that band the weight is constant and its gradient zero.
Samples from another policy mu (the rollout engine's): LossConfig.rollout_correction and the
rollout_logp argument weight the whole loss by pi_old/mu (correction.py; one place: _correct).
The defaults are the paper's text. The released code (github.com/complex-reasoning/RPG) departs
from it in five places; each is an explicit option here (docs/losses.md, "The released code"):
LossConfig.kl_value_clamp, LossConfig.kl_rho, LossConfig.aggregation_scope and the styles
reinforce_released / reinforce_clip_released.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from . import kl_options as _kl_options  # noqa: F401  (registers every framework's KL option)
from . import rpg_losses as _rpg_losses  # noqa: F401  (registers the paper's losses)
from .aggregation import aggregate, counts, masked
from .correction import CORRECTION_METRICS, RolloutCorrection, correction_metrics, rollout_weight
from .kl import clamped_log_ratio
from .settings import WEIGHT_LEVELS
from .styles import (
    clamp_kl_value,
    differentiable,
    hard_clipped_weight,
    kl_inputs,
    kl_value,
    kl_value_and_score,
    measured_kl,
    ppo_surrogate,
    ppo_value_and_grad,
    regularized_advantage,
    reinforce,
    reinforce_clip,
    reinforce_clip_released,
    reinforce_coef,
    reinforce_released,
    released_kl_score,
    reward_term,
    reward_value_and_grad,
    with_gradient,
)
from .terms import (
    FRAMEWORK_OPTIONS,
    LOSSES,
    ClipWindow,
    LossConfig,
    LossOutput,
    Measured,
    PolicyTerms,
    check_loss,
    register_loss,
    registered_names,
    registered_styles,
)

#: the paper's loss names and styles (built in; every registered one: registered_names/styles())
LOSS_NAMES = ("fkl", "rkl", "ufkl", "urkl", "grpo_kl", "grpo_kl_corrected")
STYLES = ("differentiable", "reinforce", "reinforce_clip", "reinforce_released", "reinforce_clip_released")
METRIC_NAMES = ("kl", "w_mean", "w_max", "w_min", "clip_frac_low", "clip_frac_high", "clip_frac_dual")
CLIP_METRICS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual")


# ------------------------------------------------------------------ entry points
def _check_shapes(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    ref_logp: Tensor | None,
    rollout_logp: Tensor | None,
) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp: expected a [B, T] tensor, got shape {tuple(logp.shape)}")
    others = (
        ("old_logp", old_logp),
        ("ref_logp", ref_logp),
        ("action_mask", action_mask),
        ("rollout_logp", rollout_logp),
    )
    for arg, x in others:
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{arg}: shape {tuple(x.shape)} does not match logp {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(
            f"advantages: shape {tuple(advantages.shape)} must be [B, T] or [B] with logp {tuple(logp.shape)}"
        )


def _inputs(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, ref_logp: Tensor | None, rollout_logp: Tensor | None
) -> dict[str, Tensor]:
    """The inputs whose entries must be finite, by name (those given)."""
    xs = {"logp": logp.detach(), "old_logp": old_logp, "advantages": advantages}
    xs.update({k: v for k, v in (("ref_logp", ref_logp), ("rollout_logp", rollout_logp)) if v is not None})
    return xs


def _finite_flags(inputs: dict[str, Tensor]) -> Tensor:
    """One bool per input (no host sync here): is every entry finite? min/max propagate NaN and
    +-inf, so one aminmax pass per input (no [B, T] temporaries) decides it exactly."""
    return torch.isfinite(torch.stack([torch.stack(torch.aminmax(x)) for x in inputs.values()])).all(-1)


def _raise_if_not_finite(names: list[str], flags: list[bool]) -> None:
    for arg, ok in zip(names, flags):
        if not ok:
            raise ValueError(f"{arg}: contains NaN or inf")


def _build_terms(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    ref_logp: Tensor | None,
    config: LossConfig,
) -> PolicyTerms:
    mask = torch.ones_like(logp.detach()) if action_mask is None else action_mask  # bool or float
    old_logp = old_logp.detach()
    ref_logp = None if ref_logp is None else ref_logp.detach()
    adv = advantages.detach()
    if config.weight_level == "sequence":
        # The same formulas on sequence sums of log-probs: one loss per sequence, [B, 1].
        logp, old_logp = (
            masked(logp, mask).sum(-1, keepdim=True),
            masked(old_logp, mask).sum(-1, keepdim=True),
        )
        ref_logp = None if ref_logp is None else masked(ref_logp, mask).sum(-1, keepdim=True)
        mask = mask.to(logp.dtype)
        n_tok = mask.sum(-1, keepdim=True)
        adv = adv.unsqueeze(-1) if adv.dim() == 1 else (adv * mask).sum(-1, keepdim=True) / n_tok.clamp(min=1)
        mask = (n_tok > 0).to(logp.dtype)
    elif adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # broadcast over tokens
    log_w = clamped_log_ratio(logp, old_logp, config.log_ratio_clamp)
    # a framework's KL option forms its own log-ratios from the raw log-probs (no rho of the core's)
    framework = name in FRAMEWORK_OPTIONS
    log_rho = (
        None
        if ref_logp is None or framework
        else clamped_log_ratio(ref_logp, old_logp, config.log_ratio_clamp)
    )
    rho = 1.0 if log_rho is None else log_rho.exp()
    return PolicyTerms(name, logp, log_w, log_w.exp(), log_rho, rho, adv, mask, config, old_logp, ref_logp)


def _loss_and_terms(
    name: str,
    style: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    ref_logp: Tensor | None,
    config: LossConfig,
    rollout_logp: Tensor | None = None,
) -> tuple[Tensor, PolicyTerms, Measured, dict[str, Tensor]]:
    """(per-token loss, its terms, what the loss measured, the rollout correction's 0-d metrics)."""
    fn = check_loss(name, style, config)
    if config.rollout_correction.enabled and rollout_logp is None:
        raise ValueError(
            f"rollout_logp: required with rollout_correction level {config.rollout_correction.level!r} "
            f"(the log-probs of the policy that sampled the batch)"
        )
    _check_shapes(logp, old_logp, advantages, action_mask, ref_logp, rollout_logp)
    terms = _build_terms(name, logp, old_logp, advantages, action_mask, ref_logp, config)
    loss, measured = _unpack(name, style, fn(terms))
    loss, corrected = _correct(loss, old_logp, rollout_logp, action_mask, config)
    return loss, terms, measured, corrected


def _correct(
    loss: Tensor,
    old_logp: Tensor,
    rollout_logp: Tensor | None,
    action_mask: Tensor | None,
    config: LossConfig,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The one place the rollout-mismatch correction enters: L <- SG(c) L, the whole per-token (or
    per-sequence) loss of every registered loss, c = correction.rollout_weight (token: [B, T],
    seq: [B, 1], broadcast over the sequence's tokens). Also its metrics (correction_metrics:
    vllm_kl whenever rollout_logp is given, is_filter_ratio / is_weight_mean with the correction on)."""
    if rollout_logp is None:
        return loss, {}
    mask = torch.ones_like(old_logp, dtype=torch.bool) if action_mask is None else action_mask
    c = config.rollout_correction
    if not c.enabled:
        return loss, correction_metrics(old_logp, rollout_logp, mask)
    weight, filtered = rollout_weight(old_logp, rollout_logp, mask, c, config.log_ratio_clamp)
    return loss * weight.to(loss.dtype), correction_metrics(old_logp, rollout_logp, mask, weight, filtered)


def _unpack(name: str, style: str, out: LossOutput) -> tuple[Tensor, Measured]:
    """(per-token loss, Measured) from what a registered loss returned (a bare loss measured nothing)."""
    if isinstance(out, Tensor):
        return out, Measured()
    if (
        isinstance(out, tuple)
        and len(out) == 2
        and isinstance(out[0], Tensor)
        and isinstance(out[1], Measured)
    ):
        return out
    raise TypeError(
        f"loss ({name!r}, {style!r}): a registered loss returns a Tensor or (Tensor, Measured), "
        f"got {type(out).__name__}"
    )


def token_losses(
    name: str,
    style: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    ref_logp: Tensor | None = None,
    config: LossConfig = LossConfig(),  # noqa: B008 (frozen, immutable default)
    *,
    rollout_logp: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Unaggregated loss of LOSSES[(name, style)]. Returns (loss, mask, metrics-tensors).

    weight_level="token": loss and mask are [B, T]. weight_level="sequence": the same formulas
    applied to sequence sums of log-probs (A = masked token mean of advantages); loss and mask are
    [B, 1]. Masked entries of loss are not zeroed: aggregate() multiplies by the mask.
    rollout_logp: log-probs of the policy mu that sampled the batch (the rollout engine's), [B, T];
    required when config.rollout_correction is on: the loss is then SG(c) L (correction.py)."""
    loss, terms, measured, corrected = _loss_and_terms(
        name, style, logp, old_logp, advantages, action_mask, ref_logp, config, rollout_logp
    )
    inputs = _inputs(logp, old_logp, advantages, ref_logp, rollout_logp)
    _raise_if_not_finite(list(inputs), _finite_flags(inputs).tolist())
    return loss, terms.mask, _metric_tensors(terms, measured, loss.shape, corrected)


@torch.no_grad()
def _metric_tensors(
    t: PolicyTerms, measured: Measured, loss_shape: torch.Size, corrected: dict[str, Tensor]
) -> dict[str, Tensor]:
    """The weight statistics of the inputs (masked token or sequence statistics, 0-d tensors), the
    rollout correction's (0-d) and what the loss measured: its per-token kl (and per-token extras)
    stay per token, for the caller to aggregate like the loss; clip fractions only where the loss
    reported its clip."""
    # count_nonzero and where(): no [B, T] int64 / float copies of bool masks (peak memory)
    cfg, mask = t.config, t.mask
    valid = mask if mask.dtype == torch.bool else mask > 0
    n = counts(valid)
    w = t.w.detach().expand_as(mask)
    # independent reductions (torch.compile fuses them over w: none waits on another, so w is
    # never materialized); w > 0, so masked zeros never exceed the maximum
    w_or_0 = torch.where(valid, w, 0.0)
    w_mean, w_max = w_or_0.sum() / n, w_or_0.amax()
    del w_or_0  # not held through the KL metric below (peak memory)
    w_min = torch.where(valid, w, math.inf).amin()
    stats = {"w_mean": w_mean, "w_max": w_max, "w_min": w_min}
    stats.update({k: v.to(w.dtype) for k, v in corrected.items()})
    if measured.clip is not None:
        stats.update(_clip_fractions(measured.clip, valid, n, cfg, w))
    if measured.kl is not None:  # last: a deferred D_t is the largest temporary here
        stats["kl"] = measured.kl() if callable(measured.kl) else measured.kl
    for key, value in measured.extra.items():
        if key in stats:
            raise ValueError(
                f"metrics: {key!r} is a reserved metric name; report it through Measured's own field"
            )
        stats[key] = value
    for key, value in stats.items():
        if value.dim() > 0 and value.shape != loss_shape:
            raise ValueError(
                f"metrics: {key!r} has shape {tuple(value.shape)}; a metric is 0-d or shaped like the "
                f"loss {tuple(loss_shape)}"
            )
    return {k: stats[k] for k in (*[k for k in (*METRIC_NAMES, *CORRECTION_METRICS) if k in stats], *stats)}


def _clip_fractions(
    window: ClipWindow | Literal[False], valid: Tensor, n: Tensor, cfg: LossConfig, w: Tensor
) -> dict[str, Tensor]:
    """Fractions of the n masked tokens in each zero-gradient branch of the clip (0 without one)."""
    low = high = dual = torch.zeros((), dtype=w.dtype, device=w.device)
    if window is not False:
        ratio, adv = window.ratio, window.adv
        neg = window.neg & valid
        low = counts(neg & (ratio < 1 - cfg.eps_low)) / n
        high = counts((adv > 0) & valid & (ratio > 1 + cfg.eps_high)) / n
        if cfg.clip_c is not None:
            dual = counts(neg & (ratio > cfg.clip_c)) / n
    return dict(zip(CLIP_METRICS, (low, high, dual)))


def compute_loss(
    name: str,
    style: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None = None,
    ref_logp: Tensor | None = None,
    config: LossConfig = LossConfig(),  # noqa: B008 (frozen, immutable default)
    dp_size: int = 1,
    batch_num_tokens: float | Tensor | None = None,
    global_batch_size: float | Tensor | None = None,
    *,
    rollout_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss = aggregate(token_losses(...), config.aggregation, normalizers) and float metrics:
    w_mean, w_max, w_min, and what the loss measured (Measured): kl (the per-token KL value
    aggregated like the loss), clip_frac_low, clip_frac_high, clip_frac_dual (fractions of masked
    tokens in each zero-gradient PPO branch), extras. Every built-in loss reports all of
    METRIC_NAMES; a loss that reports nothing gets the weight statistics only. With rollout_logp
    (the sampling policy mu's log-probs; required when config.rollout_correction is on) also
    CORRECTION_METRICS: vllm_kl, and is_filter_ratio / is_weight_mean when the correction is on.
    The normalizers are unchanged by the correction (a filtered unit still counts, as OpenRLHF).
    One host sync: the input finiteness check and the metrics are read back together."""
    loss, terms, measured, corrected = _loss_and_terms(
        name, style, logp, old_logp, advantages, action_mask, ref_logp, config, rollout_logp
    )
    inputs = _inputs(logp, old_logp, advantages, ref_logp, rollout_logp)
    flags = _finite_flags(inputs)
    n_inputs = len(flags)
    if config.weight_level == "sequence":
        # One loss entry per sequence: the "token" count of a token-mean is the sequence count.
        batch_num_tokens = global_batch_size
    step_token_mean = config.aggregation == "token-mean" and config.aggregation_scope == "step"
    local = (batch_num_tokens if step_token_mean else global_batch_size) is None
    if local:  # a local mean of an all-masked batch is 0/0: checked in the same host sync
        flags = torch.cat([flags, terms.mask.any().reshape(1)])
    norm = {"dp_size": dp_size, "batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size}
    scope = config.aggregation_scope
    shape = loss.shape
    loss = aggregate(loss, terms.mask, config.aggregation, scope=scope, **norm)
    stats = _metric_tensors(terms, measured, shape, corrected)
    for key in [k for k, v in stats.items() if v.dim() > 0]:  # per token: aggregated like the loss
        stats[key] = aggregate(stats[key], terms.mask, config.aggregation, scope=scope, **norm)
    dtype = stats["kl"].dtype if "kl" in stats else stats["w_mean"].dtype
    values = torch.cat([flags.to(dtype), torch.stack(list(stats.values()))]).tolist()
    _raise_if_not_finite(list(inputs), [bool(v) for v in values[:n_inputs]])
    if local and not values[n_inputs]:
        raise ValueError(
            "action_mask: every token is masked, so the batch's own mean is 0/0; pass the step's "
            "normalizers (batch_num_tokens / global_batch_size: the batch then adds 0) or leave it out"
        )
    return loss, dict(zip(stats, values[len(flags) :]))


__all__ = [
    "CLIP_METRICS",
    "CORRECTION_METRICS",
    "LOSSES",
    "LOSS_NAMES",
    "METRIC_NAMES",
    "STYLES",
    "WEIGHT_LEVELS",
    "ClipWindow",
    "LossConfig",
    "LossOutput",
    "Measured",
    "PolicyTerms",
    "RolloutCorrection",
    "check_loss",
    "clamp_kl_value",
    "compute_loss",
    "differentiable",
    "hard_clipped_weight",
    "kl_inputs",
    "kl_value",
    "kl_value_and_score",
    "measured_kl",
    "ppo_surrogate",
    "ppo_value_and_grad",
    "register_loss",
    "registered_names",
    "registered_styles",
    "regularized_advantage",
    "reinforce",
    "reinforce_clip",
    "reinforce_clip_released",
    "reinforce_coef",
    "reinforce_released",
    "released_kl_score",
    "reward_term",
    "reward_value_and_grad",
    "token_losses",
    "with_gradient",
]
