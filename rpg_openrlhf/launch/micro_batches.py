"""Tokens in the largest micro-batch OpenRLHF 0.11.2 forms, when every sequence has ``--data.max_len``
tokens (the worst case: responses at the budget; OpenRLHF truncates every sequence to max_len).

Without ``--train.dynamic_batch_enable``: ``--rollout.micro_batch_size`` (log-prob and reference
forwards) or ``--train.micro_batch_size`` (training) sequences, padded to the longest: B T tokens.

With it (``trainer/ppo_utils/experience_maker.py`` ``split_rollout_samples``;
``replay_buffer.py`` ``setup_dynamic_batch``; ``utils/seqlen_balancing.py``): first fit into bins
of C = max_tokens_per_gpu tokens gives m micro-batches (a sequence longer than C gets one of its
own), then Karmarkar-Karp balances the sequences over them; with n equal sequences of T tokens

    per bin   k = max(1, floor(C / T)),     m = ceil(n / k)
    rollout   n = rollout.batch_size x n_samples_per_prompt,  m rounded down to a multiple of the
              actor ranks a (at least a):  m' = max(a, floor(m / a) a)
    training  n = train.batch_size / a   (each rank's share of one optimizer step)
    tokens    ceil(n / m') T                              (the rollout forwards)

The training micro-batch is planned at the worst case OpenRLHF's packing can produce from n sequences
of at most T tokens (``replay_buffer.setup_dynamic_batch``: first fit gives m, then
``get_seqlen_balanced_partitions(lengths, m)``, Karmarkar-Karp, which balances sums and ignores C):

    tokens <= min(n T, max(C, T) + T)

Karmarkar-Karp merges two states largest-with-smallest, so a state's spread (largest minus
smallest sum) never exceeds the larger of the two it came from: the final spread is at most the
longest sequence, T; the smallest part is at most the mean total / m, and first fit's m bins hold
at most max(C, T) each. So a part can exceed C by up to T (tests/test_memory_plan.py runs
OpenRLHF's own functions on adversarial and realistic lengths against this bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rpg_openrlhf.common.args import get


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch of a phase: ``sequences`` of ``seq_len`` tokens each."""

    sequences: int
    seq_len: int
    how: str
    packed_tokens: int | None = None  # a packed micro-batch's tokens (its sequences vary in length)

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len if self.packed_tokens is None else self.packed_tokens


def balanced_sequences(n: int, seq_len: int, max_tokens: int, multiple_of: int = 1) -> int:
    """Sequences in the largest of OpenRLHF's dynamic micro-batches (module docstring)."""
    per_bin = max(1, max_tokens // seq_len)
    bins = math.ceil(n / per_bin)
    if multiple_of > 1:
        bins = max(multiple_of, bins // multiple_of * multiple_of)
    return math.ceil(n / min(bins, n))


def packed_worst_tokens(n: int, seq_len: int, max_tokens: int) -> int:
    """Tokens in the largest micro-batch OpenRLHF's first fit + Karmarkar-Karp can form from ``n``
    sequences of at most ``seq_len`` tokens with ``max_tokens`` per GPU (module docstring)."""
    return min(n * seq_len, max(max_tokens, seq_len) + seq_len)


def actor_ranks(args: Any) -> int:
    """Data-parallel ranks of the actor group (ring attention and DeepSpeed TP share a sequence)."""
    gpus = get(args, "actor.num_nodes", 1) * get(args, "actor.num_gpus_per_node", 1)
    return max(1, gpus // (get(args, "ds.ring_attn_size", 1) * get(args, "ds.tensor_parallel_size", 1)))


def rollout_micro_batch(args: Any) -> MicroBatch:
    """The log-prob / reference forward's largest micro-batch."""
    seq_len = int(get(args, "data.max_len"))
    if not get(args, "train.dynamic_batch_enable", False):
        b = int(get(args, "rollout.micro_batch_size", 1))
        return MicroBatch(b, seq_len, f"--rollout.micro_batch_size {b}, padded to {seq_len}")
    cap = int(get(args, "rollout.max_tokens_per_gpu") or get(args, "train.max_tokens_per_gpu"))
    n = int(get(args, "rollout.batch_size")) * int(get(args, "rollout.n_samples_per_prompt", 1))
    b = balanced_sequences(n, seq_len, cap, multiple_of=actor_ranks(args))
    return MicroBatch(b, seq_len, f"--rollout.max_tokens_per_gpu {cap}: {b} x {seq_len} (dynamic)")


def training_micro_batch(args: Any) -> MicroBatch:
    """The training step's largest micro-batch."""
    seq_len = int(get(args, "data.max_len"))
    if not get(args, "train.dynamic_batch_enable", False):
        b = int(get(args, "train.micro_batch_size", 1))
        return MicroBatch(b, seq_len, f"--train.micro_batch_size {b}, padded to {seq_len}")
    cap = int(get(args, "train.max_tokens_per_gpu"))
    n = max(1, int(get(args, "train.batch_size")) // actor_ranks(args))
    tokens = packed_worst_tokens(n, seq_len, cap)
    how = f"--train.max_tokens_per_gpu {cap}: up to {tokens} tokens packed (dynamic; sequences <= {seq_len})"
    return MicroBatch(1, seq_len, how, packed_tokens=tokens)
