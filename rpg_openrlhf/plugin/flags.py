"""The ``--rpg.*`` flags: every setting declared once (:data:`SETTINGS`), the parser built from the
declarations (:func:`add_rpg_arguments`), and what they resolve to (:func:`resolved_config`, what
``--dry-run`` prints). Validation is :mod:`.validation`'s, turning RPG on :mod:`.enable`'s: this
module imports nothing of the plug-in. Functions accept the flat namespace argparse returns or the
nested one ``openrlhf.utils.config.hierarchize`` builds.

RPG is on when ``--rpg.loss`` is given: OpenRLHF's KL machinery is then off (the KL enters the loss
once, coefficient ``--rpg.beta``), the advantage estimator is ``rpg``, and a reference model starts
only when ``--rpg.ref_update`` needs one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

from rpg_openrlhf import core
from rpg_openrlhf.common.args import RPG_LOSS, get, has, rpg_enabled, set_value  # noqa: F401 - the plug-in reads args here
from rpg_openrlhf.core import AGGREGATION_SCOPES, BASELINES, REFERENCE_MODES, Setting  # noqa: F401
from rpg_openrlhf.core import settings as loss_settings
from rpg_openrlhf.core.settings import (  # noqa: F401 - the plug-in's names for them
    CLIP_C,
    DEFAULT_CLIP_C_REINFORCE_CLIP,
    KL_RHO,
    REWARD_TERMS,
    WEIGHT_LEVELS,
)

OPTIMIZERS = ("adamw", "schedulefree")
#: Where pi_old comes from: the actor's forward after generation (OpenRLHF's) or the rollout engine's
#: per-token log-probs of the sampling distribution (verl's "bypass"; no actor forward).
OLD_LOGPS = ("actor", "engine")
ESTIMATOR = "rpg"
CLIP_STYLES = ("reinforce_clip", "reinforce_clip_released")
#: OpenRLHF starts its reference actor group only when ``algo.kl.init_coef > 0``. When an RPG
#: run needs a reference model, :func:`rpg_openrlhf.plugin.enable.enable` sets the coefficient to this value so that
#: ``train()`` starts the group; the RPG trainer then sets the KL controller to 0 and keeps the
#: reference log-probs out of the reward, so the value is inert (the KL is ``--rpg.beta``).
REFERENCE_SWITCH_COEF = 1.0


class RegisteredChoices:
    """The choices of --rpg.loss / --rpg.style: what the core's registry holds when argparse asks
    (membership, the 'invalid choice' list, --help), so a loss registered by a --rpg.loss_module
    module is a choice like a built-in one."""

    def __init__(self, read: Callable[[], tuple[str, ...]]) -> None:
        self._read = read

    def __contains__(self, value: object) -> bool:
        return value in self._read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())


def registered(read: Callable[[], tuple[str, ...]], flag: str) -> Callable[[str], str]:
    """argparse type of --rpg.loss / --rpg.style: a registered name, else one line with the closest
    names (``URKL`` -> urkl, ``verl_lowvar_kl`` -> verl_low_var_kl), all of them only when none is close."""
    import difflib

    def check(text: str) -> str:
        names = read()
        if text in names:
            return text
        close = difflib.get_close_matches(text, names, n=3, cutoff=0.6)
        close += [
            n for n in difflib.get_close_matches(text.lower(), names, n=3, cutoff=0.6) if n not in close
        ]
        hint = f"closest: {', '.join(close[:3])}" if close else f"choose one of {', '.join(names)}"
        raise argparse.ArgumentTypeError(f"{text!r} is not registered ({hint})")

    check.__name__ = flag
    return check


# ----------------------------------------------------------------------------- the declarations
LOSS = Setting(
    RPG_LOSS,
    registered(core.registered_names, RPG_LOSS),
    default=None,
    choices=RegisteredChoices(core.registered_names),
    help="RPG loss; turns RPG on (the KL enters the loss once, coefficient --rpg.beta). grpo_kl / "
    "grpo_kl_corrected: GRPO's k3 KL term without / with the importance weight. Every framework's KL "
    "option (docs/kl-options.md, style differentiable): "
    + "; ".join(f"{n}: {h}" for n, h in core.KL_OPTION_HELP.items())
    + ".",
)
STYLE = Setting(
    "rpg.style",
    registered(core.registered_styles, "rpg.style"),
    default="differentiable",
    choices=RegisteredChoices(core.registered_styles),
    help="differentiable surrogate, REINFORCE-style (stop-gradient coefficient), or reinforce_clip "
    "(RPG-Style Clip: dual-clip PPO on the regularized advantage)",
)
LOSS_MODULE = Setting(
    "rpg.loss_module",
    str,
    default=None,
    help="importable Python module(s), comma-separated, whose rpg_openrlhf.core.register_loss calls add "
    "losses/styles: imported before the flags are parsed (their (name, style) become --rpg.loss / "
    "--rpg.style choices) and in every worker (on PYTHONPATH, which Ray's workers inherit)",
)
ADVANTAGE = Setting(
    "rpg.advantage",
    str,
    default="mean",
    choices=BASELINES,
    help="group baseline of the 'rpg' advantage estimator: mean (the paper), mean_std (GRPO), loo "
    "(leave-one-out), none",
)
REF_UPDATE = Setting(
    "rpg.ref_update",
    str,
    default="rollout",
    choices=REFERENCE_MODES,
    help="reference policy: rollout (pi_ref = pi_old, no reference model; the paper's code), initial "
    "(fixed initial model), every_k (copy the actor into the reference every --rpg.ref_update_k steps), "
    "kl_threshold (when the running KL exceeds --rpg.ref_kl_threshold)",
)
REF_UPDATE_K = Setting(
    "rpg.ref_update_k", int, default=None, help="K for --rpg.ref_update every_k (global steps)"
)
REF_KL_THRESHOLD = Setting(
    "rpg.ref_kl_threshold", float, default=None, help="kappa for --rpg.ref_update kl_threshold"
)
OPTIMIZER = Setting(
    "rpg.optimizer",
    str,
    default="adamw",
    choices=OPTIMIZERS,
    help="adamw (OpenRLHF's DeepSpeed AdamW) or schedulefree (Schedule-Free AdamW; needs "
    "--actor.lr_scheduler constant; warm-up from --actor.lr_warmup_ratio)",
)
OLD_LOGP = Setting(
    "rpg.old_logp",
    str,
    default="actor",
    choices=OLD_LOGPS,
    help="pi_old: actor (the actor's forward after generation, OpenRLHF's) or engine (the rollout "
    "engine's per-token log-probs of the sampling distribution, temperature included; no actor forward; "
    "the clip window and, with --rpg.ref_update rollout, the reference are then the engine's policy)",
)
CAPTURE_DIR = Setting(
    "rpg.capture_dir",
    str,
    default=None,
    help="debug: dump every loss input/output and reference refresh here (env RPG_CAPTURE_DIR)",
)
RESUME_CHANGES = Setting(
    "rpg.resume_changes", str, default=None,
    help="with --ckpt.load_enable: settings that may differ from the run's record (comma-separated "
    "names as the refusal prints them, e.g. rpg.old_logp,train.partial_rollout_enable); the record then "
    "takes the new values",
)  # fmt: skip

#: Every ``--rpg.*`` setting of the loss, in the order ``--help`` lists them.
SETTINGS: tuple[Setting, ...] = (
    LOSS,
    STYLE,
    LOSS_MODULE,
    loss_settings.BETA,
    loss_settings.CLIP_C,
    loss_settings.WEIGHT_LEVEL,
    loss_settings.REWARD_TERM,
    ADVANTAGE,
    REF_UPDATE,
    REF_UPDATE_K,
    REF_KL_THRESHOLD,
    OPTIMIZER,
    OLD_LOGP,
    CAPTURE_DIR,
    RESUME_CHANGES,
    loss_settings.KL_VALUE_CLAMP,
    loss_settings.KL_RHO_SETTING,
    loss_settings.AGGREGATION_SCOPE,
)
#: flag name -> default (``None`` = unset).
RPG_DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}

#: OpenRLHF's is_correction flags, under the core's RolloutCorrection fields.
THRESHOLD = "algo.advantage.is_correction_threshold"
CORRECTION_FLAGS = {
    "level": "algo.advantage.is_correction_level",
    "mode": "algo.advantage.is_correction_mode",
    "gating": "algo.advantage.is_correction_gating",
    "low": THRESHOLD,
    "high": THRESHOLD,
}
#: A core field (LossConfig, RolloutCorrection, compute_loss's arguments) -> the flag that sets it.
FIELD_FLAGS: dict[str, str] = {
    **{s.field: s.name for s in core.LOSS_SETTINGS if s.field is not None},
    "eps_low": "actor.eps_clip_low_high",
    "eps_high": "actor.eps_clip_low_high",
    "aggregation": "actor.loss_agg_mode",
    "rollout_correction": CORRECTION_FLAGS["level"],
    **CORRECTION_FLAGS,
    "name": LOSS.name,
    "style": STYLE.name,
}


# ----------------------------------------------------------------------------- resolution
#: RPG is on when ``--rpg.loss`` is given.
enabled = rpg_enabled


def value(args: Any, setting: Setting) -> Any:
    """The setting's value in ``args``; its declared default where ``args`` does not hold it."""
    v = get(args, setting.name, setting.default)
    return float(v) if setting.type is float and isinstance(v, int | float) else v


def eps(args: Any) -> tuple[float, float]:
    """The clip window (low, high) of OpenRLHF's ``--actor.eps_clip_low_high`` (or ``--actor.eps_clip``)."""
    low_high = get(args, "actor.eps_clip_low_high")
    if low_high is None:
        e = get(args, "actor.eps_clip", 0.2)
        return float(e), float(e)
    return float(low_high[0]), float(low_high[1])


def needs_reference_model(args: Any) -> bool:
    """Whether the RPG run needs a reference model actor group."""
    return enabled(args) and value(args, REF_UPDATE) != "rollout"


def clip_c(args: Any) -> float | None:
    """``--rpg.clip_c``; unset, the paper's code's bound with the clip styles, else off."""
    c = value(args, loss_settings.CLIP_C)
    if c is None and value(args, STYLE) in CLIP_STYLES:
        return DEFAULT_CLIP_C_REINFORCE_CLIP
    return c


def aggregation(args: Any) -> str:
    return get(args, "actor.loss_agg_mode", "token-mean") or "token-mean"


def engine_old_logp(args: Any) -> bool:
    """pi_old is the rollout engine's policy (``--rpg.old_logp engine``): no actor forward in make_experience."""
    return enabled(args) and value(args, OLD_LOGP) == "engine"


def correction_threshold(args: Any) -> tuple[float, float]:
    """``--algo.advantage.is_correction_threshold`` as (low, high); one value is HIGH (OpenRLHF: low 0)."""
    threshold = [float(x) for x in (get(args, THRESHOLD) or (0.5, 5.0))]
    if len(threshold) == 1:
        threshold.insert(0, 0.0)
    if len(threshold) != 2:
        raise ValueError(f"--{THRESHOLD} takes HIGH or LOW HIGH, got {threshold}")
    return threshold[0], threshold[1]


def rollout_correction(args: Any) -> core.RolloutCorrection:
    """OpenRLHF's ``--algo.advantage.is_correction_{level,mode,gating,threshold}`` as the core's
    correction (the same names: level ``seq`` is the core's ``seq``; ValueError naming the field)."""
    low, high = correction_threshold(args)
    defaults = core.RolloutCorrection()
    named = {f: get(args, CORRECTION_FLAGS[f]) or getattr(defaults, f) for f in ("level", "mode", "gating")}
    return core.RolloutCorrection(**named, low=low, high=high)


def engine_logprobs_needed(args: Any) -> bool:
    """The engines must return the sampled tokens' log-probs although OpenRLHF's correction is off
    (OpenRLHF asks for them only with ``--algo.advantage.is_correction_level`` token/seq)."""
    return engine_old_logp(args) and (get(args, CORRECTION_FLAGS["level"]) or "off") == "off"


def import_loss_modules(modules: str | None) -> None:
    """Import each module named by ``--rpg.loss_module`` (comma-separated): its ``register_loss``
    calls put its losses in the core's registry. ValueError naming the flag when one cannot be imported."""
    for name in filter(None, (m.strip() for m in (modules or "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"--{LOSS_MODULE.name} {name!r}: cannot import it ({exc})") from exc


def loss_config(args: Any) -> core.LossConfig:
    """The ``rpg_openrlhf.core.LossConfig`` these flags describe (a worker builds it too: the
    ``--rpg.loss_module`` modules are imported here, so their losses are registered there).
    A :class:`rpg_openrlhf.core.SettingError` names the field a value breaks the rule of."""
    import_loss_modules(value(args, LOSS_MODULE))
    eps_low, eps_high = eps(args)
    declared = {s.field: s.config_value(value(args, s)) for s in core.LOSS_SETTINGS if s.field is not None}
    return core.LossConfig(
        **{**declared, "clip_c": clip_c(args)},
        eps_low=eps_low,
        eps_high=eps_high,
        aggregation=aggregation(args),
        rollout_correction=rollout_correction(args),
    )


# ----------------------------------------------------------------------------- parser
#: OpenRLHF's flags whose *typed* value RPG refuses (the default is no choice of the user's).
KL_COEF_FLAG = "algo.kl.init_coef"
ESTIMATOR_FLAG = "algo.advantage.estimator"


def add_rpg_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the dotted ``--rpg.*`` flags to ``parser`` (OpenRLHF's train_ppo_ray parser), one per
    declared setting; its parsing then reads ``--rpg.loss_module`` first and checks what the user
    typed for OpenRLHF's KL coefficient and estimator (:func:`_parse_rpg_first`)."""
    g = parser.add_argument_group("RPG (Regularized Policy Gradient, arXiv 2505.17508)")
    for s in SETTINGS:
        choices = list(s.choices) if isinstance(s.choices, tuple) else s.choices
        g.add_argument(f"--{s.name}", type=s.type, default=s.default, choices=choices, help=s.help)
    _parse_rpg_first(parser)
    return parser


class _PreParseError(Exception):
    """The pre-parse could not read a flag: the real parse reports it."""


def _pre_parser() -> argparse.ArgumentParser:
    """Reads the flags the real parse needs first; unset is None (told apart from OpenRLHF's default)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in (LOSS_MODULE.name, KL_COEF_FLAG, ESTIMATOR_FLAG):
        pre.add_argument(f"--{flag}", dest=flag, default=None)

    def error(message: str) -> None:
        raise _PreParseError(message)

    pre.error = error  # type: ignore[method-assign]
    return pre


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``--flag VALUE`` / ``--flag=VALUE``."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == f"--{flag}":
            skip = True
        elif not token.startswith(f"--{flag}="):
            out.append(token)
    return out


def _parse_rpg_first(parser: argparse.ArgumentParser) -> None:
    """Wrap this parser's parse_known_args (which parse_args calls):

    1. the --rpg.loss_module modules are imported first, wherever the flag stands: the registry
       decides the --rpg.loss / --rpg.style choices while argparse reads them;
    2. ``--algo.advantage.estimator rpg`` is taken out before OpenRLHF's parser (its choices do not
       list ``rpg``) and set afterwards;
    3. what the user typed for ``--algo.kl.init_coef`` / ``--algo.advantage.estimator`` is checked
       against ``--rpg.loss`` (:func:`check_typed_openrlhf`): only
       here are typed values told apart from OpenRLHF's defaults."""
    parse_known_args = parser.parse_known_args
    pre = _pre_parser()

    def parse_rpg_first(args: Any = None, namespace: Any = None) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            typed = vars(pre.parse_known_args(argv)[0])
        except _PreParseError:
            typed = {}
        try:
            import_loss_modules(typed.get(LOSS_MODULE.name))
        except ValueError as exc:
            parser.error(str(exc))
        rpg_estimator = typed.get(ESTIMATOR_FLAG) == ESTIMATOR
        ns, extras = parse_known_args(_without(argv, ESTIMATOR_FLAG) if rpg_estimator else args, namespace)
        if rpg_estimator:
            setattr(ns, ESTIMATOR_FLAG, ESTIMATOR)
        try:
            check_typed_openrlhf(ns, typed.get(KL_COEF_FLAG), typed.get(ESTIMATOR_FLAG))
        except ValueError as exc:
            parser.error(str(exc))
        return ns, extras

    parser.parse_known_args = parse_rpg_first  # type: ignore[method-assign]


def check_typed_openrlhf(args: Any, coef: str | None, estimator: str | None) -> None:
    """What the user *typed* (None: not typed, OpenRLHF's default holds) for OpenRLHF's KL
    coefficient and advantage estimator, with --rpg.loss: OpenRLHF's defaults (0.01, gae) are no
    choice of the user's and RPG replaces them (plugin/enable.py); a typed one conflicts. Only the
    parse can tell them apart, so the rule is here."""
    if not enabled(args):
        return
    if coef is not None and float(coef) > 0:
        raise ValueError(
            f"--rpg.loss with --{KL_COEF_FLAG} {float(coef)} > 0 would add OpenRLHF's KL reward penalty on "
            f"top of the RPG KL; set the KL coefficient with --rpg.beta and drop --{KL_COEF_FLAG} (or set it to 0)"
        )
    if estimator not in (None, ESTIMATOR):
        raise ValueError(
            "--rpg.loss uses the 'rpg' advantage estimator (baseline --rpg.advantage); "
            f"--{ESTIMATOR_FLAG} {estimator} conflicts: drop it or pass 'rpg'"
        )


def resolved_config(args: Any) -> dict[str, Any]:
    """What an RPG run will do, as a JSON-serializable dict (``rpg-train --dry-run``)."""
    if not enabled(args):
        return {"enabled": False}
    ref_update = get(args, "rpg.ref_update")
    return {
        "enabled": True,
        "loss": get(args, LOSS.name),
        "style": get(args, STYLE.name),
        "loss_config": asdict(loss_config(args)),
        "advantage_estimator": ESTIMATOR,
        "advantage": get(args, "rpg.advantage"),
        "n_samples_per_prompt": get(args, "rollout.n_samples_per_prompt"),
        "ref_update": ref_update,
        "ref_update_k": get(args, "rpg.ref_update_k"),
        "ref_kl_threshold": get(args, "rpg.ref_kl_threshold"),
        "reference_model": needs_reference_model(args),
        "reference_is_rollout_policy": ref_update == "rollout",
        "optimizer": get(args, "rpg.optimizer"),
        "old_logp": get(args, "rpg.old_logp"),
        "engine_logprobs_requested": engine_old_logp(args) or loss_config(args).rollout_correction.enabled,
        "async": bool(get(args, "train.async_enable")),
        "openrlhf_kl": "off (use_loss off, reward penalty 0; the KL is inside the RPG loss)",
        "entropy_logged": True,
        "capture_dir": get(args, "rpg.capture_dir"),
    }
