"""A step's samples reach OpenRLHF's experience maker in an order their tokens fix, whatever order the
engines finished the prompts in (``extras.trainer.ContentOrderMixin``): the resume-equality of
tests/test_e2e_preemption.py depends on it."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch

from rpg_openrlhf.extras.trainer import ContentOrderMixin


class Recorder:
    def train_step(self, rollout_samples: list, global_step: int) -> tuple[list, int]:
        return rollout_samples, global_step + 1


class Trainer(ContentOrderMixin, Recorder):
    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=2))


def sample(prompt: list[int], response: list[int]) -> SimpleNamespace:
    return SimpleNamespace(sequences=torch.tensor([prompt + response]), name=(tuple(prompt), tuple(response)))


def test_any_arrival_order_of_the_groups_gives_one_order_and_keeps_each_group_whole() -> None:
    groups = [
        [sample([1, 2], [3, 9]), sample([1, 2], [3, 1])],  # a group's own order is the engine's: kept
        [sample([1, 2, 3], [5]), sample([1, 2, 3], [4])],
        [sample([7], [1]), sample([7], [1])],
    ]
    seen = set()
    for order in itertools.permutations(groups):
        out, step = Trainer().train_step([s for g in order for s in g], 4)
        assert step == 5
        seen.add(tuple(s.name for s in out))
    # sorted by the groups' token lists: [1,2,3,5] < [1,2,3,9] < [7,1]; single samples would interleave
    # the first two groups ([1,2,3,1] < [1,2,3,4] < [1,2,3,5] < [1,2,3,9])
    assert seen == {tuple(s.name for s in (*groups[1], *groups[0], *groups[2]))}
