"""Stand-ins for ``flash_attn`` and ``vllm``, installed only when the real packages are absent.

OpenRLHF 0.11.2 imports ``flash_attn`` from everything under ``openrlhf.models`` and ``vllm`` from
everything under ``openrlhf.trainer.ray`` at import time, though on the non-packed CPU path neither
is called at run time (with the stand-in, generation goes through :mod:`rpg_openrlhf.cpu_backend.hf_rollout`). The
modules built here provide exactly the names OpenRLHF imports, implemented in plain torch, so
every OpenRLHF module imports. They are served by a finder appended to the *end* of
``sys.meta_path``: a real installed package is always found first, and a submodule not provided
here (``flash_attn.ops.triton.cross_entropy``, ``vllm.distributed...``) still raises ImportError,
so OpenRLHF's own fallbacks keep working.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import uuid
from types import ModuleType
from typing import Any

#: The version the vllm stand-in reports (OpenRLHF compares it with packaging.version).
VLLM_STANDIN_VERSION = "0.0.0+rpg.standin"


# --------------------------------------------------------------------------- flash_attn helpers
def rearrange(tensor: Any, pattern: str, **axes: int) -> Any:
    """``einops.rearrange`` (flash_attn.bert_padding re-exports it)."""
    import einops

    return einops.rearrange(tensor, pattern, **axes)


def index_first_axis(tensor: Any, indices: Any) -> Any:
    """Rows ``indices`` of ``tensor`` along its first axis (flash_attn.bert_padding)."""
    return tensor[indices]


def pad_input(hidden_states: Any, indices: Any, batch: int, seqlen: int) -> Any:
    """Scatter unpadded rows back into a zero ``[batch, seqlen, ...]`` tensor (flash_attn.bert_padding)."""
    import torch

    out = torch.zeros(
        batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype, device=hidden_states.device
    )
    out[indices] = hidden_states
    return out.view(batch, seqlen, *hidden_states.shape[1:])


def unpad_input(hidden_states: Any, attention_mask: Any, unused_mask: Any = None) -> tuple:
    """Drop padded positions (flash_attn >= 2.7 signature: returns 5 values).

    Returns (rows, indices, cu_seqlens, max_seqlen_in_batch, used_seqlens_in_batch).
    """
    import torch
    import torch.nn.functional as F

    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = index_first_axis(rearrange(hidden_states, "b s ... -> (b s) ..."), indices)
    return rows, indices, cu_seqlens, max_seqlen, used_seqlens


def all_gather(tensor: Any, process_group: Any = None) -> Any:
    """Concatenate ``tensor`` from every rank along dim 0 (flash_attn.utils.distributed)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(process_group)
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.contiguous(), group=process_group)
    return torch.cat(parts, dim=0)


# --------------------------------------------------------------------------------- vllm helpers
class SamplingParams:
    """The fields of ``vllm.SamplingParams`` that OpenRLHF sets and the HF rollout actor reads, with
    vLLM's defaults; any other keyword is kept as an attribute."""

    DEFAULTS: dict[str, Any] = {
        "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 16, "min_tokens": 0,
        "logprobs": None, "skip_special_tokens": True, "repetition_penalty": 1.0, "seed": None,
        "stop_token_ids": None, "ignore_eos": False,
    }  # fmt: skip

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update({**self.DEFAULTS, **kwargs})

    def __repr__(self) -> str:
        return f"SamplingParams({self.__dict__})"


class TokensPrompt(dict):
    """``vllm.inputs.TokensPrompt`` is a TypedDict: a dict with ``prompt_token_ids``."""


def random_uuid() -> str:
    """``vllm.utils.random_uuid``."""
    return uuid.uuid4().hex


def _module_contents() -> dict[str, dict[str, Any]]:
    """Name -> attributes of every stand-in module (packages get ``__path__``)."""
    return {
        "flash_attn": {"__path__": []},
        "flash_attn.bert_padding": {
            "rearrange": rearrange,
            "index_first_axis": index_first_axis,
            "pad_input": pad_input,
            "unpad_input": unpad_input,
        },
        "flash_attn.utils": {"__path__": []},
        "flash_attn.utils.distributed": {"all_gather": all_gather},
        "vllm": {"__path__": [], "__version__": VLLM_STANDIN_VERSION, "SamplingParams": SamplingParams},
        "vllm.inputs": {"TokensPrompt": TokensPrompt},
        "vllm.utils": {"random_uuid": random_uuid},
    }


class _StandInLoader(importlib.abc.Loader):
    def __init__(self, attrs: dict[str, Any]) -> None:
        self._attrs = attrs

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # default module creation

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__.update(self._attrs)
        module.__rpg_standin__ = True  # lets tests and logs tell a stand-in from the real package


class StandInFinder(importlib.abc.MetaPathFinder):
    """Serves the stand-in modules for the top-level packages in ``roots``."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots
        self._contents = _module_contents()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.roots or fullname not in self._contents:
            return None
        attrs = self._contents[fullname]
        return importlib.machinery.ModuleSpec(
            fullname, _StandInLoader(attrs), is_package="__path__" in attrs, origin="rpg-standin"
        )


def real_package_installed(name: str) -> bool:
    """True when the real ``name`` package (not a stand-in) can be imported in this process."""
    mod = sys.modules.get(name)
    if mod is not None:
        return not is_stand_in(mod)
    finders = [f for f in sys.meta_path if not isinstance(f, StandInFinder)]
    return any(
        getattr(f, "find_spec", None) is not None and f.find_spec(name, None) is not None for f in finders
    )


def provide_stand_ins(packages: tuple[str, ...] = ("flash_attn", "vllm")) -> list[str]:
    """Make ``packages`` importable, serving a stand-in for each one that is not installed.

    Idempotent. Returns the names now served by stand-ins (empty when all are installed).
    """
    missing = {name for name in packages if not real_package_installed(name)}
    for finder in sys.meta_path:
        if isinstance(finder, StandInFinder):
            finder.roots |= missing
            return sorted(finder.roots)
    if missing:
        sys.meta_path.append(StandInFinder(missing))
    return sorted(missing)


def is_stand_in(module: ModuleType) -> bool:
    """True when ``module`` was built here rather than by the real package."""
    # vars(), not getattr: lazy modules (transformers) import things on unknown attributes
    return bool(vars(module).get("__rpg_standin__", False))
