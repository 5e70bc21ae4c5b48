"""The CPU backend inside every Ray worker: the CUDA calls OpenRLHF makes become harmless.

Ray runs :func:`worker_setup` (the job's ``worker_process_setup_hook``) first in every worker
process, whatever actor class it hosts (OpenRLHF's or a subclass). It makes the CUDA calls OpenRLHF
makes harmless and patches the few places that name "cuda", each as its module gets imported: the
``cpu-worker`` stage of :mod:`rpg_openrlhf.cpu_backend.patches`, which lists each patch with why.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from rpg_openrlhf.common import patches as common_patches
from rpg_openrlhf.common import seam
from rpg_openrlhf.common.cliutil import quiet_known_warnings
from rpg_openrlhf.common.sync_check import SYNC_CHECK_ENV
from rpg_openrlhf.cpu_backend import settings
from rpg_openrlhf.cpu_backend.patches import PATCHES
from rpg_openrlhf.cpu_backend.standins import provide_stand_ins


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook`` of the CPU backend; runs first in every worker process.

    Idempotent. Cheap (milliseconds): it imports nothing heavy, not even torch; each patch
    waits until its module is imported (or applies at once when it already is).
    """
    from rpg_openrlhf.cpu_backend.driver import CPU_ENV_DEFAULTS

    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    quiet_known_warnings()  # bitsandbytes' optional CPU kernel: noise in every worker's log
    provide_stand_ins()
    seam.apply(PATCHES, "cpu-worker", lazy=True)  # lazily: torch costs seconds per idle worker
    if (
        os.environ.get(SYNC_CHECK_ENV) and settings.current().rollout == "vllm"
    ):  # HF actors have no prompt_logprobs
        seam.apply(common_patches.PATCHES, "sync-check", lazy=True)


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


def patch_torch_cuda(_module: ModuleType | None = None) -> None:
    """seam ``torch_cuda``: make the CUDA calls OpenRLHF makes harmless on a CPU-only torch.

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
