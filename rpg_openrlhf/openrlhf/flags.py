"""The ``--rpg.*`` flags of ``rpg-train`` and the driver-side switch that turns RPG on.

Contract with ``rpg_openrlhf.openrlhf.cli`` (docs/contracts.md, "rpg-train entry point"):

* :func:`add_rpg_arguments` adds the dotted ``--rpg.*`` flags to OpenRLHF's own parser;
* :func:`validate` raises ``ValueError`` naming the flags for every invalid combination,
  before Ray starts;
* :func:`resolved_config` is what ``--dry-run`` prints;
* :func:`install` runs in the driver after parsing and before OpenRLHF's ``train(args)``:
  with ``--rpg.loss`` it swaps in the RPG policy actor, reference actor and PPO trainer;
  without it, it does nothing.

All four accept either the flat namespace argparse returns (``getattr(args, "rpg.loss")``)
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

#: flag name -> default (``None`` = unset). Every ``--rpg.*`` flag is listed here.
RPG_DEFAULTS: dict[str, Any] = {
    "rpg.loss": None,
    "rpg.style": "differentiable",
    "rpg.beta": 1e-4,
    "rpg.clip_c": None,
    "rpg.weight_level": "token",
    "rpg.reward_term": "clipped",
    "rpg.advantage": "mean",
    "rpg.ref_update": "rollout",
    "rpg.ref_update_k": None,
    "rpg.ref_kl_threshold": None,
    "rpg.optimizer": "adamw",
    "rpg.capture_dir": None,
    # the released code's behaviour (docs/losses.md, "The released code"); defaults = the paper
    "rpg.kl_value_clamp": None,
    "rpg.kl_rho": "on",
    "rpg.aggregation_scope": "step",
}


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


def _set(args: Any, key: str, value: Any) -> None:
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
    g.add_argument(
        "--rpg.loss",
        type=str,
        default=None,
        choices=list(core.LOSS_NAMES),
        help="RPG loss; turns RPG on (the KL enters the loss once, coefficient --rpg.beta). "
        "grpo_kl / grpo_kl_corrected: GRPO's k3 KL term without / with the importance weight.",
    )
    g.add_argument(
        "--rpg.style",
        type=str,
        default=RPG_DEFAULTS["rpg.style"],
        choices=list(core.STYLES),
        help="differentiable surrogate, REINFORCE-style (stop-gradient coefficient), or "
        "reinforce_clip (RPG-Style Clip: dual-clip PPO on the regularized advantage)",
    )
    g.add_argument("--rpg.beta", type=float, default=RPG_DEFAULTS["rpg.beta"], help="KL coefficient beta")
    g.add_argument(
        "--rpg.clip_c",
        type=float,
        default=None,
        help="dual-clip bound c > 1 (eps comes from --actor.eps_clip_low_high); default: "
        f"{DEFAULT_CLIP_C_REINFORCE_CLIP:g} with --rpg.style reinforce_clip, off otherwise",
    )
    g.add_argument(
        "--rpg.weight_level",
        type=str,
        default=RPG_DEFAULTS["rpg.weight_level"],
        choices=list(WEIGHT_LEVELS),
        help="importance weight per token (the paper's code) or per sequence (the paper's theory)",
    )
    g.add_argument(
        "--rpg.reward_term",
        type=str,
        default=RPG_DEFAULTS["rpg.reward_term"],
        choices=list(REWARD_TERMS),
        help="differentiable style: clipped PPO reward term (the paper's code) or plain -w*A",
    )
    g.add_argument(
        "--rpg.advantage",
        type=str,
        default=RPG_DEFAULTS["rpg.advantage"],
        choices=list(ADVANTAGES),
        help="group baseline of the 'rpg' advantage estimator: mean (the paper), mean_std (GRPO), "
        "loo (leave-one-out), none",
    )
    g.add_argument(
        "--rpg.ref_update",
        type=str,
        default=RPG_DEFAULTS["rpg.ref_update"],
        choices=list(REF_UPDATES),
        help="reference policy: rollout (pi_ref = pi_old, no reference model; the paper's code), "
        "initial (fixed initial model), every_k (copy the actor into the reference every "
        "--rpg.ref_update_k steps), kl_threshold (when the running KL exceeds --rpg.ref_kl_threshold)",
    )
    g.add_argument(
        "--rpg.ref_update_k", type=int, default=None, help="K for --rpg.ref_update every_k (global steps)"
    )
    g.add_argument(
        "--rpg.ref_kl_threshold", type=float, default=None, help="kappa for --rpg.ref_update kl_threshold"
    )
    g.add_argument(
        "--rpg.optimizer",
        type=str,
        default=RPG_DEFAULTS["rpg.optimizer"],
        choices=list(OPTIMIZERS),
        help="adamw (OpenRLHF's DeepSpeed AdamW) or schedulefree (Schedule-Free AdamW; needs "
        "--actor.lr_scheduler constant; warm-up from --actor.lr_warmup_ratio)",
    )
    g.add_argument(
        "--rpg.capture_dir",
        type=str,
        default=None,
        help="debug: dump every loss input/output and reference refresh here (env RPG_CAPTURE_DIR)",
    )
    # The released code's departures from the paper (docs/losses.md, "The released code").
    g.add_argument(
        "--rpg.kl_value_clamp",
        type=float,
        default=None,
        help="differentiable style: clamp the per-token KL value to [-K, K] where the released code "
        "does (rkl, ufkl, urkl, GRPO's k3; K = 10 there; its gradient is 0 beyond). Default: off (the paper)",
    )
    g.add_argument(
        "--rpg.kl_rho",
        type=str,
        default=RPG_DEFAULTS["rpg.kl_rho"],
        choices=list(KL_RHO),
        help="off: the KL part without the rho = pi_ref/pi_old weight, as the released code (matters "
        "only with a reference model, --rpg.ref_update != rollout). Default on (the paper)",
    )
    g.add_argument(
        "--rpg.aggregation_scope",
        type=str,
        default=RPG_DEFAULTS["rpg.aggregation_scope"],
        choices=list(AGGREGATION_SCOPES),
        help="step: one mean over the optimizer step (OpenRLHF, the paper); micro_batch: a mean per "
        "micro-batch, micro-batches averaged (weighted by their sequences), as the released code",
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


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flags for every invalid RPG combination.

    Call before Ray starts. Does not change ``args``.
    """
    if not enabled(args):
        set_flags = [
            k
            for k, d in RPG_DEFAULTS.items()
            if k not in ("rpg.capture_dir",) and _has(args, k) and get(args, k) != d
        ]
        if set_flags:
            raise _err(f"--{set_flags[0]} has no effect without --rpg.loss (RPG is off)")
        if get(args, "algo.advantage.estimator") == ESTIMATOR:
            raise _err("--algo.advantage.estimator rpg requires --rpg.loss")
        return

    core = _core()
    name, style = get(args, "rpg.loss"), get(args, "rpg.style")
    if name not in core.LOSS_NAMES:
        raise _err(f"--rpg.loss {name!r} is unknown; choose one of {', '.join(core.LOSS_NAMES)}")
    if style not in core.STYLES:
        raise _err(f"--rpg.style {style!r} is unknown; choose one of {', '.join(core.STYLES)}")
    for key, allowed in (
        ("rpg.advantage", ADVANTAGES),
        ("rpg.ref_update", REF_UPDATES),
        ("rpg.optimizer", OPTIMIZERS),
        ("rpg.weight_level", WEIGHT_LEVELS),
        ("rpg.reward_term", REWARD_TERMS),
    ):
        if get(args, key) not in allowed:
            raise _err(f"--{key} {get(args, key)!r} is unknown; choose one of {', '.join(allowed)}")

    beta = get(args, "rpg.beta")
    if beta is None or not math.isfinite(beta) or beta < 0:
        raise _err(f"--rpg.beta must be a finite number >= 0, got {beta}")
    c = get(args, "rpg.clip_c")
    if c is not None and not c > 1:
        raise _err(f"--rpg.clip_c must be > 1 (dual-clip bound c), got {c}")
    if get(args, "actor.dual_clip") is not None:
        raise _err("--actor.dual_clip is OpenRLHF's PPO dual clip; with --rpg.loss use --rpg.clip_c")
    eps_low, eps_high = _eps(args)
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise _err(
            f"--actor.eps_clip_low_high must satisfy 0 <= low < 1 and high >= 0, got {eps_low}, {eps_high}"
        )

    # OpenRLHF's own KL would apply a second KL.
    if get(args, "algo.kl.use_loss"):
        raise _err(
            "--rpg.loss with --algo.kl.use_loss would apply the KL twice: the RPG loss already "
            "contains it (coefficient --rpg.beta); drop --algo.kl.use_loss"
        )
    init_coef = get(args, "algo.kl.init_coef")
    if init_coef is not None and not isinstance(init_coef, DefaultFloat) and init_coef > 0:
        raise _err(
            f"--rpg.loss with --algo.kl.init_coef {init_coef} > 0 would add OpenRLHF's KL reward "
            "penalty on top of the RPG KL; set the KL coefficient with --rpg.beta and drop "
            "--algo.kl.init_coef (or set it to 0)"
        )
    if get(args, "algo.kl.target") is not None:
        raise _err(
            "--algo.kl.target (adaptive KL controller) cannot be combined with --rpg.loss; use --rpg.beta"
        )

    # Advantage estimator.
    est = get(args, "algo.advantage.estimator")
    if est not in (None, ESTIMATOR) and not isinstance(est, DefaultStr):
        raise _err(
            f"--rpg.loss uses the 'rpg' advantage estimator (baseline --rpg.advantage); "
            f"--algo.advantage.estimator {est} conflicts: drop it or pass 'rpg'"
        )
    n = get(args, "rollout.n_samples_per_prompt", 1)
    adv = get(args, "rpg.advantage")
    if adv in ("mean", "mean_std", "loo") and n is not None and n < 2:
        raise _err(
            f"--rpg.advantage {adv} needs a group: --rollout.n_samples_per_prompt must be >= 2 (got {n}); "
            "or use --rpg.advantage none"
        )
    gamma = get(args, "algo.advantage.gamma", 1.0)
    if gamma is not None and gamma != 1.0:
        raise _err(
            f"--rpg.loss needs --algo.advantage.gamma 1 (got {gamma}): the RPG advantage is per sequence"
        )

    # Reference policy.
    mode = get(args, "rpg.ref_update")
    k = get(args, "rpg.ref_update_k")
    kappa = get(args, "rpg.ref_kl_threshold")
    if mode == "every_k" and (k is None or k < 1):
        raise _err(f"--rpg.ref_update every_k needs --rpg.ref_update_k >= 1 (got {k})")
    if mode != "every_k" and k is not None:
        raise _err(
            f"--rpg.ref_update_k is only used with --rpg.ref_update every_k (got --rpg.ref_update {mode})"
        )
    if mode == "kl_threshold" and (kappa is None or not kappa > 0):
        raise _err(f"--rpg.ref_update kl_threshold needs --rpg.ref_kl_threshold > 0 (got {kappa})")
    if mode != "kl_threshold" and kappa is not None:
        raise _err(
            f"--rpg.ref_kl_threshold is only used with --rpg.ref_update kl_threshold (got --rpg.ref_update {mode})"
        )
    if mode != "rollout":
        ref_nodes, ref_gpus = get(args, "ref.num_nodes", 1), get(args, "ref.num_gpus_per_node", 1)
        if not ref_nodes or not ref_gpus or ref_nodes < 1 or ref_gpus < 1:
            raise _err(
                f"--rpg.ref_update {mode} needs a reference model, but it is off "
                f"(--ref.num_nodes {ref_nodes} --ref.num_gpus_per_node {ref_gpus}); "
                "use --rpg.ref_update rollout or give the reference model GPUs"
            )
        if get(args, "train.colocate_actor_ref") or get(args, "train.colocate_all"):
            a = (get(args, "actor.num_nodes"), get(args, "actor.num_gpus_per_node"))
            if a != (ref_nodes, ref_gpus):
                raise _err(
                    "--train.colocate_actor_ref/--train.colocate_all with a reference model needs "
                    "--ref.num_nodes/--ref.num_gpus_per_node equal to --actor.num_nodes/--actor.num_gpus_per_node"
                )
        if mode in ("every_k", "kl_threshold") and (get(args, "ds.lora.rank", 0) or 0) > 0:
            raise _err(
                f"--rpg.ref_update {mode} copies full actor weights; it does not support --ds.lora.rank > 0"
            )

    # Things the RPG actor does not implement.
    if get(args, "train.async_enable"):
        raise _err(
            "--rpg.loss does not support --train.async_enable (the RPG trainer is the synchronous one)"
        )
    if get(args, "actor.policy_loss_type", "ppo") != "ppo":
        raise _err(
            f"--rpg.loss replaces the policy loss; --actor.policy_loss_type {get(args, 'actor.policy_loss_type')}"
        )
    if get(args, "algo.advantage.is_correction_level", "off") != "off":
        raise _err(
            "--rpg.loss does not implement --algo.advantage.is_correction_level (vLLM mismatch correction)"
        )
    if aggregation(args) not in ("token-mean", "seq-mean-token-mean"):
        raise _err(f"--actor.loss_agg_mode {aggregation(args)} is not supported with --rpg.loss")

    # Optimizer.
    if get(args, "rpg.optimizer") == "schedulefree":
        try:
            import schedulefree  # noqa: F401
        except ImportError as e:
            raise _err(
                "--rpg.optimizer schedulefree needs the 'schedulefree' package (pip install schedulefree)"
            ) from e
        if get(args, "actor.optim", "adam") != "adam":
            raise _err(
                "--rpg.optimizer schedulefree replaces AdamW; it cannot be combined with --actor.optim muon"
            )
        if get(args, "actor.lr_scheduler", "constant") != "constant":
            raise _err(
                "--rpg.optimizer schedulefree needs --actor.lr_scheduler constant (Schedule-Free needs no "
                "schedule; its warm-up comes from --actor.lr_warmup_ratio)"
            )
        if get(args, "train.enable_ema"):
            raise _err("--rpg.optimizer schedulefree cannot be combined with --train.enable_ema")

    _validate_released_options(args)
    # Finally let the core check the (loss, style, config) combination on a 1-token batch.
    _check_with_core(args)


def _validate_released_options(args: Any) -> None:
    """The released code's options (--rpg.kl_value_clamp, --rpg.kl_rho, --rpg.aggregation_scope)."""
    for key, allowed in (("rpg.kl_rho", KL_RHO), ("rpg.aggregation_scope", AGGREGATION_SCOPES)):
        if get(args, key, allowed[0]) not in allowed:
            raise _err(f"--{key} {get(args, key)!r} is unknown; choose one of {', '.join(allowed)}")
    k = get(args, "rpg.kl_value_clamp")
    if k is not None:
        if not (math.isfinite(k) and k > 0):
            raise _err(f"--rpg.kl_value_clamp must be a finite number > 0, got {k}")
        if get(args, "rpg.style") != "differentiable":
            raise _err(
                "--rpg.kl_value_clamp clamps the KL value term of --rpg.style differentiable (the released "
                f"code's KL loss); --rpg.style {get(args, 'rpg.style')} has none"
            )


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


# ----------------------------------------------------------------------------- install
def install(args: Any, swap_classes: bool = True) -> bool:
    """Prepare ``args`` and swap in the RPG classes; a no-op (returns False) without --rpg.loss.

    ``swap_classes=False`` (``--dry-run``) only prepares ``args``, to show what will run.

    Runs in the driver, after parsing and before OpenRLHF's ``train(args)``:

    * ``algo.advantage.estimator`` becomes ``rpg`` (and the critic is dropped);
    * OpenRLHF's KL is switched off: ``algo.kl.use_loss`` stays off and ``algo.kl.init_coef``
      becomes 0, or :data:`REFERENCE_SWITCH_COEF` when the reference update needs a reference
      model (that is the only switch that makes ``train()`` start one; the RPG trainer zeroes the
      KL controller, so it never reaches the reward);
    * ``actor.entropy_coef`` None becomes 0 (entropy is logged, not optimized);
    * ``rpg.capture_dir`` defaults to the env var ``RPG_CAPTURE_DIR``;
    * ``openrlhf.trainer.ray.ppo_actor.PolicyModelActor``, ``...launcher.ReferenceModelActor``
      and ``openrlhf.trainer.ppo_trainer.PPOTrainer`` become the RPG classes.
    """
    import os

    if not enabled(args):
        return False
    validate(args)
    _set(args, "algo.advantage.estimator", ESTIMATOR)
    _set(args, "critic.model_name_or_path", None)  # OpenRLHF fills it in for the default "gae"
    _set(args, "algo.kl.use_loss", False)
    # DefaultFloat: a later validate(args) still reads it as "not typed by the user".
    _set(
        args, "algo.kl.init_coef", DefaultFloat(REFERENCE_SWITCH_COEF if needs_reference_model(args) else 0.0)
    )
    if get(args, "actor.entropy_coef") is None:
        _set(args, "actor.entropy_coef", 0.0)
    if get(args, "rpg.capture_dir") is None and os.environ.get("RPG_CAPTURE_DIR"):
        _set(args, "rpg.capture_dir", os.environ["RPG_CAPTURE_DIR"])
    if get(args, "rpg.style") in CLIP_STYLES and get(args, "rpg.clip_c") is None:
        _set(args, "rpg.clip_c", DEFAULT_CLIP_C_REINFORCE_CLIP)
    if swap_classes:
        _swap_classes()
    return True


def _swap_classes() -> None:
    """Point OpenRLHF's module attributes at the RPG classes (idempotent).

    The entry point re-binds train_ppo_ray's module-level names from these modules after
    :func:`install` (docs/contracts.md); ``PPOTrainer`` is imported inside ``train()``.
    """
    import openrlhf.trainer.ppo_trainer as ppo_trainer_mod
    import openrlhf.trainer.ray.launcher as launcher_mod
    import openrlhf.trainer.ray.ppo_actor as ppo_actor_mod

    from rpg_openrlhf.openrlhf.actor import RPGPolicyModelActor, RPGReferenceModelActor
    from rpg_openrlhf.openrlhf.trainer import RPGPPOTrainer

    ppo_actor_mod.PolicyModelActor = RPGPolicyModelActor
    launcher_mod.ReferenceModelActor = RPGReferenceModelActor
    ppo_trainer_mod.PPOTrainer = RPGPPOTrainer
