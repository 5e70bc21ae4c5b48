"""The policy workers' random state goes into every checkpoint, so a resumed step forms the same
micro-batches as the uninterrupted run (stock and RPG runs).

OpenRLHF's ``ActorPPOTrainer.ppo_train`` splits a step's samples into micro-batches with a shuffled
``DataLoader``, i.e. with the worker's global torch RNG, seeded once when the worker starts. Neither
OpenRLHF nor DeepSpeed checkpoints it: a resumed worker starts that RNG again from the seed, so its
first step shuffles as step 1 did, the gradient is accumulated in another order, and the weights drift
from the uninterrupted run's (measured with ``tests/test_e2e_preemption.py`` before this module: bf16
weights 0.35% of the step's update apart after one resumed step, 1.4% two steps later).

:class:`RngStateMixin` (the seam's stage ``rng-state``, on whatever ``PolicyModelActor`` the run uses)
writes each rank's torch RNG states (CPU, and CUDA when there is one) to
``<ckpt.path>/_actor/<tag>/rpg_rng_rank<r>.pt`` after OpenRLHF's save and before the trainer commits
the checkpoint (it waits for this call), and restores them after OpenRLHF loaded a checkpoint at start
(the tag ``_actor/latest`` names, which ``checkpoints.resume`` pointed at the last complete one). A
checkpoint without the files (written before) is loaded as before, with one log line.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from rpg_openrlhf.common import checkpoints


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def rng_file(ckpt_path: str, tag: str, rank: int) -> str:
    return os.path.join(ckpt_path, checkpoints.ACTOR_DIR, tag, f"rpg_rng_rank{rank}.pt")


def rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class RngStateMixin:
    """Policy actor mixin: its RNG state saved with each checkpoint and restored on resume."""

    def save_checkpoint(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        state = rng_state()  # before saving: the state the next step starts from
        result = super().save_checkpoint(tag, *args, **kwargs)
        ckpt = self.strategy.args.ckpt
        if not ckpt.disable_ds:
            torch.save(state, rng_file(ckpt.path, tag, _rank()))
        return result

    def init_model_from_pretrained(self, strategy: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().init_model_from_pretrained(strategy, *args, **kwargs)
        ckpt = strategy.args.ckpt
        if ckpt.load_enable and self.checkpoint_states:  # OpenRLHF loaded a checkpoint
            latest = os.path.join(ckpt.path, checkpoints.ACTOR_DIR, "latest")
            with open(latest, encoding="utf-8") as f:
                path = rng_file(ckpt.path, f.read().strip(), _rank())
            if os.path.exists(path):
                set_rng_state(torch.load(path, weights_only=True))
            else:
                strategy.print(f"[rpg] checkpoint: no RNG state in {os.path.dirname(path)} (written before)")
        return result


def use_rng_state_actor(module: ModuleType) -> None:
    """The seam's ``rng_state_actor`` patch: the current ``PolicyModelActor`` (stock or RPG) with
    :class:`RngStateMixin` in front."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, RngStateMixin)
