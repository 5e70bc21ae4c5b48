"""Engine side of the CPU weight sync: OpenRLHF's ``WorkerWrap`` with its CUDA bits replaced.

vLLM imports this module in every engine worker process (``worker_extension_cls``) before it loads the
model. :class:`CPUWorkerWrap` overrides ``WorkerWrap.init_process_group`` (PyNccl -> a gloo group) and
``update_weight`` (a CPU tensor upcast to the engine's dtype, then the layer packed again).
:func:`keep_plain_linear_weights`: vLLM's CPU GEMM packing drops each linear layer's plain weight
(``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so a later ``load_weights`` would fail
and ``reload_weights`` compute with stale packed weights; kept, ``load_weights`` writes it and
:meth:`CPUWorkerWrap.update_weight` repacks from it. (Declared in :mod:`rpg_openrlhf.cpu_backend.patches`.)
"""

from __future__ import annotations

from typing import Any

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

from rpg_openrlhf.common import seam
from rpg_openrlhf.cpu_backend.patches import PATCHES

#: vLLM's name of the sync group (``WorkerWrap`` keeps it on the worker).
SYNC_BACKEND = "gloo"


def keep_plain_linear_weights(_module: Any = None) -> None:
    """seam ``cpu_gemm``: make vLLM's CPU GEMM dispatch keep each linear layer's plain weight (idempotent).

    Replaces ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` (vLLM 0.29.0;
    ``UnquantizedLinearMethod.process_weights_after_loading`` imports it at call time) by a
    wrapper that always passes ``remove_weight=False``. Costs one plain copy of the weights.
    """
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "__rpg_keeps_weight__", False):
        return

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight.__rpg_keeps_weight__ = True  # type: ignore[attr-defined]
    dispatch_keeping_weight.__wrapped__ = original  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


def repack_linear_layers(model: torch.nn.Module, param_names: set[str]) -> int:
    """Pack again every CPU linear layer whose weight was just loaded; returns how many.

    ``param_names`` are vLLM's parameter names (what ``model.load_weights`` returns). A layer is
    found by identity of its weight, not only by name: a tied ``lm_head`` packs the embedding's
    weight, which is loaded under the embedding's name.
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    loaded = {id(p) for name, p in model.named_parameters() if name in param_names}
    count = 0
    for layer in model.modules():
        weight = getattr(layer, "weight", None)
        if hasattr(layer, "cpu_linear") and weight is not None and id(weight) in loaded:
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)  # its packed copy is stale
            count += 1
    return count


class CPUWorkerWrap(WorkerWrap):
    """OpenRLHF's ``WorkerWrap`` for vLLM's CPU worker: gloo instead of NCCL, CPU tensors."""

    def init_process_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = SYNC_BACKEND,
        use_ray: bool = False,
    ) -> None:
        """Join the trainer's weight-sync group (``WorkerWrap.init_process_group`` with gloo)."""
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        assert torch.distributed.is_initialized(), "default torch process group must be initialized"
        if use_ray:
            raise ValueError("--vllm.sync_with_ray: Ray collectives cannot reach vLLM's CPU engine process")
        rank = torch.distributed.get_rank() + rank_offset
        self._model_update_with_ray = False
        self._model_update_group = GlooBroadcastGroup(
            stateless_init_torch_distributed_process_group(
                master_address, master_port, rank, world_size, backend=SYNC_BACKEND
            )
        )
        print(
            f"init_process_group (gloo): {master_address}:{master_port} rank={rank} world_size={world_size}"
        )

    def update_weight(self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False) -> None:
        """Receive one parameter from the trainer's rank 0 and load it (``WorkerWrap.update_weight``).

        Upstream requires the trainer's dtype; the CPU engine computes in fp32 by default, so a
        bf16 / fp16 parameter is received as sent and upcast (exactly) before loading.
        """
        weight = torch.empty(shape, dtype=dtype)
        self._model_update_group.broadcast(weight, src=0)
        if dtype != self.model_config.dtype:
            weight = weight.to(self.model_config.dtype)
        model = self.model_runner.model
        loaded = model.load_weights(weights=[(name, weight)])
        repack_linear_layers(model, set(loaded or ()))
        del weight
        self._rpg_tensors = getattr(self, "_rpg_tensors", 0) + 1
        if empty_cache:  # upstream sets it on the last parameter of a sync
            self._rpg_syncs = getattr(self, "_rpg_syncs", 0) + 1
            print(f"[vLLM-CPU] weights updated: {self._rpg_tensors} tensors (sync {self._rpg_syncs})")
            self._rpg_tensors = 0


class GlooBroadcastGroup:
    """A gloo ``ProcessGroup`` with PyNccl's ``broadcast(tensor, src, stream)`` signature.

    A group from ``stateless_init_torch_distributed_process_group`` is not registered with
    ``torch.distributed`` (so ``dist.broadcast(..., group=pg)`` cannot be used): it is called
    directly, with group-local ranks.
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self.group.broadcast([tensor], opts).wait()


# must run before vLLM loads the model; this module is imported first (worker_extension_cls)
seam.apply(PATCHES, "vllm-engine")
