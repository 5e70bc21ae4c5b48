"""Every invalid ``--rpg.*`` combination, refused before Ray starts with one message naming the flags.

Plain functions, one per concern, checked in the order of :func:`validate`; the first invalid
setting raises ``ValueError("rpg-train: <message>")``. They read flat or nested namespaces.
"""

from __future__ import annotations

import math
from typing import Any

from rpg_openrlhf import core
from rpg_openrlhf.common.args import get, has
from rpg_openrlhf.plugin.flags import (
    ADVANTAGES,
    AGGREGATION_SCOPES,
    ESTIMATOR,
    KL_RHO,
    OLD_LOGPS,
    OPTIMIZERS,
    REF_UPDATES,
    REWARD_TERMS,
    RPG_DEFAULTS,
    WEIGHT_LEVELS,
    DefaultFloat,
    DefaultStr,
    _eps,
    aggregation,
    correction_threshold,
    enabled,
    import_loss_modules,
    loss_config,
    rollout_correction,
)


def _err(msg: str) -> ValueError:
    return ValueError(f"rpg-train: {msg}")


def _choice(args: Any, key: str, allowed: tuple[str, ...], default: str | None = None) -> None:
    if get(args, key, default) not in allowed:
        raise _err(f"--{key} {get(args, key)!r} is unknown; choose one of {', '.join(allowed)}")


def _bad_number(x: Any, low: float, strict: bool) -> bool:
    return x is None or not math.isfinite(x) or (x <= low if strict else x < low)


def check_rpg_off(args: Any) -> None:
    """Without --rpg.loss no --rpg.* loss flag may be set, and the ``rpg`` estimator is not available."""
    user_set = [
        k for k, d in RPG_DEFAULTS.items() if k != "rpg.capture_dir" and has(args, k) and get(args, k) != d
    ]
    if user_set:
        raise _err(f"--{user_set[0]} has no effect without --rpg.loss (RPG is off)")
    if get(args, "algo.advantage.estimator") == ESTIMATOR:
        raise _err("--algo.advantage.estimator rpg requires --rpg.loss")


def check_choices(args: Any) -> None:
    """Names of losses, styles and modes (argparse checks them too; a namespace built in code may not)."""
    import_loss_modules(get(args, "rpg.loss_module"))  # a namespace built in code: not parsed
    _choice(args, "rpg.loss", core.registered_names())
    _choice(args, "rpg.style", core.registered_styles())
    for key, allowed in (
        ("rpg.advantage", ADVANTAGES),
        ("rpg.ref_update", REF_UPDATES),
        ("rpg.optimizer", OPTIMIZERS),
        ("rpg.weight_level", WEIGHT_LEVELS),
        ("rpg.reward_term", REWARD_TERMS),
        ("rpg.old_logp", OLD_LOGPS),
    ):
        _choice(args, key, allowed)


def check_numbers(args: Any) -> None:
    """beta, the dual-clip bound and the clip window."""
    if _bad_number(get(args, "rpg.beta"), 0.0, strict=False):
        raise _err(f"--rpg.beta must be a finite number >= 0, got {get(args, 'rpg.beta')}")
    c = get(args, "rpg.clip_c")
    if c is not None and not c > 1:
        raise _err(f"--rpg.clip_c must be > 1 (dual-clip bound c), got {c}")
    if get(args, "actor.dual_clip") is not None:
        raise _err("--actor.dual_clip is OpenRLHF's PPO dual clip; with --rpg.loss use --rpg.clip_c")
    low, high = _eps(args)
    if not (0 <= low < 1 and high >= 0):
        raise _err(f"--actor.eps_clip_low_high must satisfy 0 <= low < 1 and high >= 0, got {low}, {high}")


def check_openrlhf_kl(args: Any) -> None:
    """OpenRLHF's own KL would apply a second KL: the RPG loss already contains it."""
    if get(args, "algo.kl.use_loss"):
        raise _err(
            "--rpg.loss with --algo.kl.use_loss would apply the KL twice: the RPG loss already "
            "contains it (coefficient --rpg.beta); drop --algo.kl.use_loss"
        )
    coef = get(args, "algo.kl.init_coef")
    if coef is not None and not isinstance(coef, DefaultFloat) and coef > 0:
        raise _err(
            f"--rpg.loss with --algo.kl.init_coef {coef} > 0 would add OpenRLHF's KL reward penalty on "
            "top of the RPG KL; set the KL coefficient with --rpg.beta and drop --algo.kl.init_coef "
            "(or set it to 0)"
        )
    if get(args, "algo.kl.target") is not None:
        raise _err(
            "--algo.kl.target (adaptive KL controller) cannot be combined with --rpg.loss; use --rpg.beta"
        )


def check_advantage(args: Any) -> None:
    """The ``rpg`` estimator: a group baseline over the n samples of a prompt, per sequence."""
    estimator = get(args, "algo.advantage.estimator")
    if estimator not in (None, ESTIMATOR) and not isinstance(estimator, DefaultStr):
        raise _err(
            "--rpg.loss uses the 'rpg' advantage estimator (baseline --rpg.advantage); "
            f"--algo.advantage.estimator {estimator} conflicts: drop it or pass 'rpg'"
        )
    n = get(args, "rollout.n_samples_per_prompt", 1)
    if get(args, "rpg.advantage") in ("mean", "mean_std", "loo") and n is not None and n < 2:
        raise _err(
            f"--rpg.advantage {get(args, 'rpg.advantage')} needs a group: --rollout.n_samples_per_prompt "
            f"must be >= 2 (got {n}); or use --rpg.advantage none"
        )
    gamma = get(args, "algo.advantage.gamma", 1.0)
    if gamma is not None and gamma != 1.0:
        raise _err(
            f"--rpg.loss needs --algo.advantage.gamma 1 (got {gamma}): the RPG advantage is per sequence"
        )


def _ref_gpus(args: Any) -> tuple[Any, Any]:
    return get(args, "ref.num_nodes", 1), get(args, "ref.num_gpus_per_node", 1)


def check_reference(args: Any) -> None:
    """--rpg.ref_update and its parameters, and the reference model it needs."""
    mode, k, kappa = (
        get(args, "rpg.ref_update"),
        get(args, "rpg.ref_update_k"),
        get(args, "rpg.ref_kl_threshold"),
    )
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
    if mode == "rollout":
        return
    nodes, gpus = _ref_gpus(args)
    if not (nodes and gpus and min(nodes, gpus) >= 1):
        raise _err(
            f"--rpg.ref_update {mode} needs a reference model, but it is off (--ref.num_nodes {nodes} "
            f"--ref.num_gpus_per_node {gpus}); use --rpg.ref_update rollout or give the reference model GPUs"
        )
    colocated = get(args, "train.colocate_actor_ref") or get(args, "train.colocate_all")
    if colocated and (get(args, "actor.num_nodes"), get(args, "actor.num_gpus_per_node")) != (nodes, gpus):
        raise _err(
            "--train.colocate_actor_ref/--train.colocate_all with a reference model needs "
            "--ref.num_nodes/--ref.num_gpus_per_node equal to --actor.num_nodes/--actor.num_gpus_per_node"
        )
    if mode in ("every_k", "kl_threshold") and (get(args, "ds.lora.rank", 0) or 0) > 0:
        raise _err(
            f"--rpg.ref_update {mode} copies full actor weights; it does not support --ds.lora.rank > 0"
        )


def check_unsupported(args: Any) -> None:
    """OpenRLHF options the RPG actor does not implement."""
    if get(args, "actor.policy_loss_type", "ppo") != "ppo":
        raise _err(
            f"--rpg.loss replaces the policy loss; --actor.policy_loss_type {get(args, 'actor.policy_loss_type')}"
        )
    if aggregation(args) not in ("token-mean", "seq-mean-token-mean"):
        raise _err(f"--actor.loss_agg_mode {aggregation(args)} is not supported with --rpg.loss")


_LEVEL = "--algo.advantage.is_correction_level"
_MODE = "--algo.advantage.is_correction_mode"
_GATING = "--algo.advantage.is_correction_gating"
_THRESHOLD = "--algo.advantage.is_correction_threshold"


def check_rollout_correction(args: Any) -> None:
    """OpenRLHF's is_correction flags (its own rules, checked before Ray instead of in the actor) and
    what they cannot be combined with in RPG."""
    level, mode, gating = (
        get(args, f"algo.advantage.is_correction_{k}") for k in ("level", "mode", "gating")
    )
    try:
        low, high = correction_threshold(args)
    except ValueError as e:
        raise _err(str(e)) from e
    if not 0 <= low <= high:
        raise _err(f"{_THRESHOLD} LOW HIGH needs 0 <= LOW <= HIGH, got {low:g} {high:g}")
    if mode == "clip" and level == "seq":
        raise _err(
            f"{_MODE} clip clamps a token's ratio; it needs {_LEVEL} token (got seq: use {_MODE} mask)"
        )
    if mode == "clip" and gating not in (None, "ratio"):
        raise _err(f"{_MODE} clip clamps the ratio; it needs {_GATING} ratio (got {gating})")
    if gating not in (None, "ratio") and level not in (None, "off") and low > 0:
        raise _err(f"{_GATING} {gating} takes an upper bound only: {_THRESHOLD} HIGH (got {low:g} {high:g})")
    if level == "token" and get(args, "rpg.weight_level") == "sequence":
        raise _err(
            f"{_LEVEL} token weights each token, but --rpg.weight_level sequence has one loss per sequence: "
            f"use {_LEVEL} seq (exact) or --rpg.weight_level token"
        )
    if level not in (None, "off") and get(args, "rpg.old_logp") == "engine":
        raise _err(
            f"--rpg.old_logp engine makes pi_old the engine's policy, so the correction weight pi_old/mu of "
            f"{_LEVEL} {level} is 1: drop {_LEVEL} (or use --rpg.old_logp actor)"
        )
    try:
        rollout_correction(args)
    except ValueError as e:  # anything the core refuses that the rules above did not name
        raise _err(f"{_LEVEL} {level} {_MODE} {mode} {_GATING} {gating}: {e}") from e


def check_async(args: Any) -> None:
    """Under --train.async_enable samples come from an older policy than the actor's: RPG's weights
    need the sampling policy's log-probs, as pi_old or through the correction."""
    if not get(args, "train.async_enable"):
        return
    if get(args, "rpg.old_logp") != "engine" and get(args, "algo.advantage.is_correction_level") in (
        None,
        "off",
    ):
        raise _err(
            "--train.async_enable trains on samples of an older policy (one or more versions stale; mixed within "
            "a response with --train.partial_rollout_enable): weight them by the engine's log-probs with "
            f"--rpg.old_logp engine or {_LEVEL} seq"
        )


def _schedulefree_missing() -> bool:
    try:
        import schedulefree  # noqa: F401
    except ImportError:
        return True
    return False


def check_optimizer(args: Any) -> None:
    """--rpg.optimizer schedulefree and what it cannot be combined with."""
    if get(args, "rpg.optimizer") != "schedulefree":
        return
    if _schedulefree_missing():
        raise _err("--rpg.optimizer schedulefree needs the 'schedulefree' package (pip install schedulefree)")
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


def check_released_options(args: Any) -> None:
    """The released code's departures from the paper (docs/losses.md, "The released code")."""
    _choice(args, "rpg.kl_rho", KL_RHO, KL_RHO[0])
    _choice(args, "rpg.aggregation_scope", AGGREGATION_SCOPES, AGGREGATION_SCOPES[0])
    clamp = get(args, "rpg.kl_value_clamp")
    if clamp is None:
        return
    if not (math.isfinite(clamp) and clamp > 0):
        raise _err(f"--rpg.kl_value_clamp must be a finite number > 0, got {clamp}")
    if get(args, "rpg.style") != "differentiable":
        raise _err(
            "--rpg.kl_value_clamp clamps the KL value term of --rpg.style differentiable (the released "
            f"code's KL loss); --rpg.style {get(args, 'rpg.style')} has none"
        )


#: The checks of an RPG run, in the order they are reported.
CHECKS = (
    check_choices,
    check_numbers,
    check_openrlhf_kl,
    check_advantage,
    check_reference,
    check_unsupported,
    check_rollout_correction,
    check_async,
    check_optimizer,
    check_released_options,
)


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flags for every invalid RPG combination (:data:`CHECKS`, or
    :func:`check_rpg_off` without --rpg.loss), then let the core check the (loss, style, config)
    combination. Call before Ray starts. Does not change ``args``."""
    if not enabled(args):
        check_rpg_off(args)
        return
    for check in CHECKS:
        check(args)
    _check_with_core(args)


def _check_with_core(args: Any) -> None:
    import torch

    cfg = loss_config(args)
    logp = torch.zeros(1, 1)
    ref = None if get(args, "rpg.ref_update") == "rollout" else torch.zeros(1, 1)
    rollout = logp if cfg.rollout_correction.enabled else None
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
            rollout_logp=rollout,
        )
    except ValueError as e:
        raise _err(
            f"--rpg.loss {get(args, 'rpg.loss')} --rpg.style {get(args, 'rpg.style')} "
            f"(--rpg.weight_level {cfg.weight_level}, --rpg.clip_c {cfg.clip_c}): {e}"
        ) from e
