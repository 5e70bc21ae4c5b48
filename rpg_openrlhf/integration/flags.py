"""The ``--rpg.*`` flags of ``rpg-train`` and the driver-side switch that turns RPG on.

Contract with ``rpg_openrlhf.integration.cli`` (docs/contracts.md, "rpg-train entry point"):

* :func:`add_rpg_arguments` adds the dotted ``--rpg.*`` flags to OpenRLHF's own parser;
* :func:`validate` raises ``ValueError`` naming the flags for every invalid combination,
  before Ray starts;
* :func:`resolved_config` is what ``--dry-run`` prints.

Installing RPG (the argument changes and the class swaps) is :mod:`rpg_openrlhf.integration.installer`'s:
this module parses and validates only, and imports nothing of the glue (a leaf).

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
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

ADVANTAGES = ("mean", "mean_std", "loo", "none")
REF_UPDATES = ("initial", "rollout", "every_k", "kl_threshold")
OPTIMIZERS = ("adamw", "schedulefree")
WEIGHT_LEVELS = ("token", "sequence")
REWARD_TERMS = ("clipped", "plain")
KL_RHO = ("on", "off")
AGGREGATION_SCOPES = ("step", "micro_batch")
ESTIMATOR = "rpg"
#: Dual-clip bound used by RPG-Style Clip when ``--rpg.clip_c`` is not given (the paper's code).
DEFAULT_CLIP_C_REINFORCE_CLIP = 10.0
CLIP_STYLES = ("reinforce_clip", "reinforce_clip_released")
#: OpenRLHF starts its reference actor group only when ``algo.kl.init_coef > 0``. When an RPG
#: run needs a reference model, :func:`install` sets the coefficient to this value so that
#: ``train()`` starts the group; the RPG trainer then sets the KL controller to 0 and keeps the
#: reference log-probs out of the reward, so the value is inert (the KL is ``--rpg.beta``).
REFERENCE_SWITCH_COEF = 1.0


@dataclass(frozen=True)
class FlagSpec:
    """One ``--rpg.*`` flag of :func:`add_rpg_arguments` (``choices``: a tuple, or the name of a
    tuple in ``rpg_openrlhf.core``, read when the parser is built)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | str | None = None


#: Every ``--rpg.*`` flag of the loss, with its default (``None`` = unset) and help.
FLAG_SPECS: tuple[FlagSpec, ...] = (
    FlagSpec("rpg.loss", str, None, "RPG loss; turns RPG on (the KL enters the loss once, coefficient "
             "--rpg.beta). grpo_kl / grpo_kl_corrected: GRPO's k3 KL term without / with the importance weight.",
             "LOSS_NAMES"),
    FlagSpec("rpg.style", str, "differentiable", "differentiable surrogate, REINFORCE-style (stop-gradient "
             "coefficient), or reinforce_clip (RPG-Style Clip: dual-clip PPO on the regularized advantage)",
             "STYLES"),
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
    FlagSpec("rpg.capture_dir", str, None, "debug: dump every loss input/output and reference refresh here "
             "(env RPG_CAPTURE_DIR)"),
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


def _core():
    from rpg_openrlhf import core

    return core


# ----------------------------------------------------------------------------- accessors
def _has(args: Any, key: str) -> bool:
    if key in vars(args):
        return True
    node = args
    for part in key.split("."):
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def get(args: Any, key: str, default: Any = None) -> Any:
    """``args[key]`` for a flat (``"rpg.loss"`` attribute) or nested namespace."""
    flat = vars(args)
    if key in flat:
        return flat[key]
    node = args
    for part in key.split("."):
        if not hasattr(node, part):
            return default
        node = getattr(node, part)
    return node


def set_value(args: Any, key: str, value: Any) -> None:
    """Set ``args[key]`` in a flat or nested namespace (intermediate namespaces are created)."""
    if key in vars(args):
        setattr(args, key, value)
        return
    parts = key.split(".")
    node = args
    for part in parts[:-1]:
        if not hasattr(node, part):
            setattr(node, part, SimpleNamespace())
        node = getattr(node, part)
    setattr(node, parts[-1], value)


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
    core = _core()
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
        choices = getattr(core, spec.choices) if isinstance(spec.choices, str) else spec.choices
        g.add_argument(
            f"--{spec.name}",
            type=spec.type,
            default=spec.default,
            choices=None if choices is None else list(choices),
            help=spec.help,
        )
    return parser


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


def loss_config(args: Any):
    """The ``rpg_openrlhf.core.LossConfig`` these flags describe."""
    core = _core()
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
        "openrlhf_kl": "off (use_loss off, reward penalty 0; the KL is inside the RPG loss)",
        "entropy_logged": True,
        "capture_dir": get(args, "rpg.capture_dir"),
    }


# ----------------------------------------------------------------------------- validation
def _err(msg: str) -> ValueError:
    return ValueError(f"rpg-train: {msg}")


#: A rule: (the flag combination is invalid, the message naming the flags). Checked in order; the
#: first invalid one raises ``ValueError("rpg-train: <message>")``.
Rule = tuple[Callable[[Any], bool], Callable[[Any], str]]


def _choice_rule(key: str, allowed: tuple[str, ...], default: str | None = None) -> Rule:
    return (
        lambda a: get(a, key, default) not in allowed,
        lambda a: f"--{key} {get(a, key)!r} is unknown; choose one of {', '.join(allowed)}",
    )


def _user_set_flags(args: Any) -> list[str]:
    return [
        k for k, d in RPG_DEFAULTS.items() if k != "rpg.capture_dir" and _has(args, k) and get(args, k) != d
    ]


def _bad_number(x: Any, low: float, strict: bool) -> bool:
    return x is None or not math.isfinite(x) or (x <= low if strict else x < low)


def _ref_gpus(args: Any) -> tuple[Any, Any]:
    return get(args, "ref.num_nodes", 1), get(args, "ref.num_gpus_per_node", 1)


def _schedulefree_missing(_args: Any) -> bool:
    try:
        import schedulefree  # noqa: F401
    except ImportError:
        return True
    return False


def _sf(args: Any) -> bool:
    return get(args, "rpg.optimizer") == "schedulefree"


def _mode(args: Any) -> Any:
    return get(args, "rpg.ref_update")


#: Rules while RPG is off (no --rpg.loss).
OFF_RULES: tuple[Rule, ...] = (
    (lambda a: bool(_user_set_flags(a)), lambda a: f"--{_user_set_flags(a)[0]} has no effect without --rpg.loss (RPG is off)"),
    (lambda a: get(a, "algo.advantage.estimator") == ESTIMATOR, lambda a: "--algo.advantage.estimator rpg requires --rpg.loss"),
)  # fmt: skip

#: Rules of an RPG run, in the order they are reported.
RULES: tuple[Rule, ...] = (
    (lambda a: get(a, "rpg.loss") not in _core().LOSS_NAMES,
     lambda a: f"--rpg.loss {get(a, 'rpg.loss')!r} is unknown; choose one of {', '.join(_core().LOSS_NAMES)}"),
    (lambda a: get(a, "rpg.style") not in _core().STYLES,
     lambda a: f"--rpg.style {get(a, 'rpg.style')!r} is unknown; choose one of {', '.join(_core().STYLES)}"),
    _choice_rule("rpg.advantage", ADVANTAGES),
    _choice_rule("rpg.ref_update", REF_UPDATES),
    _choice_rule("rpg.optimizer", OPTIMIZERS),
    _choice_rule("rpg.weight_level", WEIGHT_LEVELS),
    _choice_rule("rpg.reward_term", REWARD_TERMS),
    (lambda a: _bad_number(get(a, "rpg.beta"), 0.0, strict=False),
     lambda a: f"--rpg.beta must be a finite number >= 0, got {get(a, 'rpg.beta')}"),
    (lambda a: get(a, "rpg.clip_c") is not None and not get(a, "rpg.clip_c") > 1,
     lambda a: f"--rpg.clip_c must be > 1 (dual-clip bound c), got {get(a, 'rpg.clip_c')}"),
    (lambda a: get(a, "actor.dual_clip") is not None,
     lambda a: "--actor.dual_clip is OpenRLHF's PPO dual clip; with --rpg.loss use --rpg.clip_c"),
    (lambda a: not (0 <= _eps(a)[0] < 1 and _eps(a)[1] >= 0),
     lambda a: "--actor.eps_clip_low_high must satisfy 0 <= low < 1 and high >= 0, got "
     f"{_eps(a)[0]}, {_eps(a)[1]}"),
    # OpenRLHF's own KL would apply a second KL.
    (lambda a: bool(get(a, "algo.kl.use_loss")),
     lambda a: "--rpg.loss with --algo.kl.use_loss would apply the KL twice: the RPG loss already "
     "contains it (coefficient --rpg.beta); drop --algo.kl.use_loss"),
    (lambda a: (c := get(a, "algo.kl.init_coef")) is not None and not isinstance(c, DefaultFloat) and c > 0,
     lambda a: f"--rpg.loss with --algo.kl.init_coef {get(a, 'algo.kl.init_coef')} > 0 would add OpenRLHF's "
     "KL reward penalty on top of the RPG KL; set the KL coefficient with --rpg.beta and drop "
     "--algo.kl.init_coef (or set it to 0)"),
    (lambda a: get(a, "algo.kl.target") is not None,
     lambda a: "--algo.kl.target (adaptive KL controller) cannot be combined with --rpg.loss; use --rpg.beta"),
    # Advantage estimator.
    (lambda a: (e := get(a, "algo.advantage.estimator")) not in (None, ESTIMATOR) and not isinstance(e, DefaultStr),
     lambda a: "--rpg.loss uses the 'rpg' advantage estimator (baseline --rpg.advantage); "
     f"--algo.advantage.estimator {get(a, 'algo.advantage.estimator')} conflicts: drop it or pass 'rpg'"),
    (lambda a: get(a, "rpg.advantage") in ("mean", "mean_std", "loo")
     and (n := get(a, "rollout.n_samples_per_prompt", 1)) is not None and n < 2,
     lambda a: f"--rpg.advantage {get(a, 'rpg.advantage')} needs a group: --rollout.n_samples_per_prompt "
     f"must be >= 2 (got {get(a, 'rollout.n_samples_per_prompt', 1)}); or use --rpg.advantage none"),
    (lambda a: (g := get(a, "algo.advantage.gamma", 1.0)) is not None and g != 1.0,
     lambda a: f"--rpg.loss needs --algo.advantage.gamma 1 (got {get(a, 'algo.advantage.gamma', 1.0)}): "
     "the RPG advantage is per sequence"),
    # Reference policy.
    (lambda a: _mode(a) == "every_k" and ((k := get(a, "rpg.ref_update_k")) is None or k < 1),
     lambda a: f"--rpg.ref_update every_k needs --rpg.ref_update_k >= 1 (got {get(a, 'rpg.ref_update_k')})"),
    (lambda a: _mode(a) != "every_k" and get(a, "rpg.ref_update_k") is not None,
     lambda a: "--rpg.ref_update_k is only used with --rpg.ref_update every_k "
     f"(got --rpg.ref_update {_mode(a)})"),
    (lambda a: _mode(a) == "kl_threshold" and ((kappa := get(a, "rpg.ref_kl_threshold")) is None or not kappa > 0),
     lambda a: "--rpg.ref_update kl_threshold needs --rpg.ref_kl_threshold > 0 "
     f"(got {get(a, 'rpg.ref_kl_threshold')})"),
    (lambda a: _mode(a) != "kl_threshold" and get(a, "rpg.ref_kl_threshold") is not None,
     lambda a: "--rpg.ref_kl_threshold is only used with --rpg.ref_update kl_threshold "
     f"(got --rpg.ref_update {_mode(a)})"),
    (lambda a: _mode(a) != "rollout" and not (all(_ref_gpus(a)) and min(_ref_gpus(a)) >= 1),
     lambda a: f"--rpg.ref_update {_mode(a)} needs a reference model, but it is off "
     f"(--ref.num_nodes {_ref_gpus(a)[0]} --ref.num_gpus_per_node {_ref_gpus(a)[1]}); "
     "use --rpg.ref_update rollout or give the reference model GPUs"),
    (lambda a: _mode(a) != "rollout"
     and bool(get(a, "train.colocate_actor_ref") or get(a, "train.colocate_all"))
     and (get(a, "actor.num_nodes"), get(a, "actor.num_gpus_per_node")) != _ref_gpus(a),
     lambda a: "--train.colocate_actor_ref/--train.colocate_all with a reference model needs "
     "--ref.num_nodes/--ref.num_gpus_per_node equal to --actor.num_nodes/--actor.num_gpus_per_node"),
    (lambda a: _mode(a) in ("every_k", "kl_threshold") and (get(a, "ds.lora.rank", 0) or 0) > 0,
     lambda a: f"--rpg.ref_update {_mode(a)} copies full actor weights; it does not support --ds.lora.rank > 0"),
    # Things the RPG actor does not implement.
    (lambda a: bool(get(a, "train.async_enable")),
     lambda a: "--rpg.loss does not support --train.async_enable (the RPG trainer is the synchronous one)"),
    (lambda a: get(a, "actor.policy_loss_type", "ppo") != "ppo",
     lambda a: f"--rpg.loss replaces the policy loss; --actor.policy_loss_type {get(a, 'actor.policy_loss_type')}"),
    (lambda a: get(a, "algo.advantage.is_correction_level", "off") != "off",
     lambda a: "--rpg.loss does not implement --algo.advantage.is_correction_level (vLLM mismatch correction)"),
    (lambda a: aggregation(a) not in ("token-mean", "seq-mean-token-mean"),
     lambda a: f"--actor.loss_agg_mode {aggregation(a)} is not supported with --rpg.loss"),
    # Optimizer.
    (lambda a: _sf(a) and _schedulefree_missing(a),
     lambda a: "--rpg.optimizer schedulefree needs the 'schedulefree' package (pip install schedulefree)"),
    (lambda a: _sf(a) and get(a, "actor.optim", "adam") != "adam",
     lambda a: "--rpg.optimizer schedulefree replaces AdamW; it cannot be combined with --actor.optim muon"),
    (lambda a: _sf(a) and get(a, "actor.lr_scheduler", "constant") != "constant",
     lambda a: "--rpg.optimizer schedulefree needs --actor.lr_scheduler constant (Schedule-Free needs no "
     "schedule; its warm-up comes from --actor.lr_warmup_ratio)"),
    (lambda a: _sf(a) and bool(get(a, "train.enable_ema")),
     lambda a: "--rpg.optimizer schedulefree cannot be combined with --train.enable_ema"),
    # The released code's options.
    _choice_rule("rpg.kl_rho", KL_RHO, KL_RHO[0]),
    _choice_rule("rpg.aggregation_scope", AGGREGATION_SCOPES, AGGREGATION_SCOPES[0]),
    (lambda a: (k := get(a, "rpg.kl_value_clamp")) is not None and not (math.isfinite(k) and k > 0),
     lambda a: f"--rpg.kl_value_clamp must be a finite number > 0, got {get(a, 'rpg.kl_value_clamp')}"),
    (lambda a: get(a, "rpg.kl_value_clamp") is not None and get(a, "rpg.style") != "differentiable",
     lambda a: "--rpg.kl_value_clamp clamps the KL value term of --rpg.style differentiable (the released "
     f"code's KL loss); --rpg.style {get(a, 'rpg.style')} has none"),
)  # fmt: skip


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flags for every invalid RPG combination (:data:`RULES`, or
    :data:`OFF_RULES` without --rpg.loss), then let the core check the (loss, style, config) combination.

    Call before Ray starts. Does not change ``args``.
    """
    for invalid, message in RULES if enabled(args) else OFF_RULES:
        if invalid(args):
            raise _err(message(args))
    if enabled(args):
        _check_with_core(args)


def _check_with_core(args: Any) -> None:
    import torch

    core = _core()
    cfg = loss_config(args)
    logp = torch.zeros(1, 1)
    ref = None if get(args, "rpg.ref_update") == "rollout" else torch.zeros(1, 1)
    try:
        core.compute_loss(
            get(args, "rpg.loss"),
            get(args, "rpg.style"),
            logp,
            logp,
            torch.ones(1, 1),
            torch.ones(1, 1),
            ref,
            config=cfg,
        )
    except ValueError as e:
        raise _err(
            f"--rpg.loss {get(args, 'rpg.loss')} --rpg.style {get(args, 'rpg.style')} "
            f"(--rpg.weight_level {cfg.weight_level}, --rpg.clip_c {cfg.clip_c}): {e}"
        ) from e
