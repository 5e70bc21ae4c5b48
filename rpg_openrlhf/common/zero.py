"""The one ZeRO-3 gathering loop: every parameter of a module, full, on rank 0.

Used by the plug-in's reference refresh (the actor's weights) and by the CPU backend (the object
store weight sync of its HF engines, the engine-vs-actor sync check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CPU backend's worker hook resolves this module before torch is imported
    import torch


def rank_world() -> tuple[int, int]:
    """(rank, world size) in the default process group; (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_full_state_dict(
    module: torch.nn.Module, zero3: bool, keep: Callable[[torch.nn.Parameter], bool] | None = None
) -> dict[str, torch.Tensor] | None:
    """Every parameter (those ``keep`` accepts) as a CPU copy on rank 0; None on the other ranks.

    Under ZeRO-3 every rank must call (each gather is a collective). One parameter at a time: it
    bounds the extra memory to one full parameter, and it is right even where the CPU backend's
    complete gathers are not applied (a multi-parameter gather on gloo can be incomplete).
    """
    import deepspeed

    rank0 = rank_world()[0] == 0
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        if keep is not None and not keep(param):
            continue
        with deepspeed.zero.GatheredParameters([param], enabled=zero3):
            if rank0:
                out[name] = param.data.detach().to("cpu", copy=True)
    return out if rank0 else None
