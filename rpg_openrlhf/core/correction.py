"""Rollout (engine) mismatch correction: samples come from mu = pi_rollout (vLLM), not pi_old, so the
whole per-token (or per-sequence) loss is weighted by a stop-gradient c ~ pi_old / mu (docs/losses.md).
The options are OpenRLHF 0.11.2's `--algo.advantage.is_correction_*` (openrlhf/models/loss.py,
PolicyLoss); at the sequence level the gate is OpenRLHF's statistic but the weight is the exact
sequence ratio pi_old(x) / mu(x), not each token's own ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregation import counts, masked
from .settings import SettingError

CORRECTION_LEVELS = ("off", "token", "seq")
CORRECTION_MODES = ("mask", "clip")
CORRECTION_GATINGS = ("ratio", "binary_kl", "tv")
#: reported when rollout_logp is given (vllm_kl) and when the correction is on (the other two)
CORRECTION_METRICS = ("vllm_kl", "is_filter_ratio", "is_weight_mean")
_PROB_CLAMP = 1e-6  # OpenRLHF's clamp of p and q in the binary_kl / tv statistics


@dataclass(frozen=True)
class RolloutCorrection:
    """OpenRLHF's is_correction options: level off | token | seq; mode mask (drop units whose statistic is
    outside [low, high]) | clip (clamp the token ratio; token level, ratio gating); gating ratio |
    binary_kl | tv (divergences of mu and pi_old: an upper bound only, low = 0)."""

    level: str = "off"
    mode: str = "mask"
    gating: str = "ratio"
    low: float = 0.5
    high: float = 5.0

    def __post_init__(self) -> None:
        for field, choices in (("level", CORRECTION_LEVELS), ("mode", CORRECTION_MODES),
                               ("gating", CORRECTION_GATINGS)):  # fmt: skip
            if getattr(self, field) not in choices:
                raise SettingError(field, f"unknown {getattr(self, field)!r}, expected one of {choices}")
        if not self.low >= 0:
            raise SettingError("low", f"must be >= 0, got {self.low}")
        if not self.high >= self.low:
            raise SettingError("high", f"must be >= low = {self.low}, got {self.high}", also=("low",))
        # OpenRLHF's PolicyLoss rules: only the per-token ratio is a weight that can be clamped ...
        if self.mode == "clip" and (self.level == "seq" or self.gating != "ratio"):
            raise SettingError("mode", f"clip requires level 'token' and gating 'ratio', got level {self.level!r}, "
                               f"gating {self.gating!r}", also=("level",) if self.level == "seq" else ("gating",))  # fmt: skip
        # ... and a divergence is bounded from above only (the default band would reject everything)
        if self.gating != "ratio" and self.level != "off" and self.low > 0:
            raise SettingError("low", f"gating {self.gating!r} takes an upper bound only (low = 0), got {self.low}",
                               also=("gating",))  # fmt: skip

    @property
    def enabled(self) -> bool:
        return self.level != "off"

    @classmethod
    def untruncated(cls, level: str) -> RolloutCorrection:  # filters nothing: ratio band [0, inf]
        return cls(level=level, mode="mask", gating="ratio", low=0.0, high=math.inf)


@torch.no_grad()
def rollout_weight(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, c: RolloutCorrection,
                   log_ratio_clamp: float) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(weight c, filtered units), r_t = log(pi_old/mu) at the sampled token (clamped before exp). token:
    c_t = exp(r_t), [B, T]; seq: c = exp(sum_t m_t r_t) = pi_old(x)/mu(x), [B, 1]: E_mu[c L] = E_old[L].
    Statistic s (OpenRLHF's; p, q = exp(rollout_logp), exp(old_logp) in [1e-6, 1-1e-6]): ratio exp(r_t),
    binary_kl p log(p/q) + (1-p) log((1-p)/(1-q)), tv |p - q| (seq: of their masked mean / masked mean).
    mask: c <- 0 where s is outside [low, high]; clip: c <- clamp(c, low, high)."""
    old_logp = old_logp.detach()
    rollout_logp = rollout_logp.detach().to(old_logp.dtype)
    log_ratio = old_logp - rollout_logp
    stat = log_ratio
    if c.gating != "ratio":
        p = rollout_logp.exp().clamp(_PROB_CLAMP, 1 - _PROB_CLAMP)
        q = old_logp.exp().clamp(_PROB_CLAMP, 1 - _PROB_CLAMP)
        binary_kl = c.gating == "binary_kl"
        stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log() if binary_kl else (p - q).abs()
    if c.level == "seq":  # the masked mean over each sequence (an empty one: 0)
        stat = masked(stat, mask).sum(-1, keepdim=True) / counts(mask, dim=-1).unsqueeze(-1).clamp(min=1)
    stat = stat.exp() if c.gating == "ratio" else stat
    log_c = masked(log_ratio, mask).sum(-1, keepdim=True) if c.level == "seq" else log_ratio
    weight = log_c.clamp(-log_ratio_clamp, log_ratio_clamp).exp()
    filtered = (stat < c.low) | (stat > c.high)
    if c.mode == "clip":
        return weight.clamp(c.low, c.high), filtered
    return weight.masked_fill(filtered, 0.0), filtered


@torch.no_grad()
def correction_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, weight: Tensor | None = None,
                       filtered: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
    """0-d metrics under OpenRLHF's names: vllm_kl = masked token mean of rollout_logp - old_logp (an
    estimate of KL(mu || pi_old)); with (weight, filtered) also is_filter_ratio and is_weight_mean
    (the filtered fraction and the mean weight of the units: masked tokens, or non-empty sequences)."""
    valid = mask if mask.dtype == torch.bool else mask > 0
    diff = rollout_logp.detach().to(old_logp.dtype) - old_logp.detach()
    stats = {"vllm_kl": masked(diff, mask).sum() / counts(mask)}
    if weight is None or filtered is None:
        return stats
    units = valid if weight.shape == valid.shape else valid.any(-1, keepdim=True)
    n = counts(units).to(diff.dtype)
    stats["is_filter_ratio"] = counts(filtered & units).to(diff.dtype) / n
    stats["is_weight_mean"] = torch.where(units, weight, 0.0).sum() / n
    return stats
