"""The training micro-batch the memory plan assumes under ``--train.dynamic_batch_enable`` bounds what
OpenRLHF 0.11.2's own packing forms (``replay_buffer.setup_dynamic_batch``: first fit for the count,
then ``get_seqlen_balanced_partitions``), which can exceed ``--train.max_tokens_per_gpu``."""

from __future__ import annotations

import random

import pytest

from rpg_openrlhf.launch.micro_batches import packed_worst_tokens


def openrlhf_largest(lengths: list[int], cap: int) -> int:
    """Tokens of the largest micro-batch OpenRLHF forms from one step's ``lengths``."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.utils.seqlen_balancing import (
        get_minimum_num_micro_batch_size,
        get_seqlen_balanced_partitions,
    )

    parts = get_seqlen_balanced_partitions(
        lengths, get_minimum_num_micro_batch_size(lengths, cap, 1, 1), False
    )
    return max(sum(lengths[i] for i in part) for part in parts)


def length_lists(n: int, seq_len: int, trials: int) -> list[list[int]]:
    """Realistic (prompt + response near the budget, or short) and adversarial mixes."""
    rng = random.Random(0)
    short = max(1, seq_len // 40)
    out = []
    for t in range(trials):
        kind = t % 4
        if kind == 0:  # responses anywhere up to the budget
            out.append([rng.randint(short, seq_len) for _ in range(n)])
        elif kind == 1:  # many at the budget (truncated), the rest short
            out.append(
                [
                    seq_len if rng.random() < 0.4 else rng.randint(short, max(short, seq_len // 3))
                    for _ in range(n)
                ]
            )
        elif kind == 2:  # two sizes that first fit packs badly
            out.append([rng.choice([seq_len, seq_len // 2 + 1, seq_len // 3 + 1]) for _ in range(n)])
        else:
            out.append([rng.choice([seq_len, rng.randint(1, short)]) for _ in range(n)])
    return out


@pytest.mark.parametrize(
    "n, seq_len, cap", [(64, 9216, 16192), (64, 3072, 16192), (32, 5120, 8192), (16, 9, 20)]
)
def test_openrlhfs_packing_stays_within_the_planned_worst_case(n: int, seq_len: int, cap: int) -> None:
    bound = packed_worst_tokens(n, seq_len, cap)
    largest = [openrlhf_largest(lengths, cap) for lengths in length_lists(n, seq_len, 200)]
    assert max(largest) <= bound
    if n * seq_len > cap:
        # what the plan assumed before (floor(C / T) whole sequences of T): the real packing exceeds it
        assert max(largest) > max(1, cap // seq_len) * seq_len
    if (n, seq_len, cap) == (64, 9216, 16192):  # Qwen3-4B 8K: over its cap, within C + T
        assert 16192 < max(largest) <= bound == 16192 + 9216


def test_short_batches_are_one_micro_batch() -> None:
    assert packed_worst_tokens(3, 100, 1000) == 300
    assert packed_worst_tokens(4, 5000, 1000) == 10000  # every sequence over the cap: 2 T at most
