"""Every invalid ``--rpg.*`` combination, refused before Ray starts with one message naming the flags:
one function per concern, in the order of :func:`validate`; the first invalid setting raises
``ValueError("rpg-train: <message>")``. The loss's own settings are the core's rules (``LossConfig``,
``RolloutCorrection``, ``check_loss``), reported by :func:`check_loss_config` under the flags typed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rpg_openrlhf import core
from rpg_openrlhf.common.args import get, has
from rpg_openrlhf.plugin.flags import (
    CAPTURE_DIR,
    CORRECTION_FLAGS,
    ESTIMATOR,
    FIELD_FLAGS,
    LOSS,
    OLD_LOGP,
    RPG_DEFAULTS,
    STYLE,
    aggregation,
    enabled,
    eps,
    loss_config,
)


def _err(msg: str) -> ValueError:
    return ValueError(f"rpg-train: {msg}")


def check_rpg_off(args: Any) -> None:
    """Without --rpg.loss no --rpg.* loss flag may be set, and the ``rpg`` estimator is not available."""
    user_set = [
        k for k, d in RPG_DEFAULTS.items() if k != CAPTURE_DIR.name and has(args, k) and get(args, k) != d
    ]
    if user_set:
        raise _err(f"--{user_set[0]} has no effect without --rpg.loss (RPG is off)")
    if get(args, "algo.advantage.estimator") == ESTIMATOR:
        raise _err("--algo.advantage.estimator rpg requires --rpg.loss")


def _typed(args: Any, flag: str) -> str:
    """``--flag VALUE`` as the user typed it (a list: its items)."""
    value = get(args, flag)
    shown = (
        " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        if isinstance(value, list | tuple)
        else value
    )
    return f"--{flag} {shown}"


def check_loss_config(args: Any) -> None:
    """The loss's settings obey the core's rules: ``LossConfig`` (each declared value, the rollout
    correction and its weight level) and ``check_loss`` (the loss and style, the KL clamp). What the
    core refuses is reported under the flags of the fields it names."""
    try:
        core.check_loss(get(args, LOSS.name), get(args, STYLE.name, STYLE.default), loss_config(args))
    except core.SettingError as e:
        flags = list(dict.fromkeys(FIELD_FLAGS[f] for f in e.fields))  # in order, once (low/high: one flag)
        if len(flags) == 1 and ", got " in e.message:  # the message shows the value
            raise _err(f"--{flags[0]} {e.message}") from e
        raise _err(f"{' with '.join(_typed(args, f) for f in flags)}: {e.message}") from e
    except ValueError as e:  # "field: ..." of the loss's arguments (name, style), or naming its flag
        field, _, message = str(e).partition(": ")
        raise _err(
            f"{_typed(args, FIELD_FLAGS[field])}: {message}" if field in FIELD_FLAGS else str(e)
        ) from e


def check_numbers(args: Any) -> None:
    """OpenRLHF's dual clip and clip window (beta and the dual-clip bound: :func:`check_loss_config`)."""
    if get(args, "actor.dual_clip") is not None:
        raise _err("--actor.dual_clip is OpenRLHF's PPO dual clip; with --rpg.loss use --rpg.clip_c")
    low, high = eps(args)
    if not (0 <= low < 1 and high >= 0):
        raise _err(f"--actor.eps_clip_low_high must satisfy 0 <= low < 1 and high >= 0, got {low}, {high}")


def check_openrlhf_kl(args: Any) -> None:
    """OpenRLHF's own KL would apply a second KL: the RPG loss already contains it (a typed
    --algo.kl.init_coef: :func:`rpg_openrlhf.plugin.flags.check_typed_openrlhf`)."""
    if get(args, "algo.kl.use_loss"):
        raise _err(
            "--rpg.loss with --algo.kl.use_loss would apply the KL twice: the RPG loss already "
            "contains it (coefficient --rpg.beta); drop --algo.kl.use_loss"
        )
    if get(args, "algo.kl.target") is not None:
        raise _err(
            "--algo.kl.target (adaptive KL controller) cannot be combined with --rpg.loss; use --rpg.beta"
        )


def check_advantage(args: Any) -> None:
    """The ``rpg`` estimator: a group baseline over the n samples of a prompt, per sequence (a typed
    --algo.advantage.estimator: :func:`rpg_openrlhf.plugin.flags.check_typed_openrlhf`)."""
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
    nodes, gpus = get(args, "ref.num_nodes", 1), get(args, "ref.num_gpus_per_node", 1)
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


_LEVEL = f"--{CORRECTION_FLAGS['level']}"


def check_rollout_correction(args: Any) -> None:
    """What OpenRLHF's is_correction flags cannot be combined with in RPG (the threshold's form: the
    preflight's; the correction's own rules and the weight level's: the core's, :func:`check_loss_config`)."""
    level = get(args, CORRECTION_FLAGS["level"])
    if level not in (None, "off") and get(args, OLD_LOGP.name) == "engine":
        raise _err(
            f"--rpg.old_logp engine makes pi_old the engine's policy, so the correction weight pi_old/mu of "
            f"{_LEVEL} {level} is 1: drop {_LEVEL} (or use --rpg.old_logp actor)"
        )


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


def check_optimizer(args: Any) -> None:
    """--rpg.optimizer schedulefree and what it cannot be combined with."""
    if get(args, "rpg.optimizer") != "schedulefree":
        return
    if importlib.util.find_spec("schedulefree") is None:
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


#: The checks of an RPG run, in the order they are reported.
CHECKS = (
    check_loss_config,
    check_numbers,
    check_openrlhf_kl,
    check_advantage,
    check_reference,
    check_unsupported,
    check_rollout_correction,
    check_async,
    check_optimizer,
)


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flags for every invalid RPG combination (:data:`CHECKS`, or
    :func:`check_rpg_off` without --rpg.loss). Call before Ray starts. Does not change ``args``."""
    if not enabled(args):
        check_rpg_off(args)
        return
    for check in CHECKS:
        check(args)
