"""The trainer every ``rpg-train`` run gets: OpenRLHF's PPO trainer with the extras' trainer mixins.

:data:`MIXINS`, outermost first, each overriding its own OpenRLHF hooks. The RPG trainer puts them in front of its own class (plugin/trainer.py; the async one uses the same
budget and checkpoint hooks, plugin/async_trainer.py); a stock run (no ``--rpg.loss``) gets them on
OpenRLHF's ``PPOTrainer`` through the seam's stage ``trainer`` (:func:`enable`), so baselines are
budgeted and resumed exactly as RPG runs are.
"""

from __future__ import annotations

import functools
from typing import Any

from rpg_openrlhf.common import seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled
from rpg_openrlhf.extras import grad_boundary
from rpg_openrlhf.extras.checkpoint import CheckpointCommitMixin
from rpg_openrlhf.extras.patches import PATCHES
from rpg_openrlhf.extras.run_length import RunLengthMixin


class SeededPromptOrderMixin:
    """The prompt order follows ``--train.seed``, so two runs with the same seed train on the same prompts.

    OpenRLHF's trainer builds its prompt dataloader (``prepare_datasets``: shuffled, and no
    ``DistributedSampler`` since the trainer has no process group) in ``__init__``; torchdata's
    ``RandomSampler`` then seeds its generator from the process's global torch RNG, which nothing in the
    trainer process seeds: every run drew its own order (measured: two fresh runs of the same command
    trained step 1 on different prompts). Seeding that RNG with ``--train.seed`` first fixes the order;
    a resume restores the position in it from the checkpoint's dataloader state, as before.
    """

    def __init__(self, pretrain: Any, strategy: Any, *args: Any, **kwargs: Any) -> None:
        import torch

        torch.manual_seed(strategy.args.train.seed)
        super().__init__(pretrain, strategy, *args, **kwargs)


class ContentOrderMixin:
    """A step's prompt groups in an order fixed by their tokens, not by which engine request finished first.

    OpenRLHF appends each prompt's samples as its request completes (``ray.wait``), so the order of a
    step's groups, and with it the micro-batches the policy's seeded shuffle makes of them, followed the
    engines' timing: a run and its resume (or two runs) of one greedy command summed gradients in
    another order, which Adam's 1/sqrt(v) lifts above round-off. Groups of ``n_samples_per_prompt``
    stay whole and in order (OpenRLHF's advantages group them so); equal keys are equal samples.
    """

    def train_step(self, rollout_samples: list, global_step: int) -> Any:
        n = self.args.rollout.n_samples_per_prompt
        groups = [rollout_samples[i : i + n] for i in range(0, len(rollout_samples), n)]
        groups.sort(key=lambda group: [e.sequences.tolist() for e in group])
        return super().train_step([e for group in groups for e in group], global_step)


MIXINS = (RunLengthMixin, CheckpointCommitMixin, SeededPromptOrderMixin, ContentOrderMixin)


@functools.cache
def stock_trainer() -> Any:
    """OpenRLHF's PPOTrainer (a Ray actor class) with :data:`MIXINS`."""
    import ray
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    class StockPPOTrainer(*MIXINS, PPOTrainer.__ray_actor_class__):
        """OpenRLHF's PPO trainer with the run-length budget and committed checkpoints."""

    return ray.remote(StockPPOTrainer)


def enable(args: Any) -> bool:
    """Every run: the policy actor saves its RNG state with each checkpoint (seam stage ``rng-state``,
    ``extras.checkpoint``); with dynamic batching at ZeRO-1/2 it marks each step's last micro-batch
    for DeepSpeed (stage ``grad-boundary``, ``extras.grad_boundary``). Stock runs: OpenRLHF's ``PPOTrainer`` becomes :func:`stock_trainer` (seam
    stage ``trainer``); RPG runs (``--rpg.loss``) need nothing more: the RPG trainer carries the
    mixins. Returns whether the trainer was swapped."""
    seam.apply(PATCHES, "rng-state")
    if grad_boundary.needed(args):  # ZeRO-1/2 with dynamic batching: every micro-batch's gradient counts
        seam.apply(PATCHES, "grad-boundary")
    if rpg_enabled(args) or _get(args, "train.async_enable"):
        return False
    seam.apply(PATCHES, "trainer")
    return True


def use_stock_trainer(module: Any) -> None:
    """The seam's ``stock_trainer``: OpenRLHF's ``PPOTrainer`` becomes the extras' one."""
    module.PPOTrainer = stock_trainer()
