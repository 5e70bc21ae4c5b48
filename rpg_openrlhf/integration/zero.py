"""Full weights out of a (possibly ZeRO-3 partitioned) model: the one gathering loop of the glue.

Used by the reference refresh (``actor.gather_state_dict``) and the CPU backend's object-store
weight sync (``cpu.broadcast_state_dict_to_engines``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_full_state_dict(
    module: torch.nn.Module, zero3: bool, keep: Callable[[torch.nn.Parameter], bool] | None = None
) -> dict[str, torch.Tensor] | None:
    """Every parameter (those ``keep`` accepts) as a CPU copy on rank 0; None on the other ranks.

    Under ZeRO-3 every rank must call (each gather is a collective). One parameter at a time:
    DeepSpeed 0.19.6 on CPU/gloo returns unfilled memory from a multi-parameter gather
    (tests/schedulefree_zero_worker.py), and it bounds the extra memory to one full parameter.
    """
    import deepspeed

    rank0 = _rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        if keep is not None and not keep(param):
            continue
        with deepspeed.zero.GatheredParameters([param], enabled=zero3):
            if rank0:
                out[name] = param.data.detach().to("cpu", copy=True)
    return out if rank0 else None
