"""Which Ray cluster a run uses, what its workers are told, and which backend the cluster needs.

* **Joining**: ``RAY_ADDRESS`` (set by hand or by ``ray job submit``) names an existing cluster.
  Without it the CPU backend starts its own local Ray (``address="local"``), so a cluster some
  other ``ray start`` left on the machine is never joined by accident; the GPU backend keeps
  OpenRLHF's behaviour (``ray.init()``, which also finds a cluster started on this node).
* **Environment**: workers of an existing cluster do not inherit the driver's environment, and
  OpenRLHF's ``ray.init`` forwards three variables only. Every ``RPG_*`` variable of the driver
  (``RPG_REWARD_GRADER`` above all: the reward function runs in the rollout actors) goes into the
  job's runtime environment, on both backends (:func:`forwarded_env`).
* **Backend of a joined cluster** (``--backend auto``): decided by the cluster, not by the
  driver's CUDA (:func:`probe`, :func:`decide`): no GPU resources -> cpu; GPUs with a detected
  accelerator type -> gpu; GPUs without one (logical GPUs, as the CPU backend uses them) -> a task
  holding one GPU reports whether it sees CUDA.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rpg_openrlhf.common.ray_python import worker_python
from rpg_openrlhf.common.sync_check import SYNC_CHECK_ENV

#: The variables OpenRLHF's own ``ray.init`` forwards, with its defaults (train_ppo_ray.train).
OPENRLHF_ENV_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}
#: Prefix of the driver variables every worker receives.
FORWARDED_PREFIX = "RPG_"
#: Seconds to wait for a GPU worker to answer the CUDA probe.
PROBE_TIMEOUT_S = 180


def address() -> str | None:
    """The cluster to join (``RAY_ADDRESS``), or None."""
    return os.environ.get("RAY_ADDRESS") or None


def forwarded_env() -> dict[str, str]:
    """The driver's ``RPG_*`` variables, for the runtime environment of every worker."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIX)}


@dataclass
class ClusterInfo:
    """What a running cluster offers (from :func:`probe`)."""

    address: str
    gpus: float
    accelerator_types: list[str] = field(default_factory=list)
    #: Whether a worker holding one GPU sees CUDA; None when not asked or no answer came.
    cuda_in_gpu_worker: bool | None = None


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def probe(cluster_address: str, timeout_s: float = PROBE_TIMEOUT_S) -> ClusterInfo:
    """Connect to the cluster, read its resources (and ask a GPU worker for CUDA when the resources
    cannot tell), disconnect. The driver's own CUDA plays no part."""
    import ray

    if ray.is_initialized():
        raise RuntimeError("cluster.probe: Ray is already initialized in this process")
    ray.init(address=cluster_address, logging_level="ERROR", log_to_driver=False)
    try:
        resources = ray.cluster_resources()
        prefix = "accelerator_type:"
        info = ClusterInfo(
            address=cluster_address,
            gpus=float(resources.get("GPU", 0)),
            accelerator_types=sorted(k[len(prefix) :] for k in resources if k.startswith(prefix)),
        )
        if info.gpus > 0 and not info.accelerator_types:
            ref = ray.remote(num_gpus=1, num_cpus=0)(_cuda_visible).remote()
            ready, _ = ray.wait([ref], timeout=timeout_s)
            if ready:
                info.cuda_in_gpu_worker = bool(ray.get(ref))
            else:
                ray.cancel(ref, force=True)
        return info
    finally:
        ray.shutdown()


def decide(requested: str, info: ClusterInfo) -> tuple[str, str]:
    """("cpu"|"gpu", reason) for ``--backend requested`` on the cluster ``info`` describes.

    Raises ValueError naming the flag when the cluster cannot run the request or cannot tell.
    """
    where = f"the Ray cluster at RAY_ADDRESS={info.address}"
    if requested == "cpu":
        return "cpu", f"--backend cpu ({where})"
    if requested == "gpu":
        if info.gpus <= 0:
            raise ValueError(f"--backend gpu: {where} offers no GPUs (use --backend cpu or auto)")
        return "gpu", f"--backend gpu ({where}: {info.gpus:g} GPUs)"
    if info.gpus <= 0:
        return "cpu", f"--backend auto -> cpu ({where} offers no GPUs)"
    if info.accelerator_types:
        return (
            "gpu",
            f"--backend auto -> gpu ({where}: {info.gpus:g} GPUs, {', '.join(info.accelerator_types)})",
        )
    if info.cuda_in_gpu_worker is None:
        raise ValueError(
            f"--backend auto: {where} has {info.gpus:g} GPUs of unknown type and no GPU worker "
            f"answered within {PROBE_TIMEOUT_S} s; pass --backend gpu or cpu"
        )
    if info.cuda_in_gpu_worker:
        return "gpu", f"--backend auto -> gpu ({where}: a worker holding one of its GPUs sees CUDA)"
    return "cpu", (
        f"--backend auto -> cpu ({where}: its {info.gpus:g} GPUs are logical, a worker holding one "
        "sees no CUDA)"
    )


def init_ray_gpu() -> None:
    """The GPU backend's Ray start: OpenRLHF's own ``ray.init`` plus the ``RPG_*`` variables.

    Called before OpenRLHF's ``train`` (which then skips its ``ray.init``); unchanged otherwise:
    the address comes from ``RAY_ADDRESS`` or a cluster started on this node, as with OpenRLHF. With
    ``RPG_SYNC_CHECK_DIR`` set, every worker also runs :func:`rpg_openrlhf.common.sync_check.worker_setup`
    (the seam's ``sync-check`` stage), the only change to the GPU path that variable makes.
    """
    import ray

    if ray.is_initialized():
        return
    env_vars: dict[str, Any] = {k: os.environ.get(k, v) for k, v in OPENRLHF_ENV_DEFAULTS.items()}
    env_vars.update(forwarded_env())
    runtime_env: dict[str, Any] = {"env_vars": env_vars, **worker_python()}
    if os.environ.get(SYNC_CHECK_ENV):  # debug/node check only: the engine-vs-actor record after each sync
        runtime_env["worker_process_setup_hook"] = "rpg_openrlhf.common.sync_check.worker_setup"
    ray.init(runtime_env=runtime_env)
