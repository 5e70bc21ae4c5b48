"""``--rpg.max_steps N`` under OpenRLHF's async trainer (``--train.async_enable``, ``PPOTrainerAsync``).

There generation runs in its own Ray actor (``GenerateSamplesActor``), one or more rollout batches
ahead of training (``TrainingActor``), and the two meet only through a queue. The budget therefore
has two halves:

* the generator produces exactly ``N - start`` more batches, where ``start`` is the global step the
  run starts from (0, or the checkpoint's on resume), then reports the data exhausted, so its loop
  puts ``"done"`` and the trainer ends after training the last one (:class:`GeneratorBudgetMixin`);
* the training actor counts and checkpoints as the synchronous budget does (``StepBudget``: a
  checkpoint at exactly step N, taken at the step's end as in the synchronous trainer; nothing trained past it) and, once ``init_checkpoint_states`` has
  told it ``start``, hands ``start`` to the generator (:class:`TrainerBudgetMixin`), before
  ``PPOTrainerAsync.fit`` starts either loop.

The generator cannot ask the trainer itself: both actors run one call at a time, and the trainer is
inside its ``fit`` while the generator generates.
"""

from __future__ import annotations

from typing import Any

from rpg_openrlhf.extras.run_length import RunLengthMixin, StepBudget, budget, limit_samples_generator, log


class GeneratorBudgetMixin:
    """For OpenRLHF's ``GenerateSamplesActor`` (put it first in the bases)."""

    def get_max_steps(self) -> int:
        """OpenRLHF's scheduler length (the async trainer asks the generator), shortened to the budget."""
        return StepBudget(self.args).max_steps(super().get_max_steps())

    def rpg_budget_from(self, start_step: int) -> None:
        """Generate the batches of global steps ``start_step + 1 .. N`` only (no-op without a budget).
        The first call decides: the count of batches generated is never reset."""
        n = budget(self.args)
        if n is None or getattr(self, "_rpg_batches", None) is not None:
            return
        self._rpg_batches = int(start_step)

        def produced() -> None:
            self._rpg_batches += 1

        limit_samples_generator(self.samples_generator, lambda: self._rpg_batches >= n, produced)
        log(f"generating the batches of global steps {start_step + 1}..{n} only")


class TrainerBudgetMixin(RunLengthMixin):
    """``RunLengthMixin`` for OpenRLHF's async ``TrainingActor``: its generator is another actor."""

    _rpg_generator: Any = None

    def rpg_attach_generator(self, generator: Any) -> None:
        """The generator actor whose batches this trainer consumes (``PPOTrainerAsync`` builds both)."""
        self._rpg_generator = generator

    def _rpg_limit_samples_generator(self) -> None:
        """Called by ``init_checkpoint_states`` with the start step known, before the generator's fit."""
        import ray

        if self._rpg_generator is None:
            raise RuntimeError("--rpg.max_steps under --train.async_enable: no generator actor attached")
        ray.get(self._rpg_generator.rpg_budget_from.remote(StepBudget.of(self).done))
