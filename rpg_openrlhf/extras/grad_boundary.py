"""OpenRLHF's dynamic batching under DeepSpeed ZeRO-1/2: every micro-batch's gradient reaches the step.

With ``--train.dynamic_batch_enable`` OpenRLHF sets DeepSpeed's ``gradient_accumulation_steps`` to 1
and runs a step's micro-batches (their number varies) with one ``backward`` each, calling the optimizer
after the last (``ActorPPOTrainer.training_step``, ``replay_buffer.dynamic_optimizer_step``). For
DeepSpeed every backward is then an accumulation boundary, and ZeRO-1/2's epilogue at a boundary
restarts its gradient accumulator (``stage_1_and_2.py``, ``independent_gradient_partition_epilogue``):
the optimizer steps on the last micro-batch's gradient alone. Measured here with
``tests/test_e2e_ranks.py`` (ZeRO-2, 2 ranks, 4 micro-batches each): the reduced gradient pointed
along each rank's last micro-batch (cosine 0.73 / 0.999) and missed the step's objective by 87% of its
norm. ZeRO-3 counts its micro-steps itself and is not affected; neither is ZeRO-0.

:class:`GradBoundaryMixin` (the seam's stage ``grad-boundary``, stock and RPG runs, on whatever
``PolicyModelActor`` the run uses) tells DeepSpeed, before each micro-batch, whether it is the step's
last (``engine.set_gradient_accumulation_boundary``, DeepSpeed's API for exactly this), so the earlier
ones accumulate. allenai/open-instruct fixed the same in its own trainer (PR #1498).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from rpg_openrlhf.common.args import get as _get

AFFECTED_STAGES = (1, 2)


def needed(args: Any) -> bool:
    """Dynamic batching at ZeRO-1/2: the runs whose earlier micro-batches DeepSpeed would drop."""
    return bool(_get(args, "train.dynamic_batch_enable")) and _get(args, "ds.zero_stage") in AFFECTED_STAGES


def attach(trainer: Any) -> None:
    """Wrap ``trainer.training_step`` (an ``ActorPPOTrainer``) to mark the step's last micro-batch."""
    original = trainer.training_step

    def training_step(experience: Any, kl_ctl: float, step: int, loss_batch_info: Any = None) -> Any:
        last = bool(trainer.replay_buffer.dynamic_optimizer_step[step])
        trainer.actor.model.set_gradient_accumulation_boundary(last)  # the DeepSpeed engine
        return original(experience, kl_ctl, step, loss_batch_info)

    trainer.training_step = training_step


class GradBoundaryMixin:
    """Policy actor mixin: :func:`attach` on its trainer once the model is built."""

    def init_model_from_pretrained(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().init_model_from_pretrained(strategy, *args, **kwargs)
        if needed(strategy.args):
            attach(self.trainer)
        return result


def use_grad_boundary_actor(module: ModuleType) -> None:
    """The seam's ``grad_boundary_actor`` patch: the current ``PolicyModelActor`` (stock or RPG) with
    :class:`GradBoundaryMixin` in front."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, GradBoundaryMixin)
