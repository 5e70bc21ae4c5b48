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
    n_i = sum_t m_it, N_seq = global_batch_size / dp_size, else the non-empty rows: the mean over the
    dp_size ranks is the full-batch loss (all-masked: nan, as OpenRLHF). scope="micro_batch" (released
    verl code): the batch's own mean (all-masked: 0) times n_b dp_size / N_seq, n_b its non-empty rows."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation: unknown mode {mode!r}, expected one of {AGGREGATIONS}")
    if scope not in AGGREGATION_SCOPES:
        raise ValueError(f"aggregation_scope: unknown {scope!r}, expected one of {AGGREGATION_SCOPES}")
    if dp_size < 1:
        raise ValueError(f"dp_size: must be >= 1, got {dp_size}")
    if loss.shape != mask.shape:
        raise ValueError(f"mask: shape {tuple(mask.shape)} does not match loss {tuple(loss.shape)}")
    micro = scope == "micro_batch"  # the batch's own mean (empty denominators count 1), then weighted
    if mode == "token-mean":
        total = masked(loss, mask).sum()
        if not micro:
            return total / counts(mask) if batch_num_tokens is None else total / batch_num_tokens * dp_size
        token_counts = counts(mask, dim=-1)
        n_seq = (token_counts > 0).to(loss.dtype).sum()
        local = total / token_counts.sum().clamp(min=1)
    else:
        token_counts = counts(mask, dim=-1)
        seq_loss = masked(loss, mask).sum(dim=-1)
        if mode == "seq-mean-token-mean":
            seq_loss = seq_loss / (token_counts + 1e-8)
        seq_mask = (token_counts > 0).to(
            loss.dtype if micro else seq_loss.dtype
        )  # empty sequences do not count
        n_seq, total = seq_mask.sum(), (seq_loss * seq_mask).sum()
        if not micro:
            return total / n_seq if global_batch_size is None else total / global_batch_size * dp_size
        local = total / n_seq.clamp(min=1)
    return local if global_batch_size is None else local * n_seq / global_batch_size * dp_size
