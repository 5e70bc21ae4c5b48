"""The loss's ``--rpg.*`` settings, each declared once (flag, type, default, help, rule): LossConfig
takes its defaults and checks from here, the plug-in its flags (and names the flag the user typed in
the core's errors). Pure Python, no torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .aggregation import AGGREGATION_SCOPES

WEIGHT_LEVELS = ("token", "sequence")
REWARD_TERMS = ("clipped", "plain")
KL_RHO = ("on", "off")
#: Dual-clip bound of RPG-Style Clip when ``--rpg.clip_c`` is not given (the paper's code).
DEFAULT_CLIP_C_REINFORCE_CLIP = 10.0


@dataclass(frozen=True)
class Setting:
    """One ``--rpg.*`` setting: flag name (argparse's dest), type, default, help, choices, the LossConfig
    field (None: the plug-in's only), flag value -> field value where they differ (``clipped`` -> True),
    and the rule one value obeys (None when it holds, else "must be ...")."""

    name: str
    type: type
    default: Any
    help: str
    choices: Iterable[str] | None = None
    field: str | None = None
    values: Mapping[str, Any] | None = None
    check: Callable[[Any], str | None] | None = None

    def config_value(self, value: Any) -> Any:
        return self.values[value] if self.values is not None else value

    @property
    def config_default(self) -> Any:
        return self.config_value(self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (a LossConfig value of ``field``), or None."""
        if self.values is not None:
            return None if value in self.values.values() else f"unknown {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"unknown {value!r}, expected one of {tuple(self.choices)}"
        return None if self.check is None else self.check(value)


def _finite_at_least(low: float, strict: bool, what: str = "") -> Callable[[Any], str | None]:
    """The check "a finite number > low" (strict) or ">= low"; None passes (the setting is off)."""
    bound = f"{'>' if strict else '>='} {low:g}"

    def check(x: Any) -> str | None:
        if x is None or (math.isfinite(x) and (x > low if strict else x >= low)):
            return None
        return f"must be a finite number {bound}{what}, got {x}"

    return check


BETA = Setting("rpg.beta", float, default=1e-4, help="KL coefficient beta", field="beta",
               check=lambda x: f"must be a number, got {x}" if x is None else _finite_at_least(0.0, False)(x))  # fmt: skip
CLIP_C = Setting("rpg.clip_c", float, default=None, field="clip_c", check=_finite_at_least(1.0, strict=True, what=" (dual-clip bound c)"),
                 help="dual-clip bound c > 1 (eps comes from --actor.eps_clip_low_high); "
                 f"default: {DEFAULT_CLIP_C_REINFORCE_CLIP:g} with --rpg.style reinforce_clip, off otherwise")  # fmt: skip
WEIGHT_LEVEL = Setting("rpg.weight_level", str, default="token", choices=WEIGHT_LEVELS, field="weight_level",
                       help="importance weight per token (the paper's code) or per sequence (the paper's theory)")  # fmt: skip
REWARD_TERM = Setting("rpg.reward_term", str, default="clipped", choices=REWARD_TERMS, field="clip_reward",
                      values={"clipped": True, "plain": False},
                      help="differentiable style: clipped PPO reward term (the paper's code) or plain -w*A")  # fmt: skip
# the released code's departures from the paper (docs/losses.md, "The released code")
KL_VALUE_CLAMP = Setting("rpg.kl_value_clamp", float, default=None, field="kl_value_clamp", check=_finite_at_least(0.0, strict=True),
                         help="differentiable style: clamp the per-token KL value to [-K, K] where the released code does "
                         "(rkl, ufkl, urkl, GRPO's k3; K = 10 there; its gradient is 0 beyond). Default: off (the paper). RPG's own "
                         "losses only: refused with a framework's KL option")  # fmt: skip
KL_RHO_SETTING = Setting("rpg.kl_rho", str, default="on", choices=KL_RHO, field="kl_rho", values={"on": True, "off": False},
                         help="off: the KL part without the rho = pi_ref/pi_old weight, as the released code (matters only "
                         "with a reference model, --rpg.ref_update != rollout). Default on (the paper). off is refused with a "
                         "framework's KL option (it has no rho)")  # fmt: skip
AGGREGATION_SCOPE = Setting("rpg.aggregation_scope", str, default="step", choices=AGGREGATION_SCOPES, field="aggregation_scope",
                            help="step: one mean over the optimizer step (OpenRLHF, the paper); micro_batch: a mean per "
                            "micro-batch, micro-batches averaged (weighted by their sequences), as the released code")  # fmt: skip

#: every loss setting an ``--rpg.*`` flag sets (OpenRLHF's flags set the clip window, aggregation, correction)
LOSS_SETTINGS: tuple[Setting, ...] = (BETA, CLIP_C, WEIGHT_LEVEL, REWARD_TERM, KL_VALUE_CLAMP, KL_RHO_SETTING,
                                      AGGREGATION_SCOPE)  # fmt: skip
#: LossConfig field -> its setting
BY_FIELD: dict[str, Setting] = {s.field: s for s in LOSS_SETTINGS if s.field is not None}


class SettingError(ValueError):
    """A LossConfig value (or combination) that breaks a rule: ``"field: what is wrong"``; ``fields``:
    every field the rule involves, ``field`` first (the caller names the flags typed for them)."""

    def __init__(self, field: str, message: str, also: tuple[str, ...] = ()) -> None:
        super().__init__(f"{field}: {message}")
        self.fields = (field, *also)
        self.message = message


def check_fields(config: Any) -> None:
    """SettingError for the first declared field of ``config`` whose value breaks its rule."""
    for field, setting in BY_FIELD.items():
        if (problem := setting.problem(getattr(config, field))) is not None:
            raise SettingError(field, problem)
