"""The reference refresh's transport (pi_ref <- pi_theta) and what it refuses.

Transport. The trainer puts the actor's full state dict into Ray's object store once and sends
every reference rank a one-element list holding the *reference* (``[ObjectRef]``): Ray resolves
top-level ``ObjectRef`` arguments into a full copy per actor process (8 x the model's size in
host memory at 8 ranks), but leaves nested ones alone. Only reference rank 0 fetches the
state; the other ranks get the weights from it through their own process group, parameter by
parameter: under ZeRO-3 with ``GatheredParameters(modifier_rank=0)`` (rank 0 writes the
gathered parameter, DeepSpeed re-partitions it to every rank on exit), otherwise with one
``broadcast`` per parameter from rank 0 (the reference engine is ZeRO-0 then: every rank holds
the full parameter). Host memory per refresh: one copy in the object store, one in rank 0.

Refused. With ``--ds.tensor_parallel_size > 1`` DeepSpeed AutoTP splits the reference's linear
layers across ranks; ``GatheredParameters`` only undoes ZeRO-3 partitioning, so each rank would
load rank 0's shard or a full tensor into a split layer. OpenRLHF's own weight sync gathers TP
shards with ``deepspeed.module_inject.layers.GatherReplacedLayerParams`` but has no inverse for
loading; ``rpg-train`` therefore refuses a refreshing ``--rpg.ref_update`` with TP before Ray
starts (:func:`validate`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled
from rpg_openrlhf.common.zero import rank_world

#: The ``--rpg.ref_update`` modes that copy the actor's weights into the reference model.
REFRESHING = ("every_k", "kl_threshold")


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming both flags for a reference refresh with DeepSpeed tensor parallelism."""
    if not rpg_enabled(args):
        return
    mode = _get(args, "rpg.ref_update")
    tp = _get(args, "ds.tensor_parallel_size", 1) or 1
    if mode in REFRESHING and tp > 1:
        raise ValueError(
            f"--rpg.ref_update {mode} cannot be combined with --ds.tensor_parallel_size {tp}: the refresh "
            "copies full actor weights into the reference model, whose layers DeepSpeed AutoTP splits "
            "across ranks (each rank would load rank 0's shard); use --ds.tensor_parallel_size 1 "
            "(ZeRO-3 shards the weights instead) or --rpg.ref_update initial/rollout"
        )


def send(group: Any, state_ref: Any, method_name: str = "rpg_load_state_dict") -> list:
    """Call ``method_name(state=[state_ref])`` on every actor of an OpenRLHF ``RayActorGroup``.

    The list keeps Ray from resolving the reference in every actor (see the module docstring).
    """
    return group.async_run_method(method_name=method_name, state=[state_ref])


def _fetch(state: Any) -> dict[str, torch.Tensor]:
    """The state dict from what :func:`send` delivered (``[ObjectRef]``); a plain dict is accepted."""
    if isinstance(state, list | tuple):
        import ray

        (item,) = state
        return ray.get(item) if isinstance(item, ray.ObjectRef) else item
    return state


def _agree(error: str | None) -> None:
    """Rank 0's verdict on the state reaches every rank before any collective copy (no hang)."""
    rank, world = rank_world()
    box = [error]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise ValueError(box[0] if rank == 0 else f"{box[0]} (reported by reference rank 0)")


@torch.no_grad()
def load_from_rank0(module: torch.nn.Module, zero3: bool, state: Any) -> dict[str, Any]:
    """Copy the state delivered to rank 0 into ``module``'s parameters on every rank.

    Every rank of the module's process group must call it (collective). ``state`` matters on
    rank 0 only. Returns ``{"params": n, "fetched": whether this rank fetched the state}``.
    """
    import deepspeed

    rank, world = rank_world()
    params = dict(module.named_parameters())
    full: dict[str, torch.Tensor] | None = None
    error = None
    if rank == 0:
        full = _fetch(state)
        missing = sorted(set(params) - set(full))
        if missing:
            error = f"state: missing parameters {missing[:5]}{'...' if len(missing) > 5 else ''}"
    _agree(error)
    for name, param in params.items():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=zero3):
            if rank == 0:
                param.data.copy_(full[name].to(param.device, param.dtype))
            if not zero3 and world > 1:
                dist.broadcast(param.data, src=0)
    return {"params": len(params), "fetched": full is not None}
