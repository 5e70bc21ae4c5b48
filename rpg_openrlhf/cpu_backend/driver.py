"""The CPU backend in the driver: arguments CPU cannot run, and a Ray of logical GPUs.

:func:`prepare_args` adjusts (and logs) what has a CPU equivalent (flash-attention -> sdpa, no
vLLM sleep mode, gloo for the weight sync) and refuses what has none, naming the flag.
:func:`start` then starts a local Ray of the run's own (or joins ``RAY_ADDRESS``) with *logical*
GPUs, so OpenRLHF's ``num_gpus=1`` actors and GPU placement groups schedule, with the worker hook
(:func:`rpg_openrlhf.cpu_backend.worker.worker_setup`) in every worker's runtime environment, and
swaps vLLM engine creation for the CPU engines (seam stage ``cpu-driver``).
"""

from __future__ import annotations

import os
from typing import Any

from rpg_openrlhf.common import seam
from rpg_openrlhf.common.ray_python import worker_python
from rpg_openrlhf.cpu_backend import engines, settings
from rpg_openrlhf.cpu_backend.patches import PATCHES
from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

#: Import path of the worker hook (Ray imports it by name inside each worker).
WORKER_SETUP_HOOK = "rpg_openrlhf.cpu_backend.worker.worker_setup"

#: Environment every process of a CPU run needs; a value the user set wins.
CPU_ENV_DEFAULTS: dict[str, str] = {
    "DS_ACCELERATOR": "cpu",  # DeepSpeed's CPU accelerator: gloo, CPU fused Adam
    "DS_BUILD_OPS": "0",  # never pre-build CUDA ops
    "TOKENIZERS_PARALLELISM": "false",  # few cores, many processes
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",  # what OpenRLHF's own ray.init sets
    "NCCL_DEBUG": "WARN",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM engine (vLLM's default: 4)
    # torch.compile'd helpers (vLLM's CPU sampler, OpenRLHF's entropy) run eagerly, the same math:
    # compiling costs seconds in every engine start, and minutes of C++ on a cold inductor cache.
    "TORCH_COMPILE_DISABLE": "1",
}
#: Ray's system config for the local node this driver starts (a ``RAY_<name>`` the user set wins). Ray nices
#: its workers to 15; on CPU they do all of the run's work and, niced, starve beside any default-priority
#: process. Nor are idle workers prestarted for the driver (about 1 CPU-s each, for tasks never submitted).
RAY_NODE_DEFAULTS: dict[str, int | bool] = {"worker_niceness": 0, "prestart_worker_first_driver": False}
#: Driver variables passed on to the workers as they are (a joined cluster's workers lack them).
PASSED_ON = (
    "TORCH_EXTENSIONS_DIR",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "WANDB_MODE",
    "HF_HOME",
    "VLLM_CPU_OMP_THREADS_BIND",
)
#: Every driver variable with this prefix reaches the workers too (the project's switches: the
#: rollout settings, RPG_SYNC_CHECK_DIR, a caller's RPG_* variables).
PASSED_ON_PREFIX = "RPG_"
LOG_PREFIX = "[cpu-backend]"


def _log(message: str) -> None:
    print(f"{LOG_PREFIX} {message}")  # the driver's messages go to stdout like OpenRLHF's own


def cpu_env(run_settings: settings.Settings | None = None) -> dict[str, str]:
    """The environment variables passed to Ray workers (defaults plus the user's values)."""
    env = {k: os.environ.get(k, v) for k, v in CPU_ENV_DEFAULTS.items()}
    env.update({k: v for k, v in os.environ.items() if k.startswith(PASSED_ON_PREFIX)})
    env.update({k: os.environ[k] for k in PASSED_ON if k in os.environ})
    env.update(settings.worker_env(run_settings or settings.current()))
    import torch

    if torch.cuda.is_available():
        # a CPU run on a GPU machine: hide the GPUs from every worker (Ray would otherwise set
        # CUDA_VISIBLE_DEVICES to the logical GPU ids it assigns).
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    return env


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


def _refuse_unsupported(args: Any) -> None:
    # --ds.packing_samples (and dynamic batching, which turns it on) runs: OpenRLHF unpads with
    # flash_attn.bert_padding helpers (the stand-ins) and gives the model position ids that restart
    # at 0 for every sequence and no attention mask; transformers' sdpa/eager masks then keep each
    # sequence to itself (masking_utils.find_packed_sequence_indices), as flash-attn's varlen kernel
    # does on a GPU (tests/test_packing_cpu.py). Ring attention needs ring-flash-attn: refused.
    if args.ds.ring_attn_size > 1 or args.ds.tensor_parallel_size > 1:
        raise ValueError("--ds.ring_attn_size / --ds.tensor_parallel_size > 1 are not supported on CPU")
    if getattr(args.data, "max_images_per_prompt", 0) > 0:
        raise ValueError("--data.max_images_per_prompt > 0 (VLM) is not supported by the CPU backend")


def _adjust_vllm(args: Any) -> list[str]:
    notes = []
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
    return notes


def prepare_args(args: Any) -> list[str]:
    """Adjust arguments that cannot work on CPU; returns the log lines describing each change.

    Raises ValueError naming the flag for settings the CPU backend cannot run.
    """
    notes = []
    attn = args.ds.attn_implementation
    if "flash_attention" in attn or "flash-attn" in attn:  # also vllm-flash-attn
        args.ds.attn_implementation = "sdpa"
        notes.append(f"--ds.attn_implementation {attn} -> sdpa (flash-attn needs a GPU)")
    engine = settings.from_env().rollout
    if not args.vllm.num_engines:
        args.vllm.num_engines = 1
        notes.append(f"--vllm.num_engines unset -> 1 (rollouts need an engine; {engine} on CPU)")
    if engine == "vllm":
        notes += _adjust_vllm(args)
    _refuse_unsupported(args)
    return notes


def rebind(namespace: dict[str, Any]) -> None:
    """Point ``create_vllm_engines`` in a module namespace (train_ppo_ray's) at the CPU creator."""
    if "create_vllm_engines" in namespace:
        namespace["create_vllm_engines"] = engines.engine_creator()


def start(args: Any, main_globals: dict[str, Any] | None = None) -> settings.Settings:
    """Driver side of the CPU backend; call after argument checks, before OpenRLHF's ``train``.

    Decides the run's settings (rollout engine, engine dtype, ``--cpu.trust_remote_code``), swaps
    vLLM engine creation for the CPU engines in OpenRLHF's modules and in ``main_globals``, and
    starts a local Ray of its own (unless Ray is already running, or RAY_ADDRESS names a cluster to
    join) with logical GPUs, the worker hook and the run's environment. Returns the settings.
    """
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    cpu = getattr(args, "cpu", None)
    run = settings.use(trust_remote_code=bool(getattr(cpu, "trust_remote_code", False)))
    os.environ.update(settings.worker_env(run))  # processes this driver starts follow it too
    provide_stand_ins()
    seam.apply(PATCHES, "cpu-driver", lazy=True)
    if main_globals is not None:
        rebind(main_globals)
    _log(f"rollout engine {run.rollout}, {run.dtype} ({settings.ROLLOUT_ENV}=hf|vllm chooses)")
    _start_ray(
        args, {"env_vars": cpu_env(run), "worker_process_setup_hook": WORKER_SETUP_HOOK, **worker_python()}
    )
    return run


#: Starts of the local Ray before giving up (``ray.init`` allows its raylet a hard-coded 30 s to register).
STARTS = 3


def _start_ray(args: Any, runtime_env: dict[str, Any]) -> None:
    import ray

    if ray.is_initialized():
        _log("Ray already initialized; it must offer logical GPUs and the worker hook")
        return
    if os.environ.get("RAY_ADDRESS"):
        _log(
            f"joining the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} "
            f"(workers get {sorted(runtime_env['env_vars'])})"
        )
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
        return
    num_gpus = logical_gpus_needed(args)
    # Logical CPUs too: every OpenRLHF actor reserves one CPU; real threads follow OMP_NUM_THREADS.
    num_cpus = max(os.cpu_count() or 1, num_gpus + args.vllm.num_engines + 2)
    _log(f"starting Ray with {num_gpus} logical GPU(s), {num_cpus} logical CPU(s)")
    # The dashboard's processes cost seconds of start-up and CPU on a small machine: opt-in.
    dashboard = os.environ.get("RPG_RAY_DASHBOARD", "0") == "1"
    # address="local": a new instance of our own, never a cluster another `ray start` left on this
    # machine (plain ray.init() would join the one named in /tmp/ray/ray_current_cluster).
    system_config = {k: v for k, v in RAY_NODE_DEFAULTS.items() if f"RAY_{k}" not in os.environ}
    for attempt in range(1, STARTS + 1):
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                runtime_env=runtime_env,
                include_dashboard=dashboard,
                _system_config=system_config,
            )
            return
        except Exception as exc:  # Ray waits a fixed 30 s for its raylet: a loaded machine can need more
            if "timed out during startup" not in str(exc) or attempt == STARTS:
                raise
            _log(
                f"Ray's node did not come up in its 30 s (a loaded machine); starting it again ({attempt + 1}/{STARTS})"
            )
            ray.shutdown()
