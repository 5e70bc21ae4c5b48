"""RPG policy losses (arXiv 2505.17508): each style is its formula in one function, applied to a
divergence of kl.DIVERGENCES (Tables 1 and 2); autograd gives the gradient (`.detach()` is SG). Per
token: w = pi_theta/pi_old, rho = pi_ref/pi_old, A the advantage, D_t and s_t = dD_t/dlog pi_theta a
divergence's value and score, PPO(r, A) OpenRLHF's dual clip, w_h = clamp(w, 1-eps_low, 1+eps_high):

    differentiable            L = PPO(w, A) + beta D_t
    reinforce                 L = -SG(coef) log pi_theta,   coef = w A - beta s_t
    reinforce_clip            L = PPO(w, A'),               A' = SG(coef / w)   (RPG-Style Clip)
    reinforce_released        the released code's REINFORCE (s_t and w A at w_h)
    reinforce_clip_released   the released code's RPG-Style Clip (branch on sign(A), s_t at w_h)
plus GRPO's grpo_kl and grpo_kl_corrected. Log ratios are clamped to +-log_ratio_clamp (20, as OpenRLHF)
before exp; the rollout correction weights the whole loss by SG(pi_old/mu) (correction.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from .aggregation import aggregate, counts, masked
from .correction import CORRECTION_METRICS, correction_metrics, rollout_weight
from .kl import DIVERGENCES, Divergence, clamped_log_ratio
from .settings import SettingError
from .terms import FRAMEWORK_OPTIONS, LOSSES, ClipWindow, LossConfig, Measured, PolicyTerms, register_loss

#: the paper's loss names and styles (every registered one: registered_names/styles())
LOSS_NAMES = ("fkl", "rkl", "ufkl", "urkl", "grpo_kl", "grpo_kl_corrected")
STYLES = ("differentiable", "reinforce", "reinforce_clip", "reinforce_released", "reinforce_clip_released")
METRIC_NAMES = ("kl", "w_mean", "w_max", "w_min", "clip_frac_low", "clip_frac_high", "clip_frac_dual")
CLIP_METRICS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual")


# ------------------------------------------------------------------ the pieces every style shares
def ppo_surrogate(t: PolicyTerms, ratio: Tensor, adv: Tensor) -> tuple[Tensor, Measured]:
    """Dual-clip PPO(r, A) as OpenRLHF's PolicyLoss: -A min(r, 1+eps_high) for A >= 0,
    -A clamp(r, 1-eps_low, c) for A < 0. Measured(clip=its window)."""
    cfg, neg = t.config, adv < 0
    r = torch.where(neg, ratio.clamp(1 - cfg.eps_low, cfg.clip_c), ratio.clamp(max=1 + cfg.eps_high))
    return -(r * adv), Measured(clip=ClipWindow(ratio.detach(), adv, neg))


def reward_term(t: PolicyTerms, adv: Tensor | None = None) -> tuple[Tensor, Measured]:
    """The differentiable styles' reward part: PPO(w, A) if config.clip_reward, else -w A."""
    adv = t.adv if adv is None else adv
    return ppo_surrogate(t, t.w, adv) if t.config.clip_reward else (-(t.w * adv), Measured(clip=False))


def kl_inputs(t: PolicyTerms, log_w: Tensor | None = None, w: Tensor | None = None):
    """(log(pi_theta/pi_ref), w, rho), the arguments of D_t and s_t, at the terms' w or at (log_w, w);
    kl_rho False (the released code): as if sampled from pi_ref, w -> pi_theta/pi_ref, rho -> 1."""
    if log_w is None or w is None:
        log_w, w = t.log_w, t.w
    if t.log_rho is None:
        return log_w, w, t.rho
    log_pr = log_w - t.log_rho
    return (log_pr, w, t.rho) if t.config.kl_rho else (log_pr, log_pr.exp(), 1.0)


def _div(div: Divergence | str) -> Divergence:
    return DIVERGENCES[div] if isinstance(div, str) else div


def kl_value(t: PolicyTerms, div: Divergence | str) -> Tensor:
    """D_t with its gradient, clamped to +-config.kl_value_clamp where the released code clamps it."""
    div = _div(div)
    d_t, k = div.value(*kl_inputs(t)), t.config.kl_value_clamp
    return d_t.clamp(-k, k) if k is not None and div.value_clamped else d_t


def reinforce_coef(t: PolicyTerms, div: Divergence | str) -> Tensor:
    """coef = SG(w A - beta s_t), the REINFORCE coefficient."""
    with torch.no_grad():
        s_t = _div(div).score(*kl_inputs(t))
        s_t = s_t if isinstance(s_t, Tensor) else t.w.new_tensor(s_t)
        return torch.addcmul(s_t * -t.config.beta, t.w, t.adv)


def measured_kl(t: PolicyTerms, div: Divergence | str) -> Measured:
    """Measured(kl=D_t) at w (no value clamp), for a loss whose KL enters through its gradient only."""
    with torch.no_grad():
        return Measured(kl=_div(div).value(*kl_inputs(t)))


def regularized_advantage(t: PolicyTerms, div: Divergence | str) -> Tensor:
    """A' = SG(coef / w), so that coef = w A'."""
    return reinforce_coef(t, div) / t.w.detach()


def hard_clipped_weight(t: PolicyTerms) -> tuple[Tensor, Tensor]:
    """SG(log w_h, w_h), w_h = clamp(w, 1 - eps_low, 1 + eps_high)."""
    cfg = t.config
    low = math.log(1 - cfg.eps_low) if cfg.eps_low < 1 else -math.inf
    log_wh = t.log_w.detach().clamp(low, math.log1p(cfg.eps_high))
    return log_wh, log_wh.exp()


# ------------------------------------------------------------------ the five styles (Table 1)
def differentiable(t: PolicyTerms, div: Divergence | str | Tensor) -> tuple[Tensor, Measured]:
    """L = PPO(w, A) + beta D_t   (clip_reward False: -w A + beta D_t; the KL part never clipped, as the
    paper's code). div: a divergence, or any per-token D_t with its gradient. Measures D_t, the clip."""
    reward, clip = reward_term(t)
    d_t = div if isinstance(div, Tensor) else kl_value(t, div)
    return torch.add(reward, d_t, alpha=t.config.beta), clip | Measured(kl=d_t.detach())


def reinforce(t: PolicyTerms, div: Divergence | str) -> tuple[Tensor, Measured]:
    """L = -SG(coef) log pi_theta,  coef = w A - beta s_t. Measures D_t; no clip."""
    return -reinforce_coef(t, div) * t.logp, measured_kl(t, div) | Measured(clip=False)


def reinforce_clip(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """RPG-Style Clip: L = PPO(w, A'),  A' = SG(coef / w) = A - beta s_t / w, coef = w A - beta s_t:
    the gradient is -coef grad log pi_theta inside the window, 0 outside it. Measures D_t, the clip on A'."""
    loss, clip = ppo_surrogate(t, t.w, regularized_advantage(t, div))
    return loss, clip | measured_kl(t, div)


def reinforce_released(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """The released code's REINFORCE: L = -SG(w_h A - beta s_t(w_h)) log pi_theta. Measures D_t (at w); no clip."""
    log_wh, w_h = hard_clipped_weight(t)
    with torch.no_grad():
        neg_coef = t.config.beta * div.score(*kl_inputs(t, log_wh, w_h)) - w_h * t.adv
    return neg_coef * t.logp, measured_kl(t, div) | Measured(clip=False)


def reinforce_clip_released(t: PolicyTerms, div: Divergence) -> tuple[Tensor, Measured]:
    """The released code's RPG-Style Clip, its branch on sign(A), not sign(A') (A = 0 goes negative):
    A > 0 passes iff w < 1+eps_high; A <= 0 passes iff 1-eps_low <= w < c.
    Passing tokens:  L = -SG(w A - beta s_t(w_h)) log pi_theta.
    Clipped tokens:  L = -SG(K) SG(log pi_theta), no gradient, K = A (1+eps_high) + beta s_t(w_h)
    (high), A (1-eps_low) + beta s_t(w_h) (low), A c - beta s_t(w_h) (dual). Measures D_t (at w), the clip."""
    cfg = t.config
    with torch.no_grad():
        w, adv = t.w.detach(), t.adv
        kl = cfg.beta * div.score(*kl_inputs(t, *hard_clipped_weight(t)))
        neg = adv <= 0
        high = ~neg & (w >= 1 + cfg.eps_high)
        low = neg & (w < 1 - cfg.eps_low)
        dual = neg & (w >= cfg.clip_c) if cfg.clip_c is not None else torch.zeros_like(neg)
        k = torch.where(high, adv * (1 + cfg.eps_high) + kl, w * adv - kl)
        k = torch.where(low, adv * (1 - cfg.eps_low) + kl, k)
        k = torch.where(dual, adv * (cfg.clip_c or 0.0) - kl, k)
    loss = -k * torch.where(high | low | dual, t.logp.detach(), t.logp)
    return loss, measured_kl(t, div) | Measured(clip=ClipWindow(w, adv, neg))


for _div_name in ("fkl", "rkl", "ufkl", "urkl"):
    for _fn in (differentiable, reinforce, reinforce_clip, reinforce_released, reinforce_clip_released):
        register_loss(_div_name, _fn.__name__)(functools.partial(_fn, div=DIVERGENCES[_div_name]))


# ------------------------------------------------------------------ GRPO's KL term
@register_loss("grpo_kl", "differentiable")
def grpo_kl(t: PolicyTerms) -> tuple[Tensor, Measured]:
    """GRPO: L = PPO(w, A) + beta k3(pi_ref/pi_theta),  k3(y) = y - 1 - log y, no importance weight.
    Gradient beta (1 - pi_ref/pi_theta) grad log pi_theta: the FKL gradient on-policy only."""
    reward, clip = reward_term(t)
    log_y, k = t.log_rp, t.config.kl_value_clamp
    k3 = torch.expm1(log_y) - log_y  # expm1: exact near y = 1
    k3 = k3 if k is None else k3.clamp(-k, k)
    return torch.add(reward, k3, alpha=t.config.beta), clip | Measured(kl=k3.detach())


@register_loss("grpo_kl_corrected", "differentiable")
def grpo_kl_corrected(t: PolicyTerms) -> tuple[Tensor, Measured]:
    """Corrected GRPO: L = PPO(w, A) + beta w k3(pi_ref/pi_theta), gradient through w.
    w k3(rho / w) = w log(w / rho) - w + rho is URKL's D_t term for term: the URKL gradient."""
    return differentiable(t, DIVERGENCES["urkl"])


# ------------------------------------------------------------------ entry points
def check_loss(name: str, style: str, config: LossConfig) -> Callable[[PolicyTerms], object]:
    """The loss (name, style) after the rules tying the config to it; ValueError naming the argument
    (SettingError for a config field)."""
    if (name, style) not in LOSSES:
        if name not in (names := {n for n, _ in LOSSES}):
            raise ValueError(f"name: unknown loss {name!r}, expected one of {sorted(names)}")
        styles = sorted(s for n, s in LOSSES if n == name)
        raise ValueError(f"style: {style!r} is not available for loss {name!r}, expected one of {styles}")
    own = f"{name!r} computes its framework's KL term exactly, with that framework's own clamps"
    if name in FRAMEWORK_OPTIONS and config.kl_value_clamp is not None:
        raise SettingError("kl_value_clamp", f"{own} and no other; the KL value clamp applies to RPG's own losses",
                           also=("name",))  # fmt: skip
    if name in FRAMEWORK_OPTIONS and not config.kl_rho:
        raise SettingError("kl_rho", f"{own}, which takes no rho = pi_ref/pi_old weight; kl_rho applies to RPG's "
                           "own losses", also=("name",))  # fmt: skip
    if config.kl_value_clamp is not None and style != "differentiable":
        raise SettingError("kl_value_clamp", "clamps the KL value term of the differentiable style (the released "
                           f"code's KL loss); style {style!r} has no such term", also=("style",))  # fmt: skip
    return LOSSES[(name, style)]


def _finite_flags(**inputs: Tensor | None) -> tuple[list[str], Tensor]:
    """(the given inputs' names, is each finite?) without a host sync: min/max propagate NaN and +-inf."""
    xs = [torch.stack(torch.aminmax(v.detach())) for v in inputs.values() if v is not None]
    return [k for k, v in inputs.items() if v is not None], torch.isfinite(torch.stack(xs)).all(-1)


def _raise_if_not_finite(names: list[str], flags: list[bool]) -> None:
    if bad := [arg for arg, ok in zip(names, flags) if not ok]:
        raise ValueError(f"{bad[0]}: contains NaN or inf")


def _build_terms(name: str, logp: Tensor, old_logp: Tensor, advantages: Tensor, action_mask: Tensor | None,
                 ref_logp: Tensor | None, config: LossConfig) -> PolicyTerms:  # fmt: skip
    mask = torch.ones_like(logp.detach()) if action_mask is None else action_mask  # bool or float
    old_logp, adv = old_logp.detach(), advantages.detach()
    ref_logp = None if ref_logp is None else ref_logp.detach()
    if config.weight_level == "sequence":  # the same formulas on sequence sums of log-probs, [B, 1]
        logp, old_logp = (masked(x, mask).sum(-1, keepdim=True) for x in (logp, old_logp))
        ref_logp = None if ref_logp is None else masked(ref_logp, mask).sum(-1, keepdim=True)
        n_tok = mask.to(logp.dtype).sum(-1, keepdim=True)
        adv = adv.unsqueeze(-1) if adv.dim() == 1 else (adv * mask).sum(-1, keepdim=True) / n_tok.clamp(min=1)
        mask = (n_tok > 0).to(logp.dtype)
    elif adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # broadcast over tokens
    log_w = clamped_log_ratio(logp, old_logp, config.log_ratio_clamp)
    # a framework's KL option forms its own log-ratios from the raw log-probs (no rho of the core's)
    no_rho = ref_logp is None or name in FRAMEWORK_OPTIONS
    log_rho = None if no_rho else clamped_log_ratio(ref_logp, old_logp, config.log_ratio_clamp)
    rho = 1.0 if log_rho is None else log_rho.exp()
    return PolicyTerms(name, logp, log_w, log_w.exp(), log_rho, rho, adv, mask, config, old_logp, ref_logp)


def _loss_and_terms(name: str, style: str, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                    action_mask: Tensor | None, ref_logp: Tensor | None, config: LossConfig,
                    rollout_logp: Tensor | None) -> tuple[Tensor, PolicyTerms, dict[str, Tensor], list[str], Tensor]:  # fmt: skip
    """(loss, terms, metric tensors, input names, finiteness flags); the one place of L <- SG(c) L (correction)."""
    check_loss(name, style, config)
    if config.rollout_correction.enabled and rollout_logp is None:
        raise ValueError(f"rollout_logp: required with rollout_correction level {config.rollout_correction.level!r} "
                         f"(the log-probs of the policy that sampled the batch)")  # fmt: skip
    if logp.dim() != 2:
        raise ValueError(f"logp: expected a [B, T] tensor, got shape {tuple(logp.shape)}")
    given = dict(ref_logp=ref_logp, rollout_logp=rollout_logp)
    shaped = dict(old_logp=old_logp, ref_logp=ref_logp, action_mask=action_mask, rollout_logp=rollout_logp)
    for arg, x in shaped.items():
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{arg}: shape {tuple(x.shape)} does not match logp {tuple(logp.shape)}")
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f"advantages: shape {tuple(advantages.shape)} must be [B, T] or [B] with logp "
                         f"{tuple(logp.shape)}")  # fmt: skip
    terms = _build_terms(name, logp, old_logp, advantages, action_mask, ref_logp, config)
    out = LOSSES[(name, style)](terms)
    out = (out, Measured()) if isinstance(out, Tensor) else out  # a bare loss measured nothing
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor)
            and isinstance(out[1], Measured)):  # fmt: skip
        raise TypeError(f"loss ({name!r}, {style!r}): a registered loss returns a Tensor or (Tensor, Measured), "
                        f"got {type(out).__name__}")  # fmt: skip
    loss, measured = out
    corrected, c = {}, config.rollout_correction
    if rollout_logp is not None:
        mask = torch.ones_like(old_logp, dtype=torch.bool) if action_mask is None else action_mask
        if not c.enabled:
            corrected = correction_metrics(old_logp, rollout_logp, mask)
        else:
            weight, filtered = rollout_weight(old_logp, rollout_logp, mask, c, config.log_ratio_clamp)
            corrected = correction_metrics(old_logp, rollout_logp, mask, weight, filtered)
            loss = loss * weight.to(loss.dtype)
    names, flags = _finite_flags(logp=logp, old_logp=old_logp, advantages=advantages, **given)
    return loss, terms, _metric_tensors(terms, measured, loss.shape, corrected), names, flags


def token_losses(name: str, style: str, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 action_mask: Tensor | None = None, ref_logp: Tensor | None = None,
                 config: LossConfig = LossConfig(),  # noqa: B008 (frozen, immutable default)
                 *, rollout_logp: Tensor | None = None) -> tuple[Tensor, Tensor, dict]:  # fmt: skip
    """(loss, mask, metric tensors) of LOSSES[(name, style)], unaggregated, masked entries not zeroed: [B, T]
    (weight_level "sequence": on sequence sums of log-probs, A their token mean, [B, 1]). rollout_logp:
    the sampling policy mu's log-probs (config.rollout_correction needs them)."""
    loss, terms, stats, names, flags = _loss_and_terms(name, style, logp, old_logp, advantages, action_mask,
                                                       ref_logp, config, rollout_logp)  # fmt: skip
    _raise_if_not_finite(names, flags.tolist())
    return loss, terms.mask, stats


@torch.no_grad()
def _metric_tensors(t: PolicyTerms, measured: Measured, loss_shape: torch.Size,
                    corrected: dict[str, Tensor]) -> dict[str, Tensor]:  # fmt: skip
    """w and correction statistics (0-d), what the loss measured, the clip fractions of the masked tokens."""
    cfg, mask = t.config, t.mask
    valid = mask if mask.dtype == torch.bool else mask > 0
    n = counts(valid)
    w = t.w.detach().expand_as(mask)
    w_or_0 = torch.where(valid, w, 0.0)  # w > 0: masked zeros never exceed the maximum
    stats = {"w_mean": w_or_0.sum() / n, "w_max": w_or_0.amax(), "w_min": torch.where(valid, w, math.inf).amin()}  # fmt: skip
    stats.update({k: v.to(w.dtype) for k, v in corrected.items()})
    if measured.clip is not None:
        low = high = dual = torch.zeros((), dtype=w.dtype, device=w.device)
        if (window := measured.clip) is not False:
            neg = window.neg & valid
            low = counts(neg & (window.ratio < 1 - cfg.eps_low)) / n
            high = counts((window.adv > 0) & valid & (window.ratio > 1 + cfg.eps_high)) / n
            if cfg.clip_c is not None:
                dual = counts(neg & (window.ratio > cfg.clip_c)) / n
        stats.update(zip(CLIP_METRICS, (low, high, dual)))
    if measured.kl is not None:
        stats["kl"] = measured.kl() if callable(measured.kl) else measured.kl
    for key, value in measured.extra.items():
        if key in stats:
            raise ValueError(f"metrics: {key!r} is a reserved metric name; report it through Measured's own field")  # fmt: skip
        stats[key] = value
    for key, value in stats.items():
        if value.dim() > 0 and value.shape != loss_shape:
            raise ValueError(f"metrics: {key!r} has shape {tuple(value.shape)}; a metric is 0-d or shaped like "
                             f"the loss {tuple(loss_shape)}")  # fmt: skip
    return {k: stats[k] for k in (*[k for k in (*METRIC_NAMES, *CORRECTION_METRICS) if k in stats], *stats)}


def compute_loss(name: str, style: str, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 action_mask: Tensor | None = None, ref_logp: Tensor | None = None,
                 config: LossConfig = LossConfig(),  # noqa: B008 (frozen, immutable default)
                 dp_size: int = 1, batch_num_tokens: float | Tensor | None = None,
                 global_batch_size: float | Tensor | None = None,
                 *, rollout_logp: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:  # fmt: skip
    """aggregate(token_losses(...)) and float metrics: w_mean/max/min, what the loss measured (kl, clip_frac_*,
    extras; per-token ones aggregated like the loss), CORRECTION_METRICS with rollout_logp. One host sync."""
    loss, terms, stats, names, flags = _loss_and_terms(name, style, logp, old_logp, advantages, action_mask,
                                                       ref_logp, config, rollout_logp)  # fmt: skip
    n_inputs = len(flags)
    if config.weight_level == "sequence":  # one loss entry per sequence: a token-mean counts sequences
        batch_num_tokens = global_batch_size
    step_token_mean = config.aggregation == "token-mean" and config.aggregation_scope == "step"
    local = (batch_num_tokens if step_token_mean else global_batch_size) is None
    if local:  # a local mean of an all-masked batch is 0/0: checked in the same host sync
        flags = torch.cat([flags, terms.mask.any().reshape(1)])
    norm = dict(dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                scope=config.aggregation_scope)  # fmt: skip
    loss = aggregate(loss, terms.mask, config.aggregation, **norm)
    for key in [k for k, v in stats.items() if v.dim() > 0]:  # per token: aggregated like the loss
        stats[key] = aggregate(stats[key], terms.mask, config.aggregation, **norm)
    dtype = stats["kl"].dtype if "kl" in stats else stats["w_mean"].dtype
    values = torch.cat([flags.to(dtype), torch.stack(list(stats.values()))]).tolist()
    _raise_if_not_finite(names, [bool(v) for v in values[:n_inputs]])
    if local and not values[n_inputs]:
        raise ValueError("action_mask: every token is masked, so the batch's own mean is 0/0; pass the step's "
                         "normalizers (batch_num_tokens / global_batch_size: the batch then adds 0) or leave it out")  # fmt: skip
    return loss, dict(zip(stats, values[len(flags) :]))
