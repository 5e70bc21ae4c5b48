"""What each tensor of an OpenRLHF 0.11.2 step costs on a GPU, in bytes: the terms of the memory plan.

Notation: N tokens in a micro-batch (padded: sequences x longest; packed: their sum), V vocabulary,
H hidden, I intermediate, L layers, q_dim / kv_dim the attention widths, n_h / n_kv the heads,
P parameters, d the data-parallel ranks of the model's group. Weights are bf16 (2 bytes).

Logits (``openrlhf/models/actor.py``: ``Actor.forward`` casts the ``[N, V]`` logits to fp32 and
keeps them in the returned output; ``models/utils.py``: ``log_probs_from_logits`` runs flash-attn's
Triton cross-entropy on them, which keeps only per-row vectors and whose backward allocates one
``empty_like(logits)``):

    no-grad forward   6 N V     bf16 logits + their fp32 copy, both alive during the cast
    training          10 N V    fp32 logits (kept by the output through the backward) + their fp32
                                gradient + the bf16 gradient the cast's backward makes
    (+ 4 N V when ``--actor.entropy_coef`` is non-zero: OpenRLHF's differentiable entropy keeps
    one more fp32 ``[N, V]`` tensor for backward)

With the chunked log-prob path (``--logprobs.chunked``, :mod:`rpg_openrlhf.core.logprobs`; b what one
chunk's head output, fp32 copy and gradient take: the budget ``--logprobs.chunk_mib`` rounded down to
whole rows of 8 V bytes, at least one, at most N: :func:`chunk_bytes`), only the
response tokens' hidden states reach the head and no ``[N, V]`` tensor exists (N bounds the
response tokens):

    no-grad forward   b + 2 N H       a chunk's temporaries + the response tokens' hidden states
    training          b + 8 N H       the backward's vocabulary block + the hidden states kept for
                                      it (2 N H) + their gradient, summed in fp32 (4 N H) and cast
                                      (2 N H); the head weight's gradient is the gradients' term

Activations saved for backward by one Hugging Face Qwen2/Qwen3 decoder layer, per token (bf16;
the RMSNorms save an fp32 copy of their input):

    A = 16 H + 8 I + 4 q_dim + 4 kv_dim + 4 n_h + 8              two RMSNorms (4H fp32 input, 2H
        [+ 6 q_dim + 6 kv_dim + 4 (n_h + n_kv)  with qk-norm]    normed, 2H scaled; 4 rsqrt each),
                                                                 gate, SiLU, up, product (2I each),
                                                                 q, k, v, attention out, its lse

    gradient checkpointing    L 2H N (each layer's input) + max(10 N V, 4 N V + A N)
                              (the peak is the logits' backward, or the last layer's recompute
                              while the fp32 logits are still held); chunked: L 2H N +
                              max(b + 8 N H, A N) (the head's backward ends before the recompute)
    without                   L A N + 10 N V; chunked: L A N + b + 8 N H

Model states (mixed-precision Adam, ZeRO stage s; the ZeRO paper's accounting):

    weights 2P (s < 3) or 2P/d;  gradients 2P (s < 2) or 2P/d;  Adam 12P/d (s >= 1) or 12P
    (fp32 master, m, v; 0 with ``--ds.adam_offload``)
    backward (s >= 1)   DeepSpeed's gradient bucket, 2 bytes x reduce_bucket_size elements (x 2 with
                        ``--ds.overlap_comm``); OpenRLHF writes ``"auto"``, which DeepSpeed's config
                        drops (``runtime/config_utils.py``), leaving its default of 5e8 elements
    optimizer step      8P/d of temporaries (the fp32 gradient partition and a copy of it: the
                        peak of a ZeRO-2 step measured on DeepSpeed's CPU path)
"""

from __future__ import annotations

from rpg_openrlhf.launch.model_shape import ModelShape

WEIGHT_BYTES = 2  # bf16 / fp16
ADAM_BYTES = 12  # fp32 master weights + Adam's m and v, per parameter
LOGITS_FORWARD_BYTES = 6  # per logit: bf16 + fp32 copy
LOGITS_TRAINING_BYTES = 10  # per logit: fp32 kept + fp32 gradient + bf16 gradient
LOGITS_KEPT_BYTES = 4  # per logit: the fp32 logits the output holds through the backward
ENTROPY_GRAPH_BYTES = 4  # per logit: OpenRLHF's differentiable entropy
REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's reduce_bucket_size default (OpenRLHF's "auto")


def layer_activation_bytes_per_token(shape: ModelShape) -> int:
    """A of the module docstring: bytes one decoder layer saves for backward, per token."""
    a = 16 * shape.hidden + 8 * shape.intermediate + 4 * shape.q_dim + 4 * shape.kv_dim + 4 * shape.heads + 8
    if shape.qk_norm:
        a += 6 * shape.q_dim + 6 * shape.kv_dim + 4 * (shape.heads + shape.kv_heads)
    return a


def logits_forward_bytes(shape: ModelShape, tokens: int) -> int:
    """6 N V: a no-grad log-prob forward's logits at the fp32 cast."""
    return LOGITS_FORWARD_BYTES * tokens * shape.vocab


def logits_training_bytes(shape: ModelShape, tokens: int, entropy_graph: bool = False) -> int:
    """10 N V (+ 4 N V with a differentiable entropy): the logits and their gradients in training."""
    per_logit = LOGITS_TRAINING_BYTES + (ENTROPY_GRAPH_BYTES if entropy_graph else 0)
    return per_logit * tokens * shape.vocab


#: Per logit of one chunk (``core.logprobs.chunk_tokens_for``): fp32 copy + head output + its gradient.
CHUNK_LOGIT_BYTES = 4 + 2 * WEIGHT_BYTES


def chunk_bytes(shape: ModelShape, tokens: int, budget: int) -> int:
    """What one chunk really takes of the budget b: ``chunk_tokens = max(1, b // (8 V))`` rows of 8 V
    bytes, but never more rows than the N tokens there are (a budget above 8 N V is not allocated)."""
    per_row = CHUNK_LOGIT_BYTES * shape.vocab
    return min(tokens, max(1, budget // per_row)) * per_row


def chunked_forward_bytes(shape: ModelShape, tokens: int, budget: int) -> int:
    """b + 2 N H: the chunked path's no-grad log-prob forward (a chunk and the response hidden states)."""
    return chunk_bytes(shape, tokens, budget) + WEIGHT_BYTES * shape.hidden * tokens


def chunked_training_bytes(shape: ModelShape, tokens: int, budget: int) -> int:
    """b + 8 N H: the chunked head's backward (a vocabulary block, the kept hidden states, their
    gradient in fp32 and cast)."""
    return chunk_bytes(shape, tokens, budget) + 8 * shape.hidden * tokens


def checkpoint_bytes(shape: ModelShape, tokens: int) -> int:
    """L 2H N: the layer inputs gradient checkpointing keeps."""
    return shape.layers * WEIGHT_BYTES * shape.hidden * tokens


def training_activation_split(
    shape: ModelShape,
    tokens: int,
    checkpointing: bool,
    entropy_graph: bool = False,
    chunk_budget: int | None = None,
) -> dict[str, int]:
    """The training micro-step's activation terms at their common peak (module docstring);
    ``chunk_budget`` (bytes): the chunked log-prob path."""
    layer = layer_activation_bytes_per_token(shape) * tokens
    if chunk_budget is not None:
        head = chunked_training_bytes(shape, tokens, chunk_budget)
        if not checkpointing:
            return {"layer activations": shape.layers * layer, "log-prob head (chunked)": head}
        terms = {"checkpointed layer inputs": checkpoint_bytes(shape, tokens)}
        if layer > head:
            terms["one layer recomputed"] = layer
        else:
            terms["log-prob head (chunked)"] = head
        return terms
    logits = logits_training_bytes(shape, tokens, entropy_graph)
    if not checkpointing:
        return {"layer activations": shape.layers * layer, "logits (fp32, with gradients)": logits}
    kept = (LOGITS_KEPT_BYTES + (ENTROPY_GRAPH_BYTES if entropy_graph else 0)) * tokens * shape.vocab
    recompute_peak = kept + layer  # the last layer recomputed while the fp32 logits are held
    terms = {"checkpointed layer inputs": checkpoint_bytes(shape, tokens)}
    if recompute_peak > logits:
        terms["logits (fp32, kept)"] = kept
        terms["one layer recomputed"] = layer
    else:
        terms["logits (fp32, with gradients)"] = logits
    return terms


def weight_bytes(params: int, zero_stage: int, dp: int) -> int:
    """2P, or 2P/d under ZeRO-3."""
    return WEIGHT_BYTES * params // (dp if zero_stage == 3 else 1)


def gradient_bytes(params: int, zero_stage: int, dp: int) -> int:
    """2P, or 2P/d from ZeRO-2 on."""
    return WEIGHT_BYTES * params // (dp if zero_stage >= 2 else 1)


def adam_bytes(params: int, zero_stage: int, dp: int, offload: bool = False) -> int:
    """12P, or 12P/d from ZeRO-1 on; 0 when the optimizer lives on the CPU."""
    return 0 if offload else ADAM_BYTES * params // (dp if zero_stage >= 1 else 1)


def step_temporary_bytes(params: int, zero_stage: int, dp: int, offload: bool = False) -> int:
    """8P/d: the optimizer step's fp32 gradient partition and its copy (0 offloaded)."""
    return 0 if offload else 8 * params // (dp if zero_stage >= 1 else 1)


def reduce_bucket_bytes(
    zero_stage: int, overlap_comm: bool = False, elements: int = REDUCE_BUCKET_ELEMENTS
) -> int:
    """2 bytes x reduce_bucket_size (x 2 overlapping): ZeRO's gradient bucket during the backward."""
    return 0 if zero_stage < 1 else WEIGHT_BYTES * elements * (2 if overlap_comm else 1)


def zero3_gathered_bytes(shape: ModelShape, training: bool) -> int:
    """ZeRO-3: the largest modules gathered at once, the embedding/lm_head (V H) and a layer, in
    bf16; in training also their full gradients before the reduce-scatter."""
    gathered = WEIGHT_BYTES * (shape.embedding_params + shape.layer_params)
    return 2 * gathered if training else gathered
