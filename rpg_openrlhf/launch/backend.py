"""Which backend a run uses (``--backend auto|cpu|gpu``), and why it never falls back to CPU silently.

``cpu``: the CPU backend, always. ``gpu``: OpenRLHF unchanged; without CUDA a run refuses with one line
naming the torch build (``torch 2.13.0+cpu: no CUDA``), a ``--dry-run`` still prints the GPU plan.
``auto`` (default): ``gpu`` when CUDA is visible; without it, a run that describes a GPU shape
(:func:`gpu_shape`: the actor or the engines on more than :data:`CPU_MAX_GPUS` GPUs; every paper config
asks for 8, and OpenRLHF's default ``--actor.num_gpus_per_node`` is 8) is treated as ``--backend gpu``,
any other goes to the CPU backend. Joining a cluster (``RAY_ADDRESS``), its resources decide instead of
the driver's CUDA (:mod:`rpg_openrlhf.launch.cluster`), the same shape rule applying to its answer.
"""

from __future__ import annotations

import os
from typing import Any

from rpg_openrlhf.common.args import get as _get

BACKENDS = ("auto", "cpu", "gpu")
#: More GPUs than this for the actor or for the engines: the run describes a GPU node, not a CPU one.
CPU_MAX_GPUS = 4


def gpu_shape(args: Any) -> str | None:
    """Why ``args`` describe a GPU shape (the flags and their product), or None."""
    actor = (_get(args, "actor.num_nodes") or 1) * (_get(args, "actor.num_gpus_per_node") or 1)
    if actor > CPU_MAX_GPUS:
        return (
            f"--actor.num_nodes {_get(args, 'actor.num_nodes') or 1} x --actor.num_gpus_per_node "
            f"{_get(args, 'actor.num_gpus_per_node')} = {actor} GPUs > {CPU_MAX_GPUS}"
        )
    engines = (_get(args, "vllm.num_engines") or 0) * (_get(args, "vllm.tensor_parallel_size") or 1)
    if engines > CPU_MAX_GPUS:
        return (
            f"--vllm.num_engines {_get(args, 'vllm.num_engines')} x --vllm.tensor_parallel_size "
            f"{_get(args, 'vllm.tensor_parallel_size') or 1} = {engines} GPUs > {CPU_MAX_GPUS}"
        )
    return None


def torch_build() -> str:
    """The installed torch and why it cannot run CUDA here, e.g. ``torch 2.13.0+cpu: no CUDA``."""
    import torch

    if not torch.version.cuda:
        return f"torch {torch.__version__}: no CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "no CUDA_VISIBLE_DEVICES"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}): no GPU visible ({where})"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_without_cuda(requested: str, why: str, dry_run: bool) -> tuple[str, str]:
    """A GPU run on a driver without CUDA: planned in a dry run, refused otherwise."""
    build = torch_build()
    if dry_run:
        return "gpu", f"{why} (a plan only: {build}, so the run itself would refuse on this machine)"
    hint = "activate the GPU environment (docs/training.md, 'Running on GPUs')"
    if requested == "auto":
        hint += " or pass --backend cpu to run this shape on the CPU backend"
    raise ValueError(f"{why}: {build}; {hint}")


def resolve_backend(
    requested: str, cluster_address: str | None = None, shape: str | None = None, dry_run: bool = False
) -> tuple[str, str]:
    """("cpu"|"gpu", reason) for ``--backend requested``; ``shape``: :func:`gpu_shape` of the run.

    Raises ValueError (one line naming the flag and the torch build) for a GPU run that cannot run.
    """
    if requested not in BACKENDS:
        raise ValueError(f"--backend: {requested!r} is not one of {BACKENDS}")
    if requested == "cpu":
        suffix = f" (joining RAY_ADDRESS={cluster_address})" if cluster_address else ""
        return "cpu", f"--backend cpu{suffix}"
    if cluster_address:
        from rpg_openrlhf.launch import cluster

        backend, reason = cluster.decide(requested, cluster.probe(cluster_address))
        if backend == "cpu" and shape:
            raise ValueError(f"{reason}, but the run describes a GPU shape ({shape}); pass --backend cpu")
        return backend, reason
    if _cuda_available():
        return "gpu", f"--backend {requested}" + (
            " -> gpu (CUDA is available)" if requested == "auto" else ""
        )
    if requested == "gpu":
        return _gpu_without_cuda(requested, "--backend gpu", dry_run)
    if shape:
        return _gpu_without_cuda(requested, f"--backend auto -> gpu (a GPU shape: {shape})", dry_run)
    return "cpu", "--backend auto -> cpu (torch.cuda.is_available() is False and no GPU shape)"
