"""Debug dumps of the actor's training steps, for tests that check the pipeline from outside.

Off unless ``RPG_STEP_DUMP_DIR`` is set in the workers' environment (the CPU backend and
``RAY_ADDRESS`` runs forward ``RPG_*`` variables). Then, in every actor rank:

* ``mb_rank{r}_{i:05d}.pt``: each micro-batch's experience as the training step receives it (token
  ids, attention and action masks, old / reference / engine log-probs, advantages, the loss normalizers:
  with ``--train.dynamic_batch_enable`` those ``training_step`` reads from the replay buffer)
  and the index of the optimizer step it belongs to;
* ``grad_step{s}.pt`` (rank 0) for each ``s`` of ``RPG_STEP_DUMP_GRAD_STEP=s[,s...]``: right before
  optimizer step ``s`` (1-based) every parameter of the actor and its full gradient after DeepSpeed's reduction
  across ranks, i.e. what the optimizer receives (ZeRO-3: gathered one parameter at a time);
* with ``RPG_HOLD_AT=optimizer_step:N`` (``extras.hold``), the rank stops for good right before its N-th
  optimizer step, in the middle of a training step (tests kill the run there);
* ``events_rank{r}.jsonl``: a ``start`` event with the rank's Ray resources and placement group,
  ``offload`` / ``reload`` of the DeepSpeed states (``--ds.enable_sleep``) with the optimizer's
  offloaded state types, a ``train`` event per micro-batch and, after it, a ``boundary`` event: whether
  DeepSpeed took it as a gradient accumulation boundary (only a step's last one, with dynamic batching
  at ZeRO-1/2: ``extras.grad_boundary``).

It only observes: nothing it does changes what the step computes (the seam's ``step_dump`` entry).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from rpg_openrlhf.common.zero import rank_world
from rpg_openrlhf.extras import hold

ENV_DIR = "RPG_STEP_DUMP_DIR"
ENV_GRAD_STEP = "RPG_STEP_DUMP_GRAD_STEP"


def _save(obj: Any, path: str) -> None:
    from rpg_openrlhf.common.atomic import atomic_write

    with atomic_write(path, "wb") as f:
        torch.save(obj, f)


def _cpu(x: Any) -> Any:
    return x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x


def _event(root: str, kind: str, **fields: Any) -> None:
    with open(os.path.join(root, f"events_rank{rank_world()[0]}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")


def _offloaded(engine: Any) -> list[str]:
    states = getattr(getattr(engine, "optimizer", None), "offloaded_states", None) or ()
    return sorted(str(getattr(s, "value", s)) for s in states)


def _patch_sleep(root: str, engine: Any) -> None:
    """Record the DeepSpeed optimizer's ``offload_states`` / ``reload_states`` (``--ds.enable_sleep``:
    OpenRLHF's ``offload_deepspeed_states`` / ``reload_deepspeed_states`` end there), on the instance."""
    optimizer = getattr(engine, "optimizer", None)
    for name, kind in (("offload_states", "offload"), ("reload_states", "reload")):
        original = getattr(optimizer, name, None)
        if original is None or getattr(original, "_rpg_step_dump", False):
            continue

        def wrapped(*args, _original=original, _kind=kind, **kwargs):
            result = _original(*args, **kwargs)
            _event(root, _kind, offloaded=_offloaded(engine))
            return result

        wrapped._rpg_step_dump = True
        setattr(optimizer, name, wrapped)


def _dump_grads(root: str, engine: Any, step: int) -> None:
    """Every parameter and its full (reduced) gradient; every rank calls (ZeRO-3 collectives)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    zero3 = engine.zero_optimization_stage() == 3
    params, grads = {}, {}
    for name, param in engine.module.named_parameters():
        # one parameter per gather (its gradient is read per parameter too; see cpu_backend.zero_gathers on gloo)
        with deepspeed.zero.GatheredParameters([param], enabled=zero3):
            value = _cpu(param.data)
        grad = safe_get_full_grad(param)
        params[name], grads[name] = value, None if grad is None else grad.detach().float().cpu()
    if rank_world()[0] == 0:
        _save(
            {"optimizer_step": step, "params": params, "grads": grads},
            os.path.join(root, f"grad_step{step}.pt"),
        )


def _assigned_resources() -> dict[str, Any]:
    """This actor's Ray resources and placement group (colocated actors hold GPU fractions)."""
    import ray

    ctx = ray.get_runtime_context()
    return {"assigned": ctx.get_assigned_resources(), "placement_group": ctx.get_placement_group_id()}


def attach(trainer: Any) -> None:
    """Wrap ``trainer.training_step`` and its strategy's ``optimizer_step`` (instance attributes)."""
    root = os.environ.get(ENV_DIR)
    if not root:
        return
    os.makedirs(root, exist_ok=True)
    grad_steps = {int(s) for s in (os.environ.get(ENV_GRAD_STEP) or "").split(",") if s.strip()}
    _patch_sleep(root, trainer.actor.model)
    _event(root, "start", resources=_assigned_resources())
    counters = {"micro": 0, "optimizer": 0}
    training_step, optimizer_step = trainer.training_step, trainer.strategy.optimizer_step

    def dumped_training_step(experience, kl_ctl, step, loss_batch_info=None):
        if loss_batch_info is None and trainer.args.train.dynamic_batch_enable:
            # what training_step will compute: the step's totals, read from the replay buffer
            from openrlhf.utils.loss_utils import get_loss_batch_info

            loss_batch_info = get_loss_batch_info(
                trainer.strategy, experience.action_mask, replay_buffer=trainer.replay_buffer, step=step,
                dynamic_batch=True,
            )  # fmt: skip
        record = {
            "rank": rank_world()[0],
            "optimizer_step": counters["optimizer"] + 1,
            "sequences": _cpu(experience.sequences),
            "attention_mask": _cpu(experience.attention_mask),
            "action_mask": _cpu(experience.action_mask),
            "old_logp": _cpu(experience.action_log_probs),
            "ref_logp": _cpu(experience.base_action_log_probs),
            "rollout_logp": _cpu(experience.rollout_log_probs),
            "advantages": _cpu(experience.advantages),
            "loss_batch_info": {k: _cpu(v) for k, v in (loss_batch_info or {}).items()},
            "dynamic_batch": bool(trainer.args.train.dynamic_batch_enable),
        }
        _save(record, os.path.join(root, f"mb_rank{rank_world()[0]}_{counters['micro']:05d}.pt"))
        counters["micro"] += 1
        _event(root, "train", optimizer_step=record["optimizer_step"])
        result = training_step(experience, kl_ctl, step, None if record["dynamic_batch"] else loss_batch_info)
        # whether DeepSpeed treated the micro-batch as an accumulation boundary (extras.grad_boundary)
        boundary = trainer.actor.model.is_gradient_accumulation_boundary()
        _event(root, "boundary", optimizer_step=record["optimizer_step"], boundary=bool(boundary))
        return result

    def dumped_optimizer_step(optimizer, model, scheduler, name="model", **kwargs):
        engine = getattr(model, "model", model)  # an openrlhf Actor holds the DeepSpeed engine
        if name == "actor" and engine.is_gradient_accumulation_boundary():
            counters["optimizer"] += 1
            if counters["optimizer"] in grad_steps:
                _dump_grads(root, engine, counters["optimizer"])
            hold.hold("optimizer_step", counters["optimizer"])  # debug: RPG_HOLD_AT=optimizer_step:N
        return optimizer_step(optimizer, model, scheduler, name=name, **kwargs)

    trainer.training_step = dumped_training_step
    trainer.strategy.optimizer_step = dumped_optimizer_step
