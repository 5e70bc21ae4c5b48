"""Entropy logging without an autograd graph, for RPG runs and baselines alike.

OpenRLHF 0.11.2 computes the token entropy in ``Actor.forward(return_entropy=True)`` whenever
``--actor.entropy_coef`` is not None, with ``openrlhf.models.utils.compute_entropy``: a softmax over
the whole vocabulary *with gradients*, so one training forward keeps [B, T, V] float32 tensors
for backward (about 5 GB per tensor at micro-batch 4, 2K tokens, vocab 151,936) even when the
coefficient is 0 and the entropy is only logged (RPG's default). With ``entropy_coef == 0`` the
entropy never reaches the loss, so its gradient is unused: :func:`enable` makes the policy actor
compute it detached, in row chunks (:func:`entropy_from_logits`). The logged value is the same;
the loss, gradients and update are unchanged. A coefficient != 0 keeps OpenRLHF's
differentiable entropy (it is optimized then); None computes none.

How it reaches the workers: :func:`enable` (driver) gives OpenRLHF's ``PolicyModelActor`` (stock or
RPG) the :class:`LoggedEntropyMixin`, whose ``init_model_from_pretrained`` replaces the
``compute_entropy`` name that ``openrlhf.models.actor`` (``Actor.forward``) calls, in that worker.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

#: Elements of one [rows, V] chunk (float32: 64 MiB): bounds the temporaries of the detached entropy.
CHUNK_ELEMENTS = 1 << 24


@torch.no_grad()
def entropy_from_logits(logits: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Token entropy H = logsumexp(z) - sum_v softmax(z)_v z_v over the last dim, without a graph.

    Same formula as OpenRLHF's ``compute_entropy``; computed under ``no_grad`` in chunks of
    ``chunk_elements // V`` rows, so the temporaries are a chunk, not [B, T, V].
    """
    shape, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.detach().reshape(-1, vocab)
    out = torch.empty(flat.shape[0], dtype=logits.dtype, device=logits.device)
    rows = max(1, chunk_elements // max(vocab, 1))
    for start in range(0, flat.shape[0], rows):
        z = flat[start : start + rows]
        lse = torch.logsumexp(z, dim=-1)
        out[start : start + rows] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return out.view(shape)


def logged_only(args: Any) -> bool:
    """Entropy is computed and logged but not optimized (``--actor.entropy_coef 0``)."""
    from rpg_openrlhf.common.args import get

    coef = get(args, "actor.entropy_coef")
    return coef is not None and float(coef) == 0.0


def use_detached_entropy(module: ModuleType) -> None:
    """The seam's ``compute_entropy`` patch: ``Actor.forward(return_entropy=True)`` in this process
    computes the detached entropy."""
    module.compute_entropy = entropy_from_logits


class LoggedEntropyMixin:
    """Policy actor mixin: with ``entropy_coef == 0`` the worker logs a detached entropy."""

    def init_model_from_pretrained(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        if logged_only(strategy.args):
            from rpg_openrlhf.common import seam
            from rpg_openrlhf.extras.patches import PATCHES

            seam.apply(PATCHES, "entropy-worker")
        return super().init_model_from_pretrained(strategy, *args, **kwargs)


def use_logged_entropy_actor(module: ModuleType) -> None:
    """The seam's ``logged_entropy_actor`` patch: the current ``PolicyModelActor`` (stock or RPG)
    with :class:`LoggedEntropyMixin` in front."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, LoggedEntropyMixin)


def enable(args: Any) -> bool:
    """Driver side, after the RPG classes are in place: the seam's ``entropy`` stage.

    A no-op (False) unless ``--actor.entropy_coef`` is 0. The same for stock and RPG actors.
    """
    if not logged_only(args):
        return False
    from rpg_openrlhf.common import seam
    from rpg_openrlhf.extras.patches import PATCHES

    seam.apply(PATCHES, "entropy")
    return True
