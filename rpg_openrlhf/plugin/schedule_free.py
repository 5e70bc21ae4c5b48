"""Schedule-Free AdamW (``--rpg.optimizer schedulefree``) inside DeepSpeed ZeRO-1/2/3 (ZeRO-0 refused).

Schedule-Free keeps two points: the training point ``y`` (where gradients are taken) and the
averaged point ``x`` (what is evaluated, generated from and saved); ``z`` is its state. Its
``train()`` / ``eval()`` move the parameters between them in place::

    train(): p <- lerp(p, z, 1 - beta1)     (x -> y)
    eval():  p <- lerp(p, z, 1 - 1/beta1)   (y -> x)

DeepSpeed hands the optimizer its fp32 master partitions, not the model's parameters, which
breaks two things that upstream Schedule-Free assumes:

* **mode switch**: after ``train()`` / ``eval()`` on the master copy the model's bf16/fp16
  weights must be refreshed from it. ZeRO-1/2 (and DeepSpeed's bf16 optimizer) have
  ``update_lp_params``.
  ZeRO-3 keeps the optimizer's parameter lists *empty* outside ``step()``: :func:`set_mode` fills
  them (``_set_fp32_optimizer_param_groups``), switches, empties them again, copies each
  sub-group into the partitioned weights and re-gathers the persistent ones, as DeepSpeed's own
  ``step()`` does.
* **one step, one ``k``**: ZeRO-3 calls ``optimizer.step()`` once per sub-group, and every call
  advances ``k`` and ``weight_sum`` of *every* group (the warm-up ran 2x too fast with two groups).
  :class:`ZeroScheduleFree` ties its step scalars to the engine's optimizer-step counter: all calls
  within one engine step start from the same ``k``, so each optimizer step advances it once.

:func:`validate` refuses, before Ray starts, the combinations DeepSpeed cannot run with this client
optimizer, each error saying why.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rpg_openrlhf.common.args import get as _get

#: Per-group scalars that Schedule-Free's step() advances; restored before each call of one step.
STEP_SCALARS = ("k", "weight_sum", "lr_max", "scheduled_lr")


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flags for combinations Schedule-Free cannot run in."""
    if _get(args, "rpg.optimizer") != "schedulefree":
        return
    if _get(args, "ds.adam_offload"):
        raise ValueError(
            "--rpg.optimizer schedulefree cannot be combined with --ds.adam_offload (DeepSpeed's "
            "ZeRO-Offload only runs its own CPU Adam, not a client optimizer)"
        )
    if _get(args, "ds.zero_stage", 2) == 0:
        raise ValueError(
            "--rpg.optimizer schedulefree needs --ds.zero_stage 1, 2 or 3: at ZeRO-0 DeepSpeed wraps it in "
            "its fp16/bf16 optimizer, which steps it once at construction and cannot copy Schedule-Free's "
            "x/y switch into the weights"
        )
    if _get(args, "ds.enable_sleep") and _get(args, "ds.zero_stage", 2) == 3:
        raise ValueError(
            "--rpg.optimizer schedulefree cannot be combined with --ds.enable_sleep at --ds.zero_stage 3 "
            "(DeepSpeed's ZeRO-3 offload_states moves only its own FusedAdam's states; it fails in the "
            "actor after Ray has started): drop --ds.enable_sleep"
        )
    if _get(args, "ds.use_universal_ckpt"):
        raise ValueError(
            "--rpg.optimizer schedulefree cannot be combined with --ds.use_universal_ckpt (universal "
            "checkpoints carry Adam's exp_avg/exp_avg_sq, not Schedule-Free's z)"
        )


def _adamw_schedulefree() -> type:
    from schedulefree import AdamWScheduleFree

    return AdamWScheduleFree


@functools.cache
def zero_schedulefree_class() -> type:
    """:class:`ZeroScheduleFree`, built on first use (schedulefree is an optional package)."""

    class ZeroScheduleFree(_adamw_schedulefree()):  # type: ignore[misc]
        """AdamWScheduleFree whose step scalars advance once per optimizer step of the engine.

        ``bind_step_counter(f)``: ``f()`` returns the engine's optimizer-step count (constant during
        one step). Every ``step()`` call with the same count starts from the scalars the first call
        found, so a step split over sub-groups (ZeRO-3) or over groups (ZeRO-1/2, one group per call)
        is one Schedule-Free step. Unbound, it is upstream AdamWScheduleFree.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._rpg_step_counter: Callable[[], int] | None = None
            self._rpg_open_step: int | None = None
            self._rpg_step_start: dict[int, dict[str, Any]] = {}

        def bind_step_counter(self, counter: Callable[[], int]) -> None:
            self._rpg_step_counter = counter

        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            if self._rpg_step_counter is None:
                return super().step(closure)
            current = self._rpg_step_counter()
            if current != self._rpg_open_step:
                self._rpg_open_step, self._rpg_step_start = current, {}
            for group in self.param_groups:
                start = self._rpg_step_start.setdefault(id(group), {k: group[k] for k in STEP_SCALARS})
                group.update(start)
            return super().step(closure)

    return ZeroScheduleFree


@contextlib.contextmanager
def schedulefree_initialize(warmup_ratio: float, max_steps: int | None) -> Iterator[None]:
    """While active, ``deepspeed.initialize`` builds :class:`ZeroScheduleFree` from the AdamW section
    OpenRLHF put in the DeepSpeed config (lr, betas, eps, weight_decay), hands it to DeepSpeed as the
    client optimizer and binds it to the engine's step counter. Warm-up: ``ceil(warmup_ratio *
    max_steps)`` optimizer steps."""
    import deepspeed
    from openrlhf.utils.logging_utils import init_logger

    logger = init_logger(__name__)
    original = deepspeed.initialize

    def initialize(*args: Any, **kwargs: Any):
        config = dict(kwargs.get("config") or {})
        section = config.pop("optimizer", None)
        params = kwargs.get("model_parameters")
        if section is None or params is None or kwargs.get("optimizer") is not None:
            return original(*args, **kwargs)
        if section.get("type") != "AdamW":
            raise ValueError(
                f"--rpg.optimizer schedulefree: expected an AdamW config, got {section.get('type')}"
            )
        p = section["params"]
        warmup = math.ceil((max_steps or 0) * warmup_ratio)
        optimizer = zero_schedulefree_class()(
            params, lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"], weight_decay=p["weight_decay"],
            warmup_steps=warmup,
        )  # fmt: skip
        kwargs["optimizer"] = optimizer
        config["zero_allow_untested_optimizer"] = True
        kwargs["config"] = config
        logger.info(f"RPG: Schedule-Free AdamW (lr={p['lr']}, warmup_steps={warmup})")
        result = original(*args, **kwargs)
        engine = result[0]
        optimizer.bind_step_counter(lambda: engine.global_steps)
        return result

    deepspeed.initialize = initialize
    try:
        yield
    finally:
        deepspeed.initialize = original


def schedulefree_of(engine: Any) -> tuple[Any, Any]:
    """(DeepSpeed's optimizer wrapper, the Schedule-Free optimizer inside it or None)."""
    base = _adamw_schedulefree()
    opt = getattr(engine, "optimizer", None)
    for candidate in (opt, getattr(opt, "optimizer", None)):
        if isinstance(candidate, base):
            return opt, candidate
    return opt, None


@torch.no_grad()
def set_mode(engine: Any, mode: str) -> bool:
    """Switch Schedule-Free between ``train`` (y) and ``eval`` (x) and make the model's weights follow.

    Every rank must call it (ZeRO-1/2/3 all-gather). False when the engine's optimizer is not
    Schedule-Free.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    wrapper, sf = schedulefree_of(engine)
    if sf is None:
        return False
    if wrapper is sf:  # no DeepSpeed optimizer wrapper: the parameters are the model's
        getattr(sf, mode)()
    elif hasattr(wrapper, "_set_fp32_optimizer_param_groups"):  # ZeRO-3: what its step() does
        wrapper._partition_all_parameters()  # drop gathered copies, persistent ones included
        wrapper._set_fp32_optimizer_param_groups()  # the master partitions, only present in step()
        try:
            getattr(sf, mode)()
        finally:
            wrapper._clear_fp32_optimizer_param_groups()
        for sub_group_id in range(len(wrapper.fp16_groups)):
            wrapper._reassign_or_swap_out_partitioned_parameters(sub_group_id)
        if wrapper.persistent_parameters:  # small parameters live gathered: gather them anew
            wrapper.persistent_parameters[0].all_gather(wrapper.persistent_parameters)
        wrapper.invalidate_secondary_tensor()
    elif hasattr(wrapper, "update_lp_params"):  # ZeRO-1/2 (and DeepSpeed's BF16_Optimizer)
        getattr(sf, mode)()
        wrapper.update_lp_params()
    else:
        raise RuntimeError(
            f"--rpg.optimizer schedulefree: unsupported DeepSpeed optimizer {type(wrapper).__name__}"
        )
    return True
