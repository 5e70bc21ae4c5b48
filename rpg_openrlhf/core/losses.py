"""RPG policy losses (arXiv 2505.17508): fully differentiable and REINFORCE-style surrogates of
J(theta) = E_theta[R] - beta * D(pi_theta, pi_ref), RPG-Style Clip, and GRPO's KL term.

Samples come from pi_old; w = pi_theta / pi_old, rho = pi_ref / pi_old (rho = 1 when ref_logp is
None, i.e. pi_ref = pi_old), A = advantage (stop-gradient). Each divergence contributes a per-token
value D_t and score s_t = dD_t/dlog pi_theta (kl.py). From them, once:
  REINFORCE coefficient  coef = w A - beta s_t          (gradient of every style = -coef grad logp)
  regularized advantage  A'   = coef / w                (RPG-Style Clip: dual-clip PPO on (w, A'))
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

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .aggregation import AGGREGATION_SCOPES, AGGREGATIONS, aggregate, counts, masked
from .correction import CORRECTION_METRICS, RolloutCorrection, correction_metrics, rollout_weight
from .kl import DIVERGENCES, clamped_log_ratio

LOSS_NAMES = ("fkl", "rkl", "ufkl", "urkl", "grpo_kl", "grpo_kl_corrected")
STYLES = ("differentiable", "reinforce", "reinforce_clip", "reinforce_released", "reinforce_clip_released")
WEIGHT_LEVELS = ("token", "sequence")
METRIC_NAMES = ("kl", "w_mean", "w_max", "w_min", "clip_frac_low", "clip_frac_high", "clip_frac_dual")
CLIP_METRICS = ("clip_frac_low", "clip_frac_high", "clip_frac_dual")


@dataclass(frozen=True)
class LossConfig:
    beta: float = 1e-4
    eps_low: float = 0.2
    eps_high: float = 0.28
    clip_c: float | None = None  # dual-clip bound c (> 1) or None (off)
    clip_reward: bool = True  # differentiable style: clipped PPO reward term, else -w*A
    weight_level: str = "token"  # "token" (paper's code) | "sequence" (paper's theory)
    aggregation: str = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum"
    log_ratio_clamp: float = 20.0  # |log w| clamp, as OpenRLHF's PolicyLoss
    # The released code's behaviour, off by default (docs/losses.md, "The released code"):
    kl_value_clamp: float | None = None  # differentiable style: clamp D_t to [-K, K] (released: 10)
    kl_rho: bool = True  # False: KL part without the rho = pi_ref/pi_old weight (released code)
    aggregation_scope: str = "step"  # "step" | "micro_batch" (released: mean of micro-batch means)
    # samples from the rollout engine's mu, not pi_old: OpenRLHF's is_correction (correction.py)
    rollout_correction: RolloutCorrection = RolloutCorrection()

    def __post_init__(self) -> None:
        if isinstance(self.rollout_correction, Mapping):  # LossConfig(**dataclasses.asdict(cfg))
            object.__setattr__(self, "rollout_correction", RolloutCorrection(**self.rollout_correction))
        if not self.beta >= 0:
            raise ValueError(f"beta: must be >= 0, got {self.beta}")
        for field in ("eps_low", "eps_high"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: clip epsilon must be > 0, got {getattr(self, field)}")
        if self.clip_c is not None and not self.clip_c > 1:
            raise ValueError(f"clip_c: dual-clip bound must be > 1 (or None), got {self.clip_c}")
        if self.weight_level not in WEIGHT_LEVELS:
            raise ValueError(f"weight_level: unknown {self.weight_level!r}, expected one of {WEIGHT_LEVELS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation: unknown {self.aggregation!r}, expected one of {AGGREGATIONS}")
        if not self.log_ratio_clamp > 0:
            raise ValueError(f"log_ratio_clamp: must be > 0, got {self.log_ratio_clamp}")
        if self.kl_value_clamp is not None and not self.kl_value_clamp > 0:
            raise ValueError(f"kl_value_clamp: must be > 0 (or None), got {self.kl_value_clamp}")
        if self.aggregation_scope not in AGGREGATION_SCOPES:
            raise ValueError(
                f"aggregation_scope: unknown {self.aggregation_scope!r}, expected one of {AGGREGATION_SCOPES}"
            )
        if not isinstance(self.rollout_correction, RolloutCorrection):
            raise ValueError(
                f"rollout_correction: expected a RolloutCorrection, got {type(self.rollout_correction).__name__}"
            )
        if self.rollout_correction.level == "token" and self.weight_level == "sequence":
            raise ValueError(
                "rollout_correction: token-level correction needs token-level weights (weight_level "
                "'token'); with weight_level 'sequence' use level 'seq'"
            )


@dataclass(eq=False)
class PolicyTerms:
    """What a registered loss sees: per-token (or per-sequence) quantities, computed once (read only:
    what a loss measures it returns in a Measured, never writes here)."""

    name: str
    logp: Tensor  # log pi_theta (carries gradient)
    log_w: Tensor  # clamped log(pi_theta / pi_old) (carries gradient)
    w: Tensor  # exp(log_w)
    log_rho: Tensor | None  # clamped log(pi_ref / pi_old); None: pi_ref = pi_old
    rho: Tensor | float  # exp(log_rho), 1.0 when pi_ref = pi_old
    adv: Tensor  # advantage A (no gradient), [B, T] or [B, 1]
    mask: Tensor
    config: LossConfig

    # Plain properties, not functools.cached_property: that takes an RLock on Python 3.11, which
    # torch.compile (Dynamo) cannot trace (graph breaks). Recomputing is one subtraction at most,
    # and a loss that does not need the tensor (grpo_kl) never holds it.
    @property
    def log_pr(self) -> Tensor:
        """log(pi_theta / pi_ref) = log_w - log_rho."""
        return self.log_w if self.log_rho is None else self.log_w - self.log_rho

    @property
    def log_rp(self) -> Tensor:
        """log(pi_ref / pi_theta) = log_rho - log_w (GRPO's k3 argument); a fresh tensor on every call."""
        return -self.log_w if self.log_rho is None else self.log_rho - self.log_w


@dataclass(frozen=True, eq=False)
class ClipWindow:
    """The dual-clip PPO window a loss applied: the ratio and advantage fed to it and its negative
    branch `neg` (A < 0; A <= 0 for the released clip). Reported as the fractions of masked tokens
    clip_frac_low (neg, ratio < 1-eps_low), clip_frac_high (A > 0, ratio > 1+eps_high) and
    clip_frac_dual (neg, ratio > c)."""

    ratio: Tensor
    adv: Tensor
    neg: Tensor


@dataclass(eq=False)
class Measured:
    """What a loss measured, returned beside its per-token loss (as verl's policy losses return their
    metrics): compute_loss reports exactly this plus the weight statistics w_mean/w_max/w_min of its
    inputs, and makes nothing up for what is missing.

    kl     per-token D_t (no gradient), aggregated like the loss     -> metric `kl`; or a function
           computing it, called with the metrics, after the loss (peak memory: measured_kl)
    clip   the ClipWindow of its PPO clip                            -> clip_frac_low/high/dual;
           False: the loss has no clip (the fractions are exactly 0); None: not reported
    extra  any other metric: a tensor shaped like the loss is aggregated like it, a 0-d one is
           reported as it is"""

    kl: Tensor | Callable[[], Tensor] | None = None
    clip: ClipWindow | Literal[False] | None = None
    extra: dict[str, Tensor] = dataclasses.field(default_factory=dict)

    def __or__(self, other: Measured) -> Measured:
        """The measurements of two parts of one loss (a field set in both: the right one's)."""
        return Measured(
            other.kl if other.kl is not None else self.kl,
            other.clip if other.clip is not None else self.clip,
            {**self.extra, **other.extra},
        )


#: a registered loss returns its per-token loss, or (per-token loss, what it measured)
LossOutput = Tensor | tuple[Tensor, Measured]
LossFn = Callable[[PolicyTerms], LossOutput]
LOSSES: dict[tuple[str, str], LossFn] = {}


def register_loss(name: str, style: str) -> Callable[[LossFn], LossFn]:
    """Decorator: LOSSES[(name, style)] = fn, where fn(terms: PolicyTerms) -> per-token loss, or
    (per-token loss, Measured) to report its KL and clip fractions."""

    def decorator(fn: LossFn) -> LossFn:
        if (name, style) in LOSSES:
            raise ValueError(f"name: loss ({name!r}, {style!r}) is already registered")
        LOSSES[(name, style)] = fn
        return fn

    return decorator


# ------------------------------------------------------------------ shared building blocks
class _GivenGradient(torch.autograd.Function):
    """A per-token loss value computed without autograd whose gradient w.r.t. log pi_theta is
    g * grad_output. Every built-in loss is elementwise in log pi_theta, so its gradient is one
    per-token factor (the REINFORCE coefficient, the PPO window, the divergences' scores; the tests
    check each against autograd and the exact gradient): backward holds g alone, one [B, T]
    tensor, where autograd through the value holds w, A and masks (torch.compile too)."""

    @staticmethod
    def forward(ctx, logp: Tensor, value: Tensor, g: Tensor) -> Tensor:
        ctx.save_for_backward(g)
        return value

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (g,) = ctx.saved_tensors
        return grad * g, None, None


def with_gradient(t: PolicyTerms, value: Tensor, g: Tensor) -> Tensor:
    """value (no autograd) carrying the per-token gradient g w.r.t. log pi_theta, where g is a
    derivative through w = exp(clamped log w): zeroed where the log-ratio clamp holds w at
    e^+-log_ratio_clamp (w is constant there, as autograd through the clamp gives beyond it).
    g is modified in place."""
    with torch.no_grad():
        log_w, k = t.log_w.detach(), t.config.log_ratio_clamp
        g.masked_fill_((log_w >= k).logical_or_(log_w <= -k), 0.0)
    return _GivenGradient.apply(t.logp, value, g)


def _add_scaled(x: Tensor, y: Tensor | float, alpha: float) -> Tensor:
    """x += alpha y in place (y a tensor or a number)."""
    return x.add_(y, alpha=alpha) if isinstance(y, Tensor) else x.add_(alpha * y)


@torch.no_grad()
def ppo_value_and_grad(
    t: PolicyTerms, adv: Tensor, g: Tensor | None = None
) -> tuple[Tensor, Tensor, ClipWindow]:
    """Dual-clip PPO on (w, A), value, gradient w.r.t. log pi_theta and the window applied:
    value -A r_eff,  r_eff = min(w, 1+eps_high) (A >= 0), clamp(w, 1-eps_low, c) (A < 0)
    (= max(-w A, -clip(w) A), and min(that, -c A) for A < 0: OpenRLHF's PolicyLoss);
    gradient -A w inside the window (bounds inclusive, as clamp's gradient), 0 outside; added in
    place to g when given (a fresh tensor of the caller's)."""
    cfg = t.config
    lo, hi, c = 1 - cfg.eps_low, 1 + cfg.eps_high, cfg.clip_c
    w = t.w.detach()
    neg = adv < 0
    # the clipped tokens of each branch (strict: clamp's gradient passes at a bound)
    clipped = [(neg & (w < lo), lo), (~neg & (w > hi), hi)] + ([(neg & (w > c), c)] if c is not None else [])
    outside = clipped[0][0] | clipped[1][0]
    if c is not None:
        outside.logical_or_(clipped[2][0])
    if g is None:  # -A w: addcmul on a 0-d zero is one pass
        g = torch.addcmul(w.new_zeros(()), adv, w, value=-1.0).masked_fill_(outside, 0.0)
    else:
        g.sub_(torch.mul(adv, w).masked_fill_(outside, 0.0))
    r_eff = w.clone()  # after the gradient's temporary is gone (peak memory)
    for mask, bound in clipped:
        r_eff.masked_fill_(mask, bound)
    return r_eff.mul_(adv).neg_(), g, ClipWindow(w, adv, neg)


def ppo_surrogate(t: PolicyTerms, ratio: Tensor, adv: Tensor) -> tuple[Tensor, Measured]:
    """Dual-clip PPO:  A >= 0: max(-r A, -clip(r, 1-eps_low, 1+eps_high) A)
                       A <  0: min(max(-r A, -clip(r, 1-eps_low, 1+eps_high) A), -c A)
    written as -A * r_eff with r_eff = min(r, 1+eps_high) (A >= 0), clamp(r, 1-eps_low, c) (A < 0):
    same value and gradient as OpenRLHF's PolicyLoss. Gradient -A grad r inside the window, zero
    outside. For r = w (every built-in loss) through ppo_value_and_grad and with_gradient.
    Returns (per-token loss, Measured(clip=its window))."""
    if ratio is t.w:
        value, g, window = ppo_value_and_grad(t, adv)
        return with_gradient(t, value, g), Measured(clip=window)
    cfg = t.config
    neg = adv < 0
    r_eff = torch.where(neg, ratio.clamp(1 - cfg.eps_low, cfg.clip_c), ratio.clamp(max=1 + cfg.eps_high))
    return torch.mul(r_eff, adv).neg_(), Measured(clip=ClipWindow(ratio.detach(), adv, neg))


@torch.no_grad()
def reward_value_and_grad(
    t: PolicyTerms, g: Tensor | None = None
) -> tuple[Tensor, Tensor, ClipWindow | Literal[False]]:
    """Reward part of the differentiable surrogates: PPO(w, A) if clip_reward, else -w A (gradient
    -w A, no clip: False); the gradient added in place to g when given."""
    if t.config.clip_reward:
        return ppo_value_and_grad(t, t.adv, g)
    value = torch.mul(t.w.detach(), t.adv).neg_()
    return value, value.clone() if g is None else g.sub_(torch.mul(t.w.detach(), t.adv)), False


def reward_term(t: PolicyTerms) -> tuple[Tensor, Measured]:
    """Reward part of the differentiable surrogates: PPO(w, A) if clip_reward else -w A."""
    value, g, window = reward_value_and_grad(t)
    return with_gradient(t, value, g), Measured(clip=window)


def measured_kl(t: PolicyTerms, divergence: str) -> Measured:
    """Measured(kl=D_t) of `divergence` (kl_rho honoured; no value clamp: a style with a KL value
    term reports the term itself), for a loss whose KL enters only through its gradient. D_t is
    computed with the metrics, once the loss's temporaries are gone (peak memory)."""
    return Measured(kl=lambda: DIVERGENCES[divergence].value(*kl_inputs(t)))


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
    """(clamp(D_t, -K, K), the score with zeros where the clamp is active), K = config.kl_value_clamp
    (None: both unchanged). The released code clamps its KL penalties to [-10, 10], beyond which
    their gradient is zero."""
    k = t.config.kl_value_clamp
    if k is None:
        return value, score
    return value.clamp(-k, k), torch.where(value.abs() <= k, score, 0.0)


@torch.no_grad()
def kl_value_and_score(t: PolicyTerms, divergence: str) -> tuple[Tensor, Tensor | float]:
    """(D_t, dD_t/dlog pi_theta) of `divergence`; kl_rho and kl_value_clamp honoured."""
    div = DIVERGENCES[divergence]
    args = kl_inputs(t)
    value, score = div.value(*args), div.score(*args)
    # callers write into both: never hand back an input (a divergence may return one as is)
    value, score = (x.clone() if any(x is a for a in args) else x for x in (value, score))
    return clamp_kl_value(t, value, score) if div.value_clamped else (value, score)


def kl_value(t: PolicyTerms, divergence: str) -> Tensor:
    """D_t of `divergence` carrying its gradient (its score); kl_rho and kl_value_clamp honoured."""
    value, score = kl_value_and_score(t, divergence)
    g = torch.full_like(value, score) if not isinstance(score, Tensor) else score.expand_as(value).clone()
    return with_gradient(t, value, g)


@torch.no_grad()
def reinforce_coef(t: PolicyTerms, divergence: str, sign: float = 1.0) -> Tensor:
    """coef = w A - beta dD_t/dlog pi_theta (stop-gradient): the REINFORCE coefficient (times sign)."""
    score = DIVERGENCES[divergence].score(*kl_inputs(t))
    # sign (w A - beta s) as (-sign beta) s + sign w A: one fresh tensor (none for a number s)
    if isinstance(score, Tensor):
        return torch.mul(score, -sign * t.config.beta).addcmul_(t.w, t.adv, value=sign)
    base = torch.tensor(-sign * t.config.beta * score, dtype=t.w.dtype, device=t.w.device)
    return torch.addcmul(base, t.w, t.adv, value=sign)


@torch.no_grad()
def regularized_advantage(t: PolicyTerms, divergence: str) -> Tensor:
    """A' = coef / w (stop-gradient), so that coef = w A'."""
    return reinforce_coef(t, divergence).div_(t.w)


def differentiable(t: PolicyTerms, divergence: str) -> tuple[Tensor, Measured]:
    """L_t = reward_term(w, A) + beta D_t (KL part unclipped, as the paper's code); gradient the
    reward term's plus beta s_t, the divergence's score. Measures D_t and the reward's clip."""
    with torch.no_grad():  # the KL part first, then the reward's temporaries (peak memory)
        d_t, score = kl_value_and_score(t, divergence)
    return reward_plus_kl(t, d_t, score)


def reward_plus_kl(t: PolicyTerms, d_t: Tensor, score: Tensor | float) -> tuple[Tensor, Measured]:
    """reward_term(w, A) + beta D_t, given D_t and its score (a fresh tensor, or a number): the
    reward's gradient accumulates into beta s_t in place (peak memory). Measures D_t and the clip."""
    beta = t.config.beta
    with torch.no_grad():
        g = (
            score.mul_(beta)
            if isinstance(score, Tensor) and score.shape == d_t.shape
            else (
                torch.mul(torch.as_tensor(score, dtype=d_t.dtype, device=d_t.device), beta)
                .expand_as(d_t)
                .clone()
            )
        )
        value, g, window = reward_value_and_grad(t, g)
        value.add_(d_t, alpha=beta)
    return with_gradient(t, value, g), Measured(kl=d_t, clip=window)


def reinforce(t: PolicyTerms, divergence: str) -> tuple[Tensor, Measured]:
    """L_t = -SG(coef) log pi_theta. Measures D_t; no clip."""
    loss = torch.mul(reinforce_coef(t, divergence, sign=-1.0), t.logp)
    return loss, measured_kl(t, divergence) | Measured(clip=False)


def reinforce_clip(t: PolicyTerms, divergence: str) -> tuple[Tensor, Measured]:
    """RPG-Style Clip: L_t = dual-clip PPO(w, A'), A' = coef / w. Measures D_t and the clip on A'."""
    value, g, window = ppo_value_and_grad(t, regularized_advantage(t, divergence))
    return with_gradient(t, value, g), measured_kl(t, divergence) | Measured(clip=window)


# ------------------------------------------------------------------ the released code's estimators
@torch.no_grad()
def hard_clipped_weight(t: PolicyTerms) -> tuple[Tensor, Tensor]:
    """(log w_h, w_h) with w_h = clamp(w, 1 - eps_low, 1 + eps_high), no gradient."""
    cfg = t.config
    low = math.log(1 - cfg.eps_low) if cfg.eps_low < 1 else -math.inf
    log_wh = t.log_w.detach().clamp(low, math.log1p(cfg.eps_high))
    return log_wh, log_wh.exp()


@torch.no_grad()
def released_kl_score(t: PolicyTerms, divergence: str) -> Tensor | float:
    """beta s_t(w_h): the released code's KL part, its score taken at the hard-clipped weight."""
    return t.config.beta * DIVERGENCES[divergence].score(*kl_inputs(t, *hard_clipped_weight(t)))


def reinforce_released(t: PolicyTerms, divergence: str) -> tuple[Tensor, Measured]:
    """Released REINFORCE: L_t = -SG(w_h A - beta s_t(w_h)) log pi_theta, w_h = clamp(w, 1-eps_low, 1+eps_high).
    Measures D_t (at w); no PPO clip."""
    with torch.no_grad():
        coef = hard_clipped_weight(t)[1] * t.adv - released_kl_score(t, divergence)
    return torch.mul(coef.neg_(), t.logp), measured_kl(t, divergence) | Measured(clip=False)


def reinforce_clip_released(t: PolicyTerms, divergence: str) -> tuple[Tensor, Measured]:
    """Released RPG-Style Clip: the branch follows sign(A), not sign(A') (A = 0 goes negative):
    A > 0 passes iff w < 1+eps_high; A <= 0 passes iff 1-eps_low <= w < c. Passing tokens:
    L_t = -SG(w A - beta s_t(w_h)) log pi_theta. Clipped tokens carry no gradient and the released
    value L_t = -SG(K) SG(log pi_theta), K = A(1+eps_high) + beta s_t(w_h) (high),
    A(1-eps_low) + beta s_t(w_h) (low), A c - beta s_t(w_h) (dual). Measures D_t (at w) and the clip."""
    cfg = t.config
    with torch.no_grad():
        w, adv, kl = t.w.detach(), t.adv, released_kl_score(t, divergence)
        neg = adv <= 0
        k = torch.mul(w, adv).sub_(kl)  # passing tokens; each branch below overwrites in place
        clipped = torch.zeros_like(w, dtype=torch.bool)
        branches = [
            (~neg & (w >= 1 + cfg.eps_high), 1 + cfg.eps_high, 1.0),
            (neg & (w < 1 - cfg.eps_low), 1 - cfg.eps_low, 1.0),
        ]
        if cfg.clip_c is not None:
            branches.append((neg & (w >= cfg.clip_c), cfg.clip_c, -1.0))
        for cond, bound, kl_sign in branches:  # K = A bound +- beta s_t(w_h); A may be [B, 1]
            torch.where(cond, torch.mul(adv.expand_as(k), bound).add_(kl, alpha=kl_sign) if isinstance(kl, Tensor)
                        else torch.mul(adv, bound).add_(kl_sign * kl), k, out=k)  # fmt: skip
            clipped |= cond
    loss = torch.mul(k.neg_(), torch.where(clipped, t.logp.detach(), t.logp))
    return loss, measured_kl(t, divergence) | Measured(clip=ClipWindow(w, adv, neg))


# ------------------------------------------------------------------ the registry
# Every (divergence, style) pair of the five styles is one registered function calling its style;
# its docstring states the formula it computes, from the style's template and the divergence's
# pieces below (tests/test_core_losses.py checks each docstring's formula against the loss's value).
# The released code's REINFORCE (compute_policy_loss_reinforce, never called) uses
# w_h = clamp(w, 1-eps_low, 1+eps_high); its RPG-Style Clip branches on sign(A).
_DOC_PIECES: dict[str, dict[str, str]] = {
    "fkl": {
        "kl": "beta rho log(pi_ref/pi_theta)",
        "kl_note": "paper: -w A - beta rho log pi_theta",
        "coef": "w A + beta rho",
        "a_prime": "A + beta rho / w",
        "coef_released": "w_h A + beta rho",
        "coef_clip_released": "w A + beta rho",
    },
    "rkl": {
        "kl": "beta w log(pi_theta/pi_ref)",
        "kl_note": "rho = 1: w (-A + beta log w)",
        "coef": "w (A - beta log(pi_theta/pi_ref) - beta)",
        "a_prime": "A - beta (log(pi_theta/pi_ref) + 1)",
        "coef_released": "w_h (A - beta log(w_h/rho) - beta)",
        "coef_clip_released": "w A - beta w_h (log(w_h/rho) + 1)",
    },
    "ufkl": {
        "kl": "beta (w - rho - rho log(pi_theta/pi_ref))",
        "kl_note": "rho = 1: beta k3 of w",
        "coef": "w A - beta (w - rho)",
        "a_prime": "A - beta (1 - rho / w)",
        "coef_released": "w_h A - beta (w_h - rho)",
        "coef_clip_released": "w A - beta (w_h - rho)",
    },
    "urkl": {
        "kl": "beta (w log(pi_theta/pi_ref) - w + rho)",
        "kl_note": "rho = 1: w log w - w + 1",
        "coef": "w (A - beta log(pi_theta/pi_ref))",
        "a_prime": "A - beta log(pi_theta/pi_ref)",
        "coef_released": "w_h (A - beta log(w_h/rho))",
        "coef_clip_released": "w A - beta w_h log(w_h/rho)",
    },
}
#: style -> (the function computing it, its docstring template over _DOC_PIECES)
_STYLE_TEMPLATES: dict[str, tuple[Callable[[PolicyTerms, str], LossOutput], str]] = {
    "differentiable": (differentiable, "L = PPO(w, A) + {kl}   ({kl_note})."),
    "reinforce": (reinforce, "L = -SG({coef}) log pi_theta."),
    "reinforce_clip": (reinforce_clip, "L = dual-clip PPO(w, A'),  A' = {a_prime}."),
    "reinforce_released": (reinforce_released, "L = -SG({coef_released}) log pi_theta."),
    "reinforce_clip_released": (
        reinforce_clip_released,
        "L = -SG({coef_clip_released}) log pi_theta where the sign(A) clip passes, else no gradient.",
    ),
}


def _style_loss(style: str, divergence: str) -> LossFn:
    """The registered loss of (divergence, style): style_fn(t, divergence), named `{divergence}_{style}`,
    its docstring the style's formula for this divergence."""
    style_fn, template = _STYLE_TEMPLATES[style]

    def loss(t: PolicyTerms) -> LossOutput:
        return style_fn(t, divergence)

    loss.__name__ = loss.__qualname__ = f"{divergence}_{style}"
    loss.__doc__ = template.format(**_DOC_PIECES[divergence])
    return loss


for _style in _STYLE_TEMPLATES:
    for _divergence in _DOC_PIECES:
        register_loss(_divergence, _style)(_style_loss(_style, _divergence))
del _style, _divergence


@register_loss("grpo_kl", "differentiable")
def grpo_kl(t: PolicyTerms) -> LossOutput:
    """GRPO: L = PPO(w, A) + beta k3(pi_ref/pi_theta),  k3(y) = y - 1 - log y, no importance weight.
    Gradient beta (1 - pi_ref/pi_theta) grad logp: the FKL gradient on-policy only."""
    with torch.no_grad():
        # y = pi_ref/pi_theta: k3 = expm1(log y) - log y and d k3/dlog pi_theta = -expm1(log y) = 1 - y,
        # written into the two fresh tensors; the KL part first (peak memory)
        log_rp = t.log_rp
        em1 = torch.expm1(log_rp)
        k3, score = clamp_kl_value(t, torch.sub(em1, log_rp, out=log_rp), em1.neg_())
    return reward_plus_kl(t, k3, score)


@register_loss("grpo_kl_corrected", "differentiable")
def grpo_kl_corrected(t: PolicyTerms) -> LossOutput:
    """Corrected GRPO: L = PPO(w, A) + beta w k3(pi_ref/pi_theta), gradient through w.
    Gradient beta w log(pi_theta/pi_ref) grad logp: exactly the URKL gradient."""
    # w k3(rho / w) = w log(w / rho) - w + rho is the URKL value term for term (the tests check the
    # literal w k3 value and gradient): computed as URKL's value and score.
    return differentiable(t, "urkl")


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
    log_rho = None if ref_logp is None else clamped_log_ratio(ref_logp, old_logp, config.log_ratio_clamp)
    rho = 1.0 if log_rho is None else log_rho.exp()
    return PolicyTerms(name, logp, log_w, log_w.exp(), log_rho, rho, adv, mask, config)


def _lookup(name: str, style: str) -> LossFn:
    if (name, style) in LOSSES:
        return LOSSES[(name, style)]
    names = sorted({n for n, _ in LOSSES})
    if name not in names:
        raise ValueError(f"name: unknown loss {name!r}, expected one of {names}")
    styles = sorted(s for n, s in LOSSES if n == name)
    raise ValueError(f"style: {style!r} is not available for loss {name!r}, expected one of {styles}")


def _loss_and_terms(
    name: str,
    style: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    action_mask: Tensor | None,
    ref_logp: Tensor | None,
    config: LossConfig,
    rollout_logp: Tensor | None,
) -> tuple[Tensor, PolicyTerms, Measured, dict[str, Tensor]]:
    """(per-token loss, its terms, what the loss measured, the rollout correction's 0-d metrics)."""
    fn = _lookup(name, style)
    if config.kl_value_clamp is not None and style != "differentiable":
        raise ValueError(
            f"kl_value_clamp: clamps the KL value term of the differentiable style (the released code's "
            f"KL loss); style {style!r} has no such term"
        )
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
    "clamp_kl_value",
    "compute_loss",
    "differentiable",
    "hard_clipped_weight",
    "kl_inputs",
    "kl_value",
    "kl_value_and_score",
    "measured_kl",
    "ppo_value_and_grad",
    "reward_value_and_grad",
    "with_gradient",
    "ppo_surrogate",
    "regularized_advantage",
    "reinforce",
    "reinforce_clip",
    "reinforce_clip_released",
    "reinforce_coef",
    "reinforce_released",
    "released_kl_score",
    "reward_term",
    "token_losses",
]
