"""RPG in OpenRLHF's PPO trainer (the single-controller Ray actor): :class:`RPGExperienceMaker` (the
``rpg`` advantage estimator; OpenRLHF's KL never enters the reward) and :data:`RPGPPOTrainer` (its KL
controller at 0, the reference refresh of ``--rpg.ref_update``).

Granularity: OpenRLHF computes reference log-probs once per rollout (global step), so a
refresh takes effect at the next rollout; ``--rpg.ref_update_k`` counts global steps.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_trainer import PPOTrainer as _StockPPOTrainerClass
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties
from openrlhf.utils.logging_utils import init_logger

from rpg_openrlhf import core
from rpg_openrlhf.common import seam
from rpg_openrlhf.extras.trainer import MIXINS
from rpg_openrlhf.plugin import engine_logprobs, flags
from rpg_openrlhf.plugin.reference import DebugCapture, ReferenceRefresh

logger = init_logger(__name__)


class RPGExperienceMaker(RemoteExperienceMaker):
    """Experience maker for the ``rpg`` advantage estimator (group baseline from the core)."""

    #: this batch's engine log-probs, standing in for the actor's forward (``--rpg.old_logp engine``)
    _engine_logps: list[torch.Tensor] | None = None

    @torch.no_grad()
    def make_experience(self, samples_list):
        """OpenRLHF's make_experience, keeping the reference log-probs for the RPG loss.

        OpenRLHF keeps ``base_action_log_probs`` (and leaves the KL out of the reward) only when
        its KL loss is on; the RPG run has it off, so that branch is selected for this call only.
        With ``--rpg.old_logp engine`` the old log-probs are the engine's (no actor forward).
        """
        args = self.strategy.args
        self._engine_logps = engine_logprobs.of_samples(samples_list) if flags.engine_old_logp(args) else None
        try:
            with seam.swapped(
                args.algo.kl, use_loss=self.initial_model_group is not None
            ):  # seam kl_use_loss
                return super().make_experience(samples_list)
        finally:
            self._engine_logps = None

    def _dispatch_forward(self, group, sync_condition, **kwargs):
        """OpenRLHF's, except that with ``--rpg.old_logp engine`` the actor's old-log-prob forward is not
        run: its result is the engine's log-probs of the same micro-batches (seam experience_old_logp)."""
        if self._engine_logps is None or group is not self.actor_model_group:
            return super()._dispatch_forward(group, sync_condition, **kwargs)
        duplicates = self.strategy.args.ds.ring_attn_size * self.strategy.args.ds.tensor_parallel_size
        return engine_logprobs.as_forward_result(self._engine_logps, duplicates)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        """Rewards -> ``core.group_advantages`` -> per-token advantages.

        OpenRLHF's own pass runs first with no baseline and no whitening (length penalties,
        reward clipping, KL-free per-token returns, ``info["return"]``); then the group baseline
        is applied to the per-sample rewards in prompt-major order.
        """
        args = self.strategy.args
        if args.algo.advantage.estimator != flags.ESTIMATOR:
            return super().compute_advantages_and_returns(experiences)
        if self.kl_ctl.value != 0:
            raise RuntimeError("RPG: OpenRLHF's KL coefficient must be 0 (the KL is inside the RPG loss)")
        self._returns(experiences)

        n = args.rollout.n_samples_per_prompt
        exp_len = [len(e.index) for e in experiences]
        indices = torch.tensor([i for e in experiences for i in e.index])
        per_sample = torch.cat([e.info["return"].float() for e in experiences])
        rewards = torch.empty_like(per_sample)
        rewards[indices] = per_sample  # prompt-major: the n samples of prompt i are rows i*n..i*n+n-1
        adv = core.group_advantages(rewards, n, flags.get(args, "rpg.advantage"))
        for experience, a in zip(experiences, adv[indices].split(exp_len)):
            experience.advantages = core.broadcast_to_tokens(a, experience.action_mask).to(
                experience.returns.dtype
            )
            experience.info["rpg/advantage"] = a
        return experiences

    def _returns(self, experiences) -> None:
        """OpenRLHF's pass without a baseline and without whitening (what its ``reinforce`` branch
        computes, from its own helpers): rewards in fp32 at least, length penalties,
        ``group_reward_std``, reward clipping (KL coefficient 0), per-token returns,
        ``info["return"]``."""
        args = self.strategy.args
        for experience in experiences:
            experience.rewards = experience.rewards.to(
                torch.promote_types(experience.rewards.dtype, torch.float32)
            )
        apply_length_penalties(experiences, args)
        n = args.rollout.n_samples_per_prompt
        if n > 1:
            exp_len = [len(e.index) for e in experiences]
            indices = torch.tensor([i for e in experiences for i in e.index])
            raw = torch.cat([e.rewards for e in experiences])
            rewards = torch.empty_like(raw)
            rewards[indices] = raw
            stds = (
                rewards.reshape(-1, n).std(-1, keepdim=True).repeat(1, n).reshape(-1)[indices].split(exp_len)
            )
            for experience, std in zip(experiences, stds):
                experience.info["group_reward_std"] = std
        for experience in experiences:
            reward = compute_reward(
                experience.rewards,
                self.kl_ctl.value,
                experience.kl,
                action_mask=experience.action_mask,
                reward_clip_range=args.reward.clip_range,
            )
            experience.returns = self.get_cumulative_returns(
                reward, experience.action_mask, args.algo.advantage.gamma
            )
            experience.advantages = experience.returns.clone()
            experience.info["return"] = reward.sum(dim=-1)
            experience.kl = None


class RPGTrainerMixin:
    """The RPG parts of an OpenRLHF trainer (any ``BasePPOTrainer``: the synchronous ``PPOTrainer``, the
    async ``TrainingActor``): the RPG experience maker, the KL controller at 0, the reference
    (:class:`~rpg_openrlhf.plugin.reference.ReferenceRefresh`, refreshed after each ``train_step`` and
    the trainer's checkpoint part) and the debug capture. Put it before the trainer class in the bases,
    after ``CheckpointCommitMixin``, whose step end calls :meth:`checkpoint_part`."""

    capture_dir: str | None = None

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        args = self.args
        # OpenRLHF's KL is off: the RPG loss holds the KL (coefficient --rpg.beta).
        self.kl_ctl.value = 0.0
        self.experience_maker = RPGExperienceMaker(
            self.actor_model_group, self.critic_model_group, self.reward_model_group, self.reference_model_group,
            self.kl_ctl, self.strategy, self.tokenizer,
        )  # fmt: skip
        mode = flags.get(args, "rpg.ref_update")
        self.ref_schedule = core.ReferenceSchedule(
            mode, k=flags.get(args, "rpg.ref_update_k"), kappa=flags.get(args, "rpg.ref_kl_threshold")
        )
        if mode != "rollout" and self.reference_model_group is None:
            raise RuntimeError(f"RPG: --rpg.ref_update {mode} needs a reference model, but none was started")
        if mode == "rollout" and self.reference_model_group is not None:
            raise RuntimeError("RPG: --rpg.ref_update rollout must not start a reference model")
        generator = getattr(self, "samples_generator", None)  # async: in the generator actor instead
        if generator is not None and flags.engine_logprobs_needed(args):
            engine_logprobs.request_from_engines(generator)
        self.capture_dir = DebugCapture.directory(args)
        logger.info(f"RPG: {flags.resolved_config(args)}")
        if self.capture_dir:
            DebugCapture(self.capture_dir).trainer(self)

    def train_step(self, rollout_samples, global_step: int):
        """OpenRLHF's, then the reference: the schedule observes the step, a refresh when it says so."""
        status, global_step = super().train_step(rollout_samples, global_step)
        capture = DebugCapture(self.capture_dir) if self.capture_dir is not None else None
        ReferenceRefresh(self).after_train_step(status, global_step, capture)
        return status, global_step

    def checkpoint_part(self) -> ReferenceRefresh:
        """What the RPG trainer keeps in its checkpoints: the reference schedule and weights."""
        return ReferenceRefresh(self)


class _RPGPPOTrainer(RPGTrainerMixin, _StockPPOTrainerClass.__ray_actor_class__):
    """OpenRLHF's PPO trainer with the RPG advantage estimator and reference refresh."""


class _RPGBudgetedPPOTrainer(*MIXINS, _RPGPPOTrainer):
    """The RPG trainer with the extras' mixins in front (``extras.trainer.MIXINS``): the budget's hooks and
    the checkpoint hooks, whose step end calls this trainer's checkpoint part (:meth:`checkpoint_part`)."""


RPGPPOTrainer = ray.remote(_RPGBudgetedPPOTrainer)
