"""RPG under OpenRLHF's async trainer (``--train.async_enable``: ``PPOTrainerAsync``).

OpenRLHF's ``PPOTrainerAsync`` runs generation (``GenerateSamplesActor``, the vLLM engines) and
training (``TrainingActor``: make_experience, the actor's fit, the weight sync) in two Ray actors
joined by a queue of ``--train.async_queue_size`` rollout batches. Batch k is generated while batch
k-1 trains, so it comes from weights one or more versions older than the actor that computes its
loss; with ``--train.partial_rollout_enable`` the engines are paused (not locked) for a weight sync,
and one response can hold tokens of two versions. RPG's weights need the policy that sampled:
validation requires ``--rpg.old_logp engine`` (pi_old = the engine's per-token log-probs, which are
the distribution each token was sampled from, whatever version produced it) or the rollout
correction (``--algo.advantage.is_correction_level``: pi_old = the current actor, weight pi_old/mu).
:data:`RPGPPOTrainerAsync` is OpenRLHF's, building RPG's two actors (below).
"""

from __future__ import annotations

from typing import Any

import ray
from openrlhf.trainer import ppo_trainer_async as _async

from rpg_openrlhf.common import seam
from rpg_openrlhf.extras.async_budget import GeneratorBudgetMixin, TrainerBudgetMixin
from rpg_openrlhf.extras.checkpoint import CheckpointCommitMixin
from rpg_openrlhf.extras.trainer import SeededPromptOrderMixin
from rpg_openrlhf.plugin import engine_logprobs, flags
from rpg_openrlhf.plugin.trainer import RPGTrainerMixin


class _RPGGenerateSamplesActor(
    GeneratorBudgetMixin, SeededPromptOrderMixin, _async.GenerateSamplesActor.__ray_actor_class__
):
    """OpenRLHF's generator actor (its prompt order seeded, as the synchronous trainer's); engine
    log-probs requested when ``--rpg.old_logp engine`` needs them."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        if flags.engine_logprobs_needed(self.args):
            engine_logprobs.request_from_engines(self.samples_generator)


_StockTrainingActor = _async.TrainingActor.__ray_actor_class__


class _RPGTrainingActor(TrainerBudgetMixin, CheckpointCommitMixin, RPGTrainerMixin, _StockTrainingActor):
    """OpenRLHF's async training actor with the synchronous RPG trainer's parts: the budget's hooks, the
    checkpoint hooks (the same step end: ``CheckpointCommitMixin.save_logs_and_checkpoints``) and the RPG
    trainer's (its reference is the checkpoint part)."""

    def broadcast_to_vllm(self) -> None:
        """TrainingActor's own (the vLLM lock; pause / resume with partial rollouts), reached through a
        function of this module. Ray wraps every method of an actor class and pickles the wrappers with
        the functions they hold; TrainingActor's cannot be pickled by reference (its module binds the
        name to the Ray ActorClass), so the worker would run a copy whose zero-argument super() names a
        copy of the class, not one in the instance's MRO (TypeError; tests/test_rpg_offpolicy.py)."""
        _StockTrainingActor.broadcast_to_vllm(self)


RPGGenerateSamplesActor = ray.remote(_RPGGenerateSamplesActor)
RPGTrainingActor = ray.remote(_RPGTrainingActor)


class _RPGPPOTrainerAsync(_async.PPOTrainerAsync.__ray_actor_class__):
    """OpenRLHF's ``PPOTrainerAsync`` building :data:`RPGGenerateSamplesActor` and :data:`RPGTrainingActor`."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        # seam async_actors: __init__ builds both actors by their module-level names
        with seam.swapped(
            _async, GenerateSamplesActor=RPGGenerateSamplesActor, TrainingActor=RPGTrainingActor
        ):
            super().__init__(*a, **kw)
        ray.get(self.trainer_actor.rpg_attach_generator.remote(self.generator_actor))


RPGPPOTrainerAsync = ray.remote(_RPGPPOTrainerAsync)
