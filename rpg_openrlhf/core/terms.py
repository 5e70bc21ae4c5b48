"""What a registered loss sees (PolicyTerms) and returns (a per-token loss and a Measured), the loss
options (LossConfig) and the registry (LOSSES, register_loss: the --rpg.loss / --rpg.style choices)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from .aggregation import AGGREGATIONS
from .correction import RolloutCorrection
from .settings import BY_FIELD, SettingError, check_fields


def _default(field: str) -> Any:
    return BY_FIELD[field].config_default  # the declaration's (settings.py)


@dataclass(frozen=True)
class LossConfig:
    """The loss options; the fields an ``--rpg.*`` flag sets take their default and rule from settings.py."""

    beta: float = _default("beta")  # KL coefficient
    eps_low: float = 0.2
    eps_high: float = 0.28
    clip_c: float | None = _default("clip_c")  # dual-clip bound c (> 1) or None (off)
    clip_reward: bool = _default("clip_reward")  # differentiable style: clipped PPO reward term, else -w*A
    weight_level: str = _default("weight_level")  # "token" (paper's code) | "sequence" (paper's theory)
    aggregation: str = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum"
    log_ratio_clamp: float = 20.0  # |log w| clamp, as OpenRLHF's PolicyLoss
    # the released code's behaviour, off by default (docs/losses.md):
    kl_value_clamp: float | None = _default("kl_value_clamp")  # differentiable: clamp D_t to [-K, K]
    kl_rho: bool = _default("kl_rho")  # False: KL part without the rho = pi_ref/pi_old weight
    aggregation_scope: str = _default("aggregation_scope")  # "step" | "micro_batch"
    # samples from the rollout engine's mu, not pi_old: OpenRLHF's is_correction (correction.py)
    rollout_correction: RolloutCorrection = RolloutCorrection()

    def __post_init__(self) -> None:
        if isinstance(self.rollout_correction, Mapping):  # LossConfig(**dataclasses.asdict(cfg))
            object.__setattr__(self, "rollout_correction", RolloutCorrection(**self.rollout_correction))
        check_fields(self)  # every declared field's own rule (settings.py)
        for field in ("eps_low", "eps_high"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: clip epsilon must be > 0, got {getattr(self, field)}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation: unknown {self.aggregation!r}, expected one of {AGGREGATIONS}")
        if not self.log_ratio_clamp > 0:
            raise ValueError(f"log_ratio_clamp: must be > 0, got {self.log_ratio_clamp}")
        if not isinstance(self.rollout_correction, RolloutCorrection):
            raise ValueError(f"rollout_correction: expected a RolloutCorrection, got "
                             f"{type(self.rollout_correction).__name__}")  # fmt: skip
        if self.rollout_correction.level == "token" and self.weight_level == "sequence":
            raise SettingError("rollout_correction", "token-level correction needs token-level weights: weight_level "
                               "'sequence' has one loss per sequence; use level 'seq' (exact) or weight_level 'token'",
                               also=("weight_level",))  # fmt: skip


@dataclass(eq=False)
class PolicyTerms:
    """What a registered loss sees, per token (or per sequence); read only."""

    name: str
    logp: Tensor  # log pi_theta (carries gradient)
    log_w: Tensor  # clamped log(pi_theta / pi_old) (carries gradient)
    w: Tensor  # exp(log_w)
    log_rho: Tensor | None  # clamped log(pi_ref / pi_old); None: pi_ref = pi_old, or a framework option
    rho: Tensor | float  # exp(log_rho), 1.0 when pi_ref = pi_old
    adv: Tensor  # advantage A (no gradient), [B, T] or [B, 1]
    mask: Tensor
    config: LossConfig
    # the log-probs as given (no clamp, no gradient): a framework option forms its own log-ratios
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None

    @property  # plain properties: functools.cached_property's RLock breaks Dynamo graphs (3.11)
    def log_pr(self) -> Tensor:  # log(pi_theta / pi_ref) = log_w - log_rho
        return self.log_w if self.log_rho is None else self.log_w - self.log_rho

    @property
    def log_rp(self) -> Tensor:  # log(pi_ref / pi_theta) = log_rho - log_w (GRPO's k3 argument)
        return -self.log_w if self.log_rho is None else self.log_rho - self.log_w


@dataclass(frozen=True, eq=False)
class ClipWindow:
    """A loss's dual-clip PPO window: ratio, advantage, negative branch (A < 0; A <= 0 for the released clip)."""

    ratio: Tensor
    adv: Tensor
    neg: Tensor


@dataclass(eq=False)
class Measured:
    """What a loss measured (as verl's losses return metrics): kl, per-token D_t (no gradient; or a function
    computing it); clip, its ClipWindow (False: no clip, None: not reported); extra, others (per token or 0-d)."""

    kl: Tensor | Callable[[], Tensor] | None = None
    clip: ClipWindow | Literal[False] | None = None
    extra: dict[str, Tensor] = dataclasses.field(default_factory=dict)

    def __or__(self, other: Measured) -> Measured:
        """Two parts' measurements (a field set in both: the right one's)."""
        kl = self.kl if other.kl is None else other.kl
        return Measured(kl, self.clip if other.clip is None else other.clip, {**self.extra, **other.extra})


LossOutput = Tensor | tuple[Tensor, Measured]
LossFn = Callable[[PolicyTerms], LossOutput]
#: (name, style) -> the loss: every built-in (losses.py, kl_options.py) and every user variant
LOSSES: dict[tuple[str, str], LossFn] = {}
#: the names of a framework's own KL option (kl_options.py): no rho, no kl_rho / kl_value_clamp
FRAMEWORK_OPTIONS: set[str] = set()


def register_loss(name: str, style: str, framework: bool = False) -> Callable[[LossFn], LossFn]:
    """Decorator: LOSSES[(name, style)] = fn(terms) -> loss or (loss, Measured); framework: FRAMEWORK_OPTIONS."""

    def decorator(fn: LossFn) -> LossFn:
        if (name, style) in LOSSES:
            raise ValueError(f"name: loss ({name!r}, {style!r}) is already registered")
        LOSSES[(name, style)] = fn
        if framework:
            FRAMEWORK_OPTIONS.add(name)
        return fn

    return decorator


def registered_names() -> tuple[str, ...]:  # in registration order: the --rpg.loss choices
    return tuple(dict.fromkeys(name for name, _ in LOSSES))


def registered_styles() -> tuple[str, ...]:  # in registration order: the --rpg.style choices
    return tuple(dict.fromkeys(style for _, style in LOSSES))
