"""Complete multi-parameter ZeRO-3 gathers on CPU (seam ``zero3_gather``).

DeepSpeed 0.19.6's ``Init._allgather_params_coalesced`` starts one asynchronous all-gather per
parameter and waits for the last one only (on CPU ``resolves_data_dependency()`` is true, so
nothing synchronizes after). NCCL runs them in order on one stream; gloo runs them on several
threads, so an earlier parameter can still be unwritten, or be written later over what the caller
put there. Every multi-parameter gather goes through it: transformers' ZeRO-3 loading
(``GatheredParameters([weight, bias], modifier_rank=0)`` per module), the re-gather of persistent
parameters after each optimizer step, EMA. Seen as NaN log-probs at the first training step of a
two-rank ZeRO-3 run, about one wrong parameter in 2,000 gathers on an idle machine
(tests/test_zero_gather.py makes it deterministic).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


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
