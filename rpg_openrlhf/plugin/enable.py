"""Turn RPG on in the driver: prepare the arguments and swap in the RPG classes (seam stage ``rpg``).

Runs after parsing and :func:`rpg_openrlhf.plugin.validation.validate`, before OpenRLHF's ``train(args)``
(docs/contracts.md, "rpg-train entry point"). ``flags`` only parses and resolves; it imports
nothing from here, so flags is a leaf that the actor, the trainer and this module depend on.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from rpg_openrlhf.common import seam
from rpg_openrlhf.plugin import flags, validation
from rpg_openrlhf.plugin.flags import (
    ESTIMATOR,
    REFERENCE_SWITCH_COEF,
)
from rpg_openrlhf.plugin.patches import PATCHES


def enable(args: Any, swap_classes: bool = True) -> bool:
    """Prepare ``args`` and swap in the RPG classes; a no-op (returns False) without --rpg.loss.

    ``swap_classes=False`` (``--dry-run``) only prepares ``args``, to show what will run.

    * ``algo.advantage.estimator`` becomes ``rpg`` (and the critic is dropped);
    * OpenRLHF's KL is switched off: ``algo.kl.use_loss`` stays off and ``algo.kl.init_coef``
      becomes 0, or :data:`~rpg_openrlhf.plugin.flags.REFERENCE_SWITCH_COEF` when the reference
      update needs a reference model (that is the only switch that makes ``train()`` start one; the
      RPG trainer zeroes the KL controller, so it never reaches the reward);
    * ``actor.entropy_coef`` None becomes 0 (entropy is logged, not optimized);
    * ``rpg.capture_dir`` defaults to the env var ``RPG_CAPTURE_DIR``;
    * the seam's ``rpg`` stage: ``PolicyModelActor``, ``ReferenceModelActor``, ``PPOTrainer`` and
      ``PPOTrainerAsync`` become the RPG classes in their OpenRLHF modules;
    * with ``--rpg.old_logp engine`` and OpenRLHF's correction off, the seam's ``engine-logprobs`` stage:
      the engines are created returning the sampled tokens' log-probs (OpenRLHF asks for them only
      with its correction on).
    """
    if not flags.enabled(args):
        return False
    validation.validate(args)
    flags.set_value(args, "algo.advantage.estimator", ESTIMATOR)
    flags.set_value(args, "critic.model_name_or_path", None)  # OpenRLHF fills it in for the default "gae"
    flags.set_value(args, "algo.kl.use_loss", False)
    # validate() reads no typed coefficient here: the user's was checked where the command line was read
    coef = REFERENCE_SWITCH_COEF if flags.needs_reference_model(args) else 0.0
    flags.set_value(args, "algo.kl.init_coef", coef)
    if flags.get(args, "actor.entropy_coef") is None:
        flags.set_value(args, "actor.entropy_coef", 0.0)
    if flags.get(args, "rpg.capture_dir") is None and os.environ.get("RPG_CAPTURE_DIR"):
        flags.set_value(args, "rpg.capture_dir", os.environ["RPG_CAPTURE_DIR"])
    if flags.get(args, flags.CLIP_C.name) is None and flags.clip_c(args) is not None:  # the clip styles' c
        flags.set_value(args, flags.CLIP_C.name, flags.clip_c(args))
    if swap_classes:
        seam.apply(PATCHES, "rpg")
        if flags.engine_logprobs_needed(args):
            seam.apply(PATCHES, "engine-logprobs")
    return True


# The seam's appliers (stage "rpg"); the entry point re-binds train_ppo_ray's names afterwards.
def use_rpg_policy_actor(module: ModuleType) -> None:
    from rpg_openrlhf.plugin.actor import RPGPolicyModelActor

    module.PolicyModelActor = RPGPolicyModelActor


def use_rpg_reference_actor(module: ModuleType) -> None:
    from rpg_openrlhf.plugin.actor import RPGReferenceModelActor

    module.ReferenceModelActor = RPGReferenceModelActor


def use_rpg_ppo_trainer(module: ModuleType) -> None:
    from rpg_openrlhf.plugin.trainer import RPGPPOTrainer

    module.PPOTrainer = RPGPPOTrainer


def use_rpg_ppo_trainer_async(module: ModuleType) -> None:
    from rpg_openrlhf.plugin.async_trainer import RPGPPOTrainerAsync

    module.PPOTrainerAsync = RPGPPOTrainerAsync
