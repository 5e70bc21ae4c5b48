"""ZeRO-3 gathers: the one gathering loop of the glue, and complete multi-parameter gathers on CPU.

:func:`gather_full_state_dict` is used by the reference refresh (``actor.gather_state_dict``), the
CPU backend's object-store weight sync (``cpu.broadcast_state_dict_to_engines``) and the sync check.

:func:`use_complete_gathers` (seam ``zero3_gather``, CPU backend): DeepSpeed 0.19.6's
``Init._allgather_params_coalesced`` starts one asynchronous all-gather per parameter and waits for
the last one only (on CPU ``resolves_data_dependency()`` is true, so nothing synchronizes after).
NCCL runs them in order on one stream; gloo runs them on several threads, so an earlier parameter
can still be unwritten, or be written later over what the caller put there. Every multi-parameter
gather goes through it: transformers' ZeRO-3 loading (``GatheredParameters([weight, bias],
modifier_rank=0)`` per module), the re-gather of persistent parameters after each optimizer step,
EMA. Seen as NaN log-probs at the first training step of a two-rank ZeRO-3 run, about one wrong
parameter in 2,000 gathers on an idle machine (tests/test_zero_gather.py makes it deterministic).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CPU backend's worker hook resolves this module before torch is imported
    import torch


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_full_state_dict(
    module: torch.nn.Module, zero3: bool, keep: Callable[[torch.nn.Parameter], bool] | None = None
) -> dict[str, torch.Tensor] | None:
    """Every parameter (those ``keep`` accepts) as a CPU copy on rank 0; None on the other ranks.

    Under ZeRO-3 every rank must call (each gather is a collective). One parameter at a time: it
    bounds the extra memory to one full parameter, and it is right even where
    :func:`use_complete_gathers` is not applied (a multi-parameter gather on gloo can be incomplete).
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


def use_complete_gathers(module: ModuleType) -> None:
    """seam ``zero3_gather``: ``Init._allgather_params_coalesced`` one parameter at a time.

    With one parameter the only handle is the last one, which DeepSpeed waits for; gloo's wait
    returns when the all-gather has completed.
    """
    init_cls = module.Init
    original = init_cls._allgather_params_coalesced

    def _allgather_params_coalesced(
        self: Any, param_list: list, hierarchy: int = 0, quantize: bool = False
    ) -> None:
        for param in param_list:
            original(self, [param], hierarchy, quantize)

    init_cls._allgather_params_coalesced = _allgather_params_coalesced
