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

from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled
from rpg_openrlhf.extras.part import TrainerPart

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


class StepBudget(TrainerPart):
    """The budget of one trainer (:meth:`of`): ``n`` rollout steps (None: no budget), ``done`` so far."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.done = 0

    @property
    def n(self) -> int | None:
        return budget(self.args)

    def max_steps(self, data_steps: int) -> int:
        """OpenRLHF's scheduler length (optimizer steps), shortened to the budget."""
        return data_steps if self.n is None else min(data_steps, optimizer_steps(self.args, self.n))

    def start(self, states: dict) -> bool:
        """Count from the checkpoint's step (0 on a fresh start); whether a budget limits the generator."""
        self.done = int(states.get("global_step", 0) or 0)
        if self.n is not None and self.done >= self.n:
            log(f"resumed at global step {self.done}: --{FLAG} {self.n} already reached")
        return self.n is not None

    def exhausted(self) -> bool:
        return self.done >= self.n

    def is_last(self, global_step: int) -> bool:
        """Whether ``global_step`` is the budget's: its checkpoint is forced, and nothing is trained after it."""
        return self.n is not None and global_step == self.n

    def reached(self) -> None:
        log(f"reached --{FLAG} {self.n}: checkpoint global_step{self.n} saved, stopping")

    def finish(self, warn: Callable[[str], None]) -> None:
        """After the fit: ``warn`` when the data ran out before the budget."""
        if self.n is not None and self.done < self.n:
            warn(
                f"WARNING: the data ran out at global step {self.done}, before --{FLAG} {self.n}: raise "
                "--train.num_episodes (with dynamic sampling an episode gives fewer steps)"
            )


class RunLengthMixin:
    """The budget's hooks in OpenRLHF's (synchronous) ``PPOTrainer`` away from a step's end: the
    scheduler length, the count of steps, the generator stopped at the budget, the warning when the
    data ran out first. Its checkpoint at step N is taken in the step's end
    (``extras.checkpoint.CheckpointCommitMixin``). Without the flag every method is the trainer's own.
    """

    def get_max_steps(self) -> int:
        return StepBudget.of(self).max_steps(super().get_max_steps())

    def init_checkpoint_states(self) -> dict:
        """The trainer's; also where the budget starts counting (the checkpoint's step on resume)."""
        states = super().init_checkpoint_states()
        if StepBudget.of(self).start(states):
            self._rpg_limit_samples_generator()
        return states

    def _rpg_limit_samples_generator(self) -> None:
        limit_samples_generator(self.samples_generator, StepBudget.of(self).exhausted)

    def train_step(self, rollout_samples: Any, global_step: int):
        status, global_step = super().train_step(rollout_samples, global_step)
        StepBudget.of(self).done = global_step
        return status, global_step

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        result = super().fit(*args, **kwargs)
        StepBudget.of(self).finish(self._rpg_log)
        return result

    @staticmethod
    def _rpg_log(message: str) -> None:
        log(message)


def log(message: str) -> None:
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
