"""The ``--rpg.*`` flags of the plug-in: their specs, the parser, and what they resolve to.

Contract with the launcher (docs/contracts.md, "rpg-train entry point"):

* :func:`add_rpg_arguments` adds the dotted ``--rpg.*`` flags to OpenRLHF's own parser;
* :func:`rpg_openrlhf.plugin.validation.validate` raises ``ValueError`` naming the flags for every
  invalid combination, before Ray starts (re-exported here as :func:`validate`);
* :func:`resolved_config` is what ``--dry-run`` prints.

Turning RPG on (the argument changes and the class swaps) is :mod:`rpg_openrlhf.plugin.enable`'s:
this module parses and resolves only, and imports nothing of the plug-in but the validation (a leaf).

All three accept either the flat namespace argparse returns (``getattr(args, "rpg.loss")``)
or the nested one ``openrlhf.utils.config.hierarchize`` builds (``args.rpg.loss``).

RPG on means ``--rpg.loss`` is given. Then OpenRLHF's own KL machinery is off (the KL enters
the loss once, inside the RPG loss, with coefficient ``--rpg.beta``); the advantage estimator
is ``rpg`` (group baseline ``--rpg.advantage`` from ``rpg_openrlhf.core.group_advantages``);
a reference model is started only when ``--rpg.ref_update`` needs one (``rollout``, the
paper's code, uses the rollout policy's log-probs as the reference).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rpg_openrlhf import core
from rpg_openrlhf.common.args import get, has, set_value  # noqa: F401 - the plug-in reads args here
from rpg_openrlhf.core import AGGREGATION_SCOPES, BASELINES, REFERENCE_MODES
from rpg_openrlhf.core.losses import WEIGHT_LEVELS

#: The choice lists of the core, under the flags' names.
ADVANTAGES = BASELINES
REF_UPDATES = REFERENCE_MODES
OPTIMIZERS = ("adamw", "schedulefree")
REWARD_TERMS = ("clipped", "plain")
KL_RHO = ("on", "off")
#: Where pi_old comes from: the actor's forward after generation (OpenRLHF's) or the rollout engine's
#: per-token log-probs of the sampling distribution (verl's "bypass"; no actor forward).
OLD_LOGPS = ("actor", "engine")
ESTIMATOR = "rpg"


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

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())


#: --rpg.loss choices: RPG's losses, every framework's KL option (core/kl_options.py), and any
#: name a --rpg.loss_module registered; --rpg.style choices likewise
LOSS_CHOICES = RegisteredChoices(core.registered_names)
STYLE_CHOICES = RegisteredChoices(core.registered_styles)
#: Dual-clip bound used by RPG-Style Clip when ``--rpg.clip_c`` is not given (the paper's code).
DEFAULT_CLIP_C_REINFORCE_CLIP = 10.0
CLIP_STYLES = ("reinforce_clip", "reinforce_clip_released")
#: OpenRLHF starts its reference actor group only when ``algo.kl.init_coef > 0``. When an RPG
#: run needs a reference model, :func:`rpg_openrlhf.plugin.enable.enable` sets the coefficient to this value so that
#: ``train()`` starts the group; the RPG trainer then sets the KL controller to 0 and keeps the
#: reference log-probs out of the reward, so the value is inert (the KL is ``--rpg.beta``).
REFERENCE_SWITCH_COEF = 1.0


@dataclass(frozen=True)
class FlagSpec:
    """One ``--rpg.*`` flag of :func:`add_rpg_arguments`."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | RegisteredChoices | None = None


#: Every ``--rpg.*`` flag of the loss, with its default (``None`` = unset) and help.
FLAG_SPECS: tuple[FlagSpec, ...] = (
    FlagSpec("rpg.loss", str, None, "RPG loss; turns RPG on (the KL enters the loss once, coefficient "
             "--rpg.beta). grpo_kl / grpo_kl_corrected: GRPO's k3 KL term without / with the importance weight. "
             "Every framework's KL option (docs/kl-options.md, style differentiable): "
             + "; ".join(f"{n}: {h}" for n, h in core.KL_OPTION_HELP.items()) + ".",
             LOSS_CHOICES),
    FlagSpec("rpg.style", str, "differentiable", "differentiable surrogate, REINFORCE-style (stop-gradient "
             "coefficient), or reinforce_clip (RPG-Style Clip: dual-clip PPO on the regularized advantage)",
             STYLE_CHOICES),
    FlagSpec("rpg.loss_module", str, None, "importable Python module(s), comma-separated, whose "
             "rpg_openrlhf.core.register_loss calls add losses/styles: imported before the flags are "
             "parsed (their (name, style) become --rpg.loss / --rpg.style choices) and in every worker "
             "(on PYTHONPATH, which Ray's workers inherit)"),
    FlagSpec("rpg.beta", float, 1e-4, "KL coefficient beta"),
    FlagSpec("rpg.clip_c", float, None, "dual-clip bound c > 1 (eps comes from --actor.eps_clip_low_high); "
             f"default: {DEFAULT_CLIP_C_REINFORCE_CLIP:g} with --rpg.style reinforce_clip, off otherwise"),
    FlagSpec("rpg.weight_level", str, "token", "importance weight per token (the paper's code) or per "
             "sequence (the paper's theory)", WEIGHT_LEVELS),
    FlagSpec("rpg.reward_term", str, "clipped", "differentiable style: clipped PPO reward term (the paper's "
             "code) or plain -w*A", REWARD_TERMS),
    FlagSpec("rpg.advantage", str, "mean", "group baseline of the 'rpg' advantage estimator: mean (the "
             "paper), mean_std (GRPO), loo (leave-one-out), none", ADVANTAGES),
    FlagSpec("rpg.ref_update", str, "rollout", "reference policy: rollout (pi_ref = pi_old, no reference "
             "model; the paper's code), initial (fixed initial model), every_k (copy the actor into the "
             "reference every --rpg.ref_update_k steps), kl_threshold (when the running KL exceeds "
             "--rpg.ref_kl_threshold)", REF_UPDATES),
    FlagSpec("rpg.ref_update_k", int, None, "K for --rpg.ref_update every_k (global steps)"),
    FlagSpec("rpg.ref_kl_threshold", float, None, "kappa for --rpg.ref_update kl_threshold"),
    FlagSpec("rpg.optimizer", str, "adamw", "adamw (OpenRLHF's DeepSpeed AdamW) or schedulefree (Schedule-Free "
             "AdamW; needs --actor.lr_scheduler constant; warm-up from --actor.lr_warmup_ratio)", OPTIMIZERS),
    FlagSpec("rpg.old_logp", str, "actor", "pi_old: actor (the actor's forward after generation, OpenRLHF's) or "
             "engine (the rollout engine's per-token log-probs of the sampling distribution, temperature "
             "included; no actor forward; the clip window and, with --rpg.ref_update rollout, the reference "
             "are then the engine's policy)", OLD_LOGPS),
    FlagSpec("rpg.capture_dir", str, None, "debug: dump every loss input/output and reference refresh here "
             "(env RPG_CAPTURE_DIR)"),
    FlagSpec("rpg.resume_changes", str, None, "with --ckpt.load_enable: settings that may differ from the run's "
             "record (comma-separated names as the refusal prints them, e.g. rpg.old_logp,train.partial_rollout_enable); "
             "the record then takes the new values"),
    # the released code's departures from the paper (docs/losses.md, "The released code")
    FlagSpec("rpg.kl_value_clamp", float, None, "differentiable style: clamp the per-token KL value to [-K, K] "
             "where the released code does (rkl, ufkl, urkl, GRPO's k3; K = 10 there; its gradient is 0 "
             "beyond). Default: off (the paper)"),
    FlagSpec("rpg.kl_rho", str, "on", "off: the KL part without the rho = pi_ref/pi_old weight, as the "
             "released code (matters only with a reference model, --rpg.ref_update != rollout). Default on "
             "(the paper)", KL_RHO),
    FlagSpec("rpg.aggregation_scope", str, "step", "step: one mean over the optimizer step (OpenRLHF, the "
             "paper); micro_batch: a mean per micro-batch, micro-batches averaged (weighted by their "
             "sequences), as the released code", AGGREGATION_SCOPES),
)  # fmt: skip

#: flag name -> default (``None`` = unset). Every ``--rpg.*`` flag is listed here.
RPG_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in FLAG_SPECS}


class DefaultFloat(float):
    """A float default that remembers it was not typed by the user (argparse keeps non-str
    defaults as they are). Behaves exactly as the float it wraps; pickles by value."""

    def __reduce__(self):
        return (float, (float(self),))


class DefaultStr(str):
    """A str default that remembers it was not typed by the user (see :class:`DefaultFloat`)."""

    def __reduce__(self):
        return (str, (str(self),))


def _keep_default_str(value: str) -> str:
    return value if isinstance(value, DefaultStr) else str(value)


# ----------------------------------------------------------------------------- on / off
def enabled(args: Any) -> bool:
    """RPG is on when ``--rpg.loss`` is given."""
    return get(args, "rpg.loss") is not None


# ----------------------------------------------------------------------------- parser
def add_rpg_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the dotted ``--rpg.*`` flags to ``parser`` (OpenRLHF's train_ppo_ray parser).

    Also accepts ``rpg`` as a value of ``--algo.advantage.estimator`` and marks the defaults of
    ``--algo.kl.init_coef`` and ``--algo.advantage.estimator`` so that :func:`validate` can tell a
    typed value from the default.
    Calling it twice on the same parser is a no-op.
    """
    if "--rpg.loss" in parser._option_string_actions:
        return parser
    est = parser._option_string_actions.get("--algo.advantage.estimator")
    if est is not None and est.choices is not None and ESTIMATOR not in est.choices:
        est.choices = [*est.choices, ESTIMATOR]
    coef = parser._option_string_actions.get("--algo.kl.init_coef")
    if coef is not None and isinstance(coef.default, float):
        coef.default = DefaultFloat(coef.default)
    if est is not None and isinstance(est.default, str):  # "gae": typed, it conflicts with --rpg.loss
        est.default = DefaultStr(est.default)
        est.type = _keep_default_str  # argparse passes a str default through `type`

    g = parser.add_argument_group("RPG (Regularized Policy Gradient, arXiv 2505.17508)")
    for spec in FLAG_SPECS:
        g.add_argument(
            f"--{spec.name}",
            type=spec.type,
            default=spec.default,
            choices=list(spec.choices) if isinstance(spec.choices, tuple) else spec.choices,
            help=spec.help,
        )
    _import_loss_modules_before_parsing(parser)
    return parser


def import_loss_modules(modules: str | None) -> None:
    """Import each module named by ``--rpg.loss_module`` (comma-separated): its ``register_loss``
    calls put its losses in the core's registry. ValueError naming the flag when one cannot be imported."""
    for name in filter(None, (m.strip() for m in (modules or "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"--rpg.loss_module {name!r}: cannot import it ({exc})") from exc


def _import_loss_modules_before_parsing(parser: argparse.ArgumentParser) -> None:
    """The registry decides the --rpg.loss / --rpg.style choices while argparse reads them, so the
    --rpg.loss_module modules are imported first, wherever the flag stands on the command line:
    this parser's parse_known_args (which parse_args calls) first reads that one flag."""
    parse_known_args = parser.parse_known_args
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--rpg.loss_module", dest="modules", default=None)

    def importing_first(args: Any = None, namespace: Any = None) -> Any:
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        try:
            import_loss_modules(pre.parse_known_args(argv)[0].modules)
        except ValueError as exc:
            parser.error(str(exc))
        return parse_known_args(args, namespace)

    parser.parse_known_args = importing_first  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- resolution
def _eps(args: Any) -> tuple[float, float]:
    low_high = get(args, "actor.eps_clip_low_high")
    if low_high is None:
        eps = get(args, "actor.eps_clip", 0.2)
        return float(eps), float(eps)
    return float(low_high[0]), float(low_high[1])


def needs_reference_model(args: Any) -> bool:
    """Whether the RPG run needs a reference model actor group."""
    return enabled(args) and get(args, "rpg.ref_update", "rollout") != "rollout"


def clip_c(args: Any) -> float | None:
    c = get(args, "rpg.clip_c")
    if c is None and get(args, "rpg.style") in CLIP_STYLES:
        return DEFAULT_CLIP_C_REINFORCE_CLIP
    return None if c is None else float(c)


def aggregation(args: Any) -> str:
    return get(args, "actor.loss_agg_mode", "token-mean") or "token-mean"


def engine_old_logp(args: Any) -> bool:
    """pi_old is the rollout engine's policy (``--rpg.old_logp engine``): no actor forward in make_experience."""
    return enabled(args) and get(args, "rpg.old_logp", "actor") == "engine"


def correction_threshold(args: Any) -> tuple[float, float]:
    """``--algo.advantage.is_correction_threshold`` as (low, high); one value is HIGH (OpenRLHF: low 0)."""
    threshold = [float(x) for x in (get(args, "algo.advantage.is_correction_threshold") or (0.5, 5.0))]
    if len(threshold) == 1:
        threshold.insert(0, 0.0)
    if len(threshold) != 2:
        raise ValueError(f"--algo.advantage.is_correction_threshold takes HIGH or LOW HIGH, got {threshold}")
    return threshold[0], threshold[1]


def rollout_correction(args: Any) -> core.RolloutCorrection:
    """OpenRLHF's ``--algo.advantage.is_correction_{level,mode,gating,threshold}`` as the core's
    correction (the same names: level ``seq`` is the core's ``seq``; ValueError naming the field)."""
    low, high = correction_threshold(args)
    return core.RolloutCorrection(
        level=get(args, "algo.advantage.is_correction_level", "off") or "off",
        mode=get(args, "algo.advantage.is_correction_mode", "mask") or "mask",
        gating=get(args, "algo.advantage.is_correction_gating", "ratio") or "ratio",
        low=low,
        high=high,
    )


def engine_logprobs_needed(args: Any) -> bool:
    """The engines must return the sampled tokens' log-probs although OpenRLHF's correction is off
    (OpenRLHF asks for them only with ``--algo.advantage.is_correction_level`` token/seq)."""
    return (
        engine_old_logp(args) and (get(args, "algo.advantage.is_correction_level", "off") or "off") == "off"
    )


def loss_config(args: Any):
    """The ``rpg_openrlhf.core.LossConfig`` these flags describe (a worker builds it too: the
    ``--rpg.loss_module`` modules are imported here, so their losses are registered there)."""
    import_loss_modules(get(args, "rpg.loss_module"))
    eps_low, eps_high = _eps(args)
    return core.LossConfig(
        beta=float(get(args, "rpg.beta", RPG_DEFAULTS["rpg.beta"])),
        eps_low=eps_low,
        eps_high=eps_high,
        clip_c=clip_c(args),
        clip_reward=get(args, "rpg.reward_term", "clipped") == "clipped",
        weight_level=get(args, "rpg.weight_level", "token"),
        aggregation=aggregation(args),
        kl_value_clamp=get(args, "rpg.kl_value_clamp"),
        kl_rho=get(args, "rpg.kl_rho", "on") != "off",
        aggregation_scope=get(args, "rpg.aggregation_scope", "step"),
        rollout_correction=rollout_correction(args),
    )


def resolved_config(args: Any) -> dict[str, Any]:
    """What an RPG run will do, as a JSON-serializable dict (``rpg-train --dry-run``)."""
    if not enabled(args):
        return {"enabled": False}
    from dataclasses import asdict

    ref_update = get(args, "rpg.ref_update")
    return {
        "enabled": True,
        "loss": get(args, "rpg.loss"),
        "style": get(args, "rpg.style"),
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


def validate(args: Any) -> None:
    """:func:`rpg_openrlhf.plugin.validation.validate` (every invalid flag combination, before Ray)."""
    from rpg_openrlhf.plugin.validation import validate as _validate

    _validate(args)
