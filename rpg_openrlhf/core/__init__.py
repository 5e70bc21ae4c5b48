"""RPG core: pure PyTorch (no openrlhf/ray/vllm). See docs/contracts.md and docs/losses.md."""

from .advantages import BASELINES, broadcast_to_tokens, group_advantages
from .aggregation import AGGREGATION_SCOPES, AGGREGATIONS, aggregate
from .correction import (
    CORRECTION_GATINGS,
    CORRECTION_LEVELS,
    CORRECTION_METRICS,
    CORRECTION_MODES,
    RolloutCorrection,
    rollout_weight,
)
from .kl import DIVERGENCES, k1, k2, k3, kl_components
from .losses import CLIP_METRICS, LOSS_NAMES, METRIC_NAMES, STYLES, check_loss, compute_loss, token_losses
from .reference import REFERENCE_MODES, ReferenceSchedule
from .settings import LOSS_SETTINGS, Setting, SettingError
from .terms import (
    LOSSES,
    ClipWindow,
    LossConfig,
    Measured,
    PolicyTerms,
    register_loss,
    registered_names,
    registered_styles,
)

from .kl_options import KL_OPTION_HELP, KL_OPTION_NAMES  # isort: skip  # noqa: E402

__all__ = [
    "AGGREGATION_SCOPES", "AGGREGATIONS", "BASELINES", "CLIP_METRICS", "CORRECTION_GATINGS",
    "CORRECTION_LEVELS", "CORRECTION_METRICS", "CORRECTION_MODES", "DIVERGENCES", "KL_OPTION_HELP",
    "KL_OPTION_NAMES", "LOSSES", "LOSS_NAMES", "LOSS_SETTINGS", "METRIC_NAMES", "REFERENCE_MODES",
    "STYLES", "ClipWindow", "LossConfig", "Measured", "PolicyTerms", "ReferenceSchedule",
    "RolloutCorrection", "Setting", "SettingError", "aggregate", "broadcast_to_tokens", "check_loss",
    "compute_loss", "group_advantages", "k1", "k2", "k3", "kl_components", "register_loss",
    "registered_names", "registered_styles", "rollout_weight", "token_losses",
]  # fmt: skip
