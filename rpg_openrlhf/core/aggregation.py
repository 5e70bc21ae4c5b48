"""Loss aggregation: OpenRLHF's `aggregate_loss` (openrlhf/models/loss.py), plus seq-mean-token-sum."""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: "step": one mean over the optimizer step (OpenRLHF's global normalizers); "micro_batch": the
#: mean of each micro-batch, weighted by its share of the step's sequences (the released verl code).
AGGREGATION_SCOPES = ("step", "micro_batch")


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask, else 0: a bool mask selects (nothing from masked entries leaks in), a float one
    multiplies (as OpenRLHF)."""
    return torch.where(mask, x, 0.0) if mask.dtype == torch.bool else x * mask


def counts(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of unmasked entries (along dim); count_nonzero: a bool mask's sum() copies it to int64."""
    if mask.dtype == torch.bool:
        return torch.count_nonzero(mask) if dim is None else torch.count_nonzero(mask, dim=dim)
    return mask.sum() if dim is None else mask.sum(dim=dim)


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean", dp_size: int = 1,
              batch_num_tokens: float | Tensor | None = None, global_batch_size: float | Tensor | None = None,
              scope: str = "step") -> Tensor:  # fmt: skip
    """Reduce a [B, T] loss (m = mask) to a scalar:
    token-mean:           sum(l m) / N_tok                  N_tok = batch_num_tokens / dp_size, else sum(m)
    seq-mean-token-mean:  sum_i s_i [n_i>0] / N_seq         s_i = sum_t l_it m_it / (n_i + 1e-8)
    seq-mean-token-sum:   sum_i s_i [n_i>0] / N_seq         s_i = sum_t l_it m_it
    n_i = sum_t m_it, N_seq = global_batch_size / dp_size, else the number of non-empty rows. With the
    global normalizers the mean over dp_size ranks (DDP/DeepSpeed average gradients) is the full-batch
    loss; dp_size acts only with a normalizer, and an all-masked batch gives nan, both as OpenRLHF.
    scope="micro_batch" (the released verl code): the batch's own mean (0 when all-masked), times
    n_b dp_size / N_seq (n_b its non-empty sequences) when global_batch_size is given: with OpenRLHF's
    normalizers the step's gradient is sum_b (n_b / n_step) mean_b, as verl's micro-batches."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation: unknown mode {mode!r}, expected one of {AGGREGATIONS}")
    if scope not in AGGREGATION_SCOPES:
        raise ValueError(f"aggregation_scope: unknown {scope!r}, expected one of {AGGREGATION_SCOPES}")
    if dp_size < 1:
        raise ValueError(f"dp_size: must be >= 1, got {dp_size}")
    if loss.shape != mask.shape:
        raise ValueError(f"mask: shape {tuple(mask.shape)} does not match loss {tuple(loss.shape)}")
    if scope == "micro_batch":
        return _micro_batch_mean(loss, mask, mode, dp_size, global_batch_size)
    if mode == "token-mean":
        total = masked(loss, mask).sum()
        if batch_num_tokens is None:
            return total / counts(mask)
        return total / batch_num_tokens * dp_size

    token_counts = counts(mask, dim=-1)
    seq_loss = masked(loss, mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        seq_loss = seq_loss / (token_counts + 1e-8)
    seq_mask = (token_counts > 0).to(seq_loss.dtype)  # fully masked sequences do not count
    if global_batch_size is None:
        return (seq_loss * seq_mask).sum() / seq_mask.sum()
    return (seq_loss * seq_mask).sum() / global_batch_size * dp_size


def _micro_batch_mean(loss: Tensor, mask: Tensor, mode: str, dp_size: int,
                     global_batch_size: float | Tensor | None) -> Tensor:  # fmt: skip
    """This batch's own mean (empty denominators count 1), weighted n_b dp_size / N_seq if given."""
    token_counts = counts(mask, dim=-1)
    seq_mask = (token_counts > 0).to(loss.dtype)
    n_seq = seq_mask.sum()
    if mode == "token-mean":
        local = masked(loss, mask).sum() / token_counts.sum().clamp(min=1)
    else:
        seq_loss = masked(loss, mask).sum(dim=-1)
        if mode == "seq-mean-token-mean":
            seq_loss = seq_loss / (token_counts + 1e-8)
        local = (seq_loss * seq_mask).sum() / n_seq.clamp(min=1)
    if global_batch_size is None:
        return local
    return local * n_seq / global_batch_size * dp_size
