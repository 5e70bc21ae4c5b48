"""``--rpg.max_steps N``: a budget of rollout steps, for RPG runs and stock OpenRLHF baselines alike.

OpenRLHF's run length is ``--train.num_episodes`` passes over the prompts. Under dynamic sampling
(``--algo.dynamic_filtering_enable``) rejected prompt groups are refilled until the batch is full,
so an episode gives about (prompts / batch) x pass-rate rollout steps and the number of steps of a
run is unknown in advance. The paper counts rollout steps ("Last = step 400"); so does this budget:

* one rollout step = one global step of OpenRLHF's PPO trainer (one ``train_step``), whatever the
  sample generator refilled to fill the batch;
* the run stops cleanly after global step N: no further rollout is generated (the sample
  generator reports the data exhausted), and a checkpoint is written at exactly step N (DeepSpeed
  state, and Hugging Face weights with ``--ckpt.save_hf``) even when N is not a multiple of
  ``--ckpt.save_steps``, so "Last" is step N and the run can resume;
* resumed with ``--ckpt.load_enable``, a run that reached its budget trains nothing more; given a
  larger budget it continues to that one;
* OpenRLHF's scheduler length (``max_steps``: optimizer steps, for the warm-up ratio and the decay)
  becomes N x (optimizer steps per rollout step) when that is smaller than the data-based count;
* ``--train.num_episodes`` is then only an upper bound: set it high enough for N steps at the
  expected pass rate (a warning says so when the data ran out first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpg_openrlhf.common import seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled

FLAG = "rpg.max_steps"


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        f"--{FLAG}",
        type=int,
        default=None,
        help="stop after this many rollout steps (OpenRLHF global steps, whatever dynamic sampling "
        "refills) with a checkpoint at exactly that step; resumable. Works with and without --rpg.loss",
    )


def budget(args: Any) -> int | None:
    """The rollout-step budget, or None (no budget: OpenRLHF's episodes decide)."""
    return _get(args, FLAG)


def validate(args: Any) -> None:
    """Raise ``ValueError`` naming the flag for an unusable budget."""
    n = budget(args)
    if n is None:
        return
    if n < 1:
        raise ValueError(f"--{FLAG} must be >= 1 (rollout steps), got {n}")
    if _get(args, "train.async_enable") and not rpg_enabled(args):
        raise ValueError(
            f"--{FLAG} with --train.async_enable needs --rpg.loss: the RPG async trainer carries the budget "
            "(extras/async_budget.py), OpenRLHF's stock async trainer does not"
        )


def optimizer_steps(args: Any, rollout_steps: int) -> int:
    """Optimizer steps of ``rollout_steps`` rollout steps (OpenRLHF's own formula, per rollout)."""
    per_rollout = (
        _get(args, "rollout.batch_size")
        * _get(args, "rollout.n_samples_per_prompt")
        // _get(args, "train.batch_size")
    )
    return rollout_steps * per_rollout * _get(args, "train.max_epochs", 1)


class RunLengthMixin:
    """Budget of ``--rpg.max_steps`` rollout steps for OpenRLHF's (synchronous) ``PPOTrainer``.

    Put it first in the bases, before the trainer class it budgets, so that its final checkpoint
    goes through every ``save_logs_and_checkpoints`` of the trainer (RPG's reference state too).
    Without the flag every method is the trainer's own.
    """

    def _rpg_budget(self) -> int | None:
        return budget(self.args)

    def get_max_steps(self) -> int:
        data_steps = super().get_max_steps()
        n = self._rpg_budget()
        return data_steps if n is None else min(data_steps, optimizer_steps(self.args, n))

    def init_checkpoint_states(self) -> dict:
        """The trainer's; also where the budget starts counting (the checkpoint's step on resume)."""
        states = super().init_checkpoint_states()
        self._rpg_steps_done = int(states.get("global_step", 0) or 0)
        n = self._rpg_budget()
        if n is not None:
            self._rpg_limit_samples_generator()
            if self._rpg_steps_done >= n:
                self._rpg_log(f"resumed at global step {self._rpg_steps_done}: --{FLAG} {n} already reached")
        return states

    def _rpg_limit_samples_generator(self) -> None:
        limit_samples_generator(self.samples_generator, lambda: self._rpg_steps_done >= self._rpg_budget())

    def train_step(self, rollout_samples: Any, global_step: int):
        status, global_step = super().train_step(rollout_samples, global_step)
        self._rpg_steps_done = global_step
        return status, global_step

    def save_logs_and_checkpoints(
        self, global_step: int, logs_dict: Any = None, client_states: Any = None
    ) -> None:
        n = self._rpg_budget()
        if n is None or global_step != n:
            return super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        # The last step always gets a checkpoint (every trainer reads ckpt.save_steps at this call).
        with seam.swapped(self.args.ckpt, save_steps=1):  # seam save_steps
            super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        self._rpg_log(f"reached --{FLAG} {n}: checkpoint global_step{n} saved, stopping")

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        result = super().fit(*args, **kwargs)
        n = self._rpg_budget()
        done = getattr(self, "_rpg_steps_done", 0)
        if n is not None and done < n:
            self._rpg_log(
                f"WARNING: the data ran out at global step {done}, before --{FLAG} {n}: raise "
                "--train.num_episodes (with dynamic sampling an episode gives fewer steps)"
            )
        return result

    @staticmethod
    def _rpg_log(message: str) -> None:
        from openrlhf.utils.logging_utils import init_logger

        init_logger(__name__).info(f"[rpg] run length: {message}")


def limit_samples_generator(
    generator: Any, exhausted: Callable[[], bool], produced: Callable[[], None] | None = None
) -> None:
    """``generator.generate_samples`` (OpenRLHF's SamplesGenerator) reports the data exhausted once
    ``exhausted()``: the fit loop ends (seam generate_samples). ``produced()`` is called after each
    non-empty batch it returns."""
    if getattr(generator, "_rpg_budgeted", False):
        return
    original = generator.generate_samples

    def generate_samples(**generate_kwargs: Any):
        if exhausted():
            return [], None, 0, True  # nothing more to generate: the fit loop ends
        result = original(**generate_kwargs)
        if produced is not None and result[0]:
            produced()
        return result

    generator.generate_samples = generate_samples  # seam generate_samples
    generator._rpg_budgeted = True
