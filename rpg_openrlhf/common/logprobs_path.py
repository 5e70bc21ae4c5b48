"""The chunked log-prob path: OpenRLHF's ``Actor.forward`` without the ``[N, V]`` logits.

OpenRLHF 0.11.2's ``Actor.forward`` (``openrlhf/models/actor.py``) runs the whole model, casts the
``[B, T, V]`` logits to fp32, divides them by the temperature and takes the log-softmax of every
position, prompt and padding included; in training the fp32 logits and their gradients live through
the backward (``launch/memory_terms.py``: 10 N V bytes). With ``--logprobs.chunked`` the policy's
training forward, its no-grad old-log-prob forward and the reference model's forward run the
transformer body as before, but the LM head is applied only to the response tokens under the action
mask, a chunk of tokens at a time, by :func:`rpg_openrlhf.core.logprobs.chunked_logprobs` (same
operations in the same order; the backward recomputes each chunk). The returned log-probs, the
entropy OpenRLHF logs and the gradients are the same to fp32 rounding (tests/test_logprobs_path.py).

How: for one call of ``Actor.forward`` the LM head module's ``forward`` is swapped (an instance
attribute) for a function that takes the final hidden states, selects the action positions and returns
their log-probs scattered into a ``[B, T]`` tensor, which the Hugging Face model returns as its
"logits". The head is still called through ``Module.__call__``, so ZeRO-3's hooks gather its weight
once for the forward and once for the backward (not per chunk), tied embeddings share the gradient,
and the CPU backend runs it unchanged.

Flags: :func:`add_arguments` (``rpg-train`` and ``python -m rpg_openrlhf.cpu_backend``); what the path
does not support: :func:`unsupported`. A call that asks for the logits themselves, a vision-language
model or an LM head that is not a plain ``nn.Linear`` (LoRA on the head) takes OpenRLHF's forward.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rpg_openrlhf.common.args import get, set_value

if TYPE_CHECKING:
    import torch

MODE_KEY = "logprobs.mode"
BUDGET_KEY = "logprobs.chunk_mib"
DEFAULT_CHUNK_MIB = 256
#: The chunk budget in the workers (set by the mixin before the model is built).
_STATE: dict[str, Any] = {"budget_bytes": DEFAULT_CHUNK_MIB * 2**20, "original": None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--logprobs.chunked`` / ``--logprobs.full`` / ``--logprobs.chunk_mib``."""
    group = parser.add_argument_group("log-probs path (OpenRLHF's Actor.forward)")
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--logprobs.chunked",
        dest=MODE_KEY,
        action="store_const",
        const="chunked",
        default=None,
        help="log-probs of the response tokens only, the LM head applied in chunks without the [N, V] "
        "logits (same values; default for RPG runs)",
    )
    which.add_argument(
        "--logprobs.full",
        dest=MODE_KEY,
        action="store_const",
        const="full",
        help="OpenRLHF's Actor.forward exactly: full fp32 logits (default for stock runs)",
    )
    group.add_argument(
        "--logprobs.chunk_mib",
        dest=BUDGET_KEY,
        type=int,
        default=DEFAULT_CHUNK_MIB,
        help=f"byte budget (MiB) of one chunk's logits temporaries (default {DEFAULT_CHUNK_MIB})",
    )


def unsupported(args: Any) -> str | None:
    """Why the chunked path cannot run with these arguments (None: it can)."""
    if int(get(args, "ds.ring_attn_size", 1) or 1) > 1:
        return "ring attention (--ds.ring_attn_size > 1) is not supported by the chunked path"
    if int(get(args, "ds.tensor_parallel_size", 1) or 1) > 1:
        return "DeepSpeed tensor parallelism (--ds.tensor_parallel_size > 1) is not supported by the chunked path"
    if get(args, "ds.use_liger_kernel", False):
        return "Liger kernels (--ds.use_liger_kernel) are not supported by the chunked path"
    coef = get(args, "actor.entropy_coef")
    if coef is not None and float(coef) != 0.0:
        return "a differentiable entropy (--actor.entropy_coef != 0) needs the full logits"
    return None


def mode_of(args: Any, rpg_run: bool) -> tuple[str, str]:
    """(mode, a note saying why) for these arguments, without changing them. Explicit
    ``--logprobs.chunked`` with an unsupported setting, or a budget below 1 MiB, is a ValueError."""
    mode = get(args, MODE_KEY)
    budget = get(args, BUDGET_KEY, DEFAULT_CHUNK_MIB)
    if budget is None or int(budget) < 1:
        raise ValueError(f"--logprobs.chunk_mib must be >= 1, got {budget}")
    reason = unsupported(args)
    if mode == "chunked" and reason:
        raise ValueError(f"--logprobs.chunked: {reason}; use --logprobs.full")
    if mode is not None:
        return mode, f"log-probs: --logprobs.{mode}"
    if not rpg_run:
        return "full", "log-probs: OpenRLHF's full-logits path (stock run; --logprobs.chunked to change)"
    if reason:
        return "full", f"log-probs: OpenRLHF's full-logits path ({reason})"
    return "chunked", "log-probs: chunked path (RPG run; --logprobs.full for OpenRLHF's)"


def resolve(args: Any, rpg_run: bool) -> tuple[str, str]:
    """:func:`mode_of`, written back to ``args`` (the workers read it)."""
    mode, note = mode_of(args, rpg_run)
    set_value(args, MODE_KEY, mode)
    set_value(args, BUDGET_KEY, int(get(args, BUDGET_KEY, DEFAULT_CHUNK_MIB)))
    return mode, note


def enable(args: Any) -> bool:
    """Driver, after :func:`resolve` and after the RPG classes are in place: the seam's ``logprobs``
    stage when the path is chunked (the policy and reference actor classes get the mixin)."""
    if get(args, MODE_KEY) != "chunked":
        return False
    from rpg_openrlhf.common import seam
    from rpg_openrlhf.common.patches import PATCHES

    seam.apply(PATCHES, "logprobs")
    return True


# ----------------------------------------------------------------------------- driver: actor classes
class ChunkedLogprobsMixin:
    """Policy / reference actor mixin: the worker's ``Actor.forward`` takes the chunked path."""

    def init_model_from_pretrained(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        if get(strategy.args, MODE_KEY) == "chunked":
            from rpg_openrlhf.common import seam
            from rpg_openrlhf.common.patches import PATCHES

            _STATE["budget_bytes"] = int(get(strategy.args, BUDGET_KEY, DEFAULT_CHUNK_MIB)) * 2**20
            seam.apply(PATCHES, "logprobs-worker")
            print(f"[logprobs] {type(self).__name__}: chunked log-prob path", flush=True)  # in the run's log
        return super().init_model_from_pretrained(strategy, *args, **kwargs)


def _prepend(module: ModuleType, name: str) -> None:
    """``module.<name>`` (a Ray actor class) becomes the mixin + its current class (once)."""
    import ray

    cls = getattr(module, name).__ray_actor_class__
    if not issubclass(cls, ChunkedLogprobsMixin):
        wrapped = type(cls.__name__, (ChunkedLogprobsMixin, cls), {"__doc__": cls.__doc__})
        setattr(module, name, ray.remote(num_gpus=1)(wrapped))


def use_chunked_policy_actor(module: ModuleType) -> None:
    """seam ``chunked_logprobs_actors`` (policy): the current ``PolicyModelActor`` with the mixin."""
    _prepend(module, "PolicyModelActor")


def use_chunked_reference_actor(module: ModuleType) -> None:
    """seam ``chunked_logprobs_actors`` (reference): the current ``ReferenceModelActor`` with the mixin."""
    _prepend(module, "ReferenceModelActor")


# ----------------------------------------------------------------------------- worker: Actor.forward
def use_chunked_forward(module: ModuleType) -> None:
    """seam ``chunked_logprobs_forward``: ``openrlhf.models.actor.Actor.forward`` takes the chunked
    path (the original kept for what it does not cover)."""
    if _STATE["original"] is None:
        _STATE["original"] = module.Actor.forward
    module.Actor.forward = chunked_forward


def _head(actor: Any) -> Any:
    """The Hugging Face model's LM head if the chunked path covers it (a plain Linear), else None."""
    import torch

    model = actor.model
    hf = getattr(model, "module", model)  # a DeepSpeed engine holds the model in .module
    if getattr(hf.config, "final_logit_softcapping", None):
        return None
    head = hf.get_output_embeddings()
    return head if type(head) is torch.nn.Linear else None


def action_rows(
    batch: int, seqlen: int, action_mask: torch.Tensor, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, dest): the positions whose log-prob is used, as rows of the model's flattened output
    (``indices``: the packed layout's flat positions, from ``unpad_and_slice_tensor``) and as flat
    positions of the padded ``[B, T]`` layout. Position t predicts token t+1; the action tokens are
    the last ``A = action_mask.shape[1]`` of ``T``, so their predictors are t = T-1-A .. T-2."""
    import torch

    actions = action_mask.shape[1]
    used = torch.zeros(batch, seqlen, dtype=torch.bool, device=action_mask.device)
    used[:, seqlen - 1 - actions : seqlen - 1] = action_mask.bool()
    used = used.reshape(-1)
    if indices is None:
        rows = used.nonzero()[:, 0]
        return rows, rows
    rows = used[indices].nonzero()[:, 0]
    return rows, indices[rows]


@contextlib.contextmanager
def _head_forward_swapped(head: Any, forward: Any) -> Iterator[None]:
    """``head.forward`` is ``forward`` for the block (an instance attribute; what was there before,
    if anything, is put back), so the head is still called through ``Module.__call__`` and its hooks."""
    had = "forward" in vars(head)
    old = vars(head).get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if had:
            head.forward = old
        else:
            del head.forward


def _model_inputs(self: Any, sequences: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
    """(model ids, attention mask, position ids, next tokens, unpad indices) as ``Actor.forward`` builds them."""
    import torch

    if self.packing_samples:
        from openrlhf.models.ring_attn_utils import unpad_and_slice_tensor

        model_ids, position_ids, rolled, _, indices = unpad_and_slice_tensor(sequences, attention_mask, None)
        return model_ids, None, position_ids, rolled, indices
    # OpenRLHF's padded layout (its issue 217: position ids from the attention mask)
    position_ids = attention_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(attention_mask == 0, 1)
    return sequences, attention_mask, position_ids, torch.roll(sequences, shifts=-1, dims=1), None


def chunked_forward(
    self: Any,
    sequences: torch.LongTensor,
    action_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    return_output: bool = False,
    allgather_logits: bool = False,
    return_logprobs: bool = False,
    ring_attn_group: Any = None,
    packed_seq_lens: list[int] | None = None,
    return_entropy: bool = False,
    **mm_inputs: Any,
) -> Any:
    """``Actor.forward`` (OpenRLHF 0.11.2's signature and return values) on the chunked path."""
    import torch

    from rpg_openrlhf.core.logprobs import chunk_tokens_for, chunked_logprobs

    head = _head(self)
    unsupported = (return_logprobs, ring_attn_group is not None, mm_inputs, getattr(self, "is_vlm", False))
    if action_mask is None or head is None or any(unsupported):
        return _STATE["original"](
            self, sequences, action_mask, attention_mask, return_output, allgather_logits, return_logprobs,
            ring_attn_group, packed_seq_lens, return_entropy, **mm_inputs,
        )  # fmt: skip
    batch, seqlen = sequences.size()
    model_ids, forward_mask, position_ids, rolled, indices = _model_inputs(self, sequences, attention_mask)
    rows, dest = action_rows(batch, seqlen, action_mask, indices)
    labels = rolled.reshape(-1)[rows]
    side: dict[str, torch.Tensor] = {}

    def head_forward(hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's forward for this call: log-probs of the action tokens in a [B, T] tensor."""
        side["called"] = True
        weight = head.weight
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
        logp, entropy = chunked_logprobs(
            picked, weight, labels, bias=head.bias, temperature=self.temperature,
            chunk_tokens=chunk_tokens_for(weight.shape[0], weight.dtype, _STATE["budget_bytes"]),
            with_entropy=return_entropy,
        )  # fmt: skip
        if entropy is not None:
            side["entropy"] = torch.zeros(batch * seqlen, device=entropy.device).index_put_((dest,), entropy)
        return torch.zeros(batch * seqlen, device=logp.device).index_put((dest,), logp).view(batch, seqlen)

    with _head_forward_swapped(head, head_forward):  # seam chunked_logprobs_head (one call)
        output = self.model(model_ids, attention_mask=forward_mask, position_ids=position_ids)
    log_probs = output["logits"]  # what head_forward returned, through ZeRO-3's backward hooks
    if not side.get("called") or log_probs is None or tuple(log_probs.shape) != (batch, seqlen):
        raise RuntimeError(
            f"--logprobs.chunked: {type(getattr(self.model, 'module', self.model)).__name__} does not return "
            "its LM head's output as its logits; run with --logprobs.full"
        )
    output["logits"] = None  # no [B, T, V] logits on this path
    if return_entropy:
        assert return_output
        output.entropy = side["entropy"].view(batch, seqlen)[:, :-1]
    action_log_probs = log_probs[:, :-1][:, -action_mask.shape[1] :] * action_mask.float()
    return (action_log_probs, output) if return_output else action_log_probs
