"""RPG in OpenRLHF's PPO trainer (the single-controller Ray actor).

* :class:`RPGExperienceMaker`: OpenRLHF's ``RemoteExperienceMaker`` with the advantage
  estimator ``rpg``: rewards (after OpenRLHF's length penalties and reward clipping) minus the
  group baseline ``--rpg.advantage``, computed by ``rpg_openrlhf.core.group_advantages`` and
  broadcast to tokens by ``core.broadcast_to_tokens``. OpenRLHF's KL never enters the reward:
  the reference log-probs (when a reference model runs) are kept on the experience for the RPG
  loss instead.
* :data:`RPGPPOTrainer`: OpenRLHF's ``PPOTrainer`` with that experience maker, its KL
  controller fixed at 0, and the reference refresh of ``--rpg.ref_update`` (a
  ``core.ReferenceSchedule`` observed once per global step; on refresh the actor's full weights
  are copied into every reference actor and the step is logged as ``rpg/ref_refreshed``).

Granularity: OpenRLHF computes reference log-probs once per rollout (global step), so a
refresh takes effect at the next rollout; ``--rpg.ref_update_k`` counts global steps.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import ray
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer as _StockPPOTrainerClass
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.utils.logging_utils import init_logger

from rpg_openrlhf import core
from rpg_openrlhf.openrlhf import flags

logger = init_logger(__name__)


@contextlib.contextmanager
def _attrs(obj: Any, **values: Any) -> Iterator[None]:
    old = {k: getattr(obj, k) for k in values}
    for k, v in values.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


class RPGExperienceMaker(RemoteExperienceMaker):
    """Experience maker for the ``rpg`` advantage estimator (group baseline from the core)."""

    @torch.no_grad()
    def make_experience(self, samples_list):
        """OpenRLHF's make_experience, keeping the reference log-probs for the RPG loss.

        OpenRLHF keeps ``base_action_log_probs`` (and leaves the KL out of the reward) only when
        its KL loss is on; the RPG run has it off, so that branch is selected for this call only.
        """
        kl_args = self.strategy.args.algo.kl
        with _attrs(kl_args, use_loss=self.initial_model_group is not None):
            return super().make_experience(samples_list)

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
        # "reinforce" per-token returns with the estimator name "rpg" in args: no baseline branch
        # and no whitening branch of the parent match, so rewards pass through unchanged.
        with _attrs(self, advantage_estimator="reinforce"):
            experiences = super().compute_advantages_and_returns(experiences)

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


class _RPGPPOTrainer(_StockPPOTrainerClass.__ray_actor_class__):
    """OpenRLHF's PPO trainer with the RPG advantage estimator and reference refresh."""

    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, **generate_kwargs) -> None:  # fmt: skip
        super().__init__(
            pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
            reference_model_group, vllm_engines, **generate_kwargs,
        )  # fmt: skip
        args = self.args
        # OpenRLHF's KL is off: the RPG loss holds the KL (coefficient --rpg.beta).
        self.kl_ctl.value = 0.0
        self.experience_maker = RPGExperienceMaker(
            actor_model_group, critic_model_group, reward_model_group, reference_model_group,
            self.kl_ctl, strategy, self.tokenizer,
        )  # fmt: skip
        mode = flags.get(args, "rpg.ref_update")
        self.ref_schedule = core.ReferenceSchedule(
            mode, k=flags.get(args, "rpg.ref_update_k"), kappa=flags.get(args, "rpg.ref_kl_threshold")
        )
        if mode != "rollout" and reference_model_group is None:
            raise RuntimeError(f"RPG: --rpg.ref_update {mode} needs a reference model, but none was started")
        if mode == "rollout" and reference_model_group is not None:
            raise RuntimeError("RPG: --rpg.ref_update rollout must not start a reference model")
        self.capture_dir = flags.get(args, "rpg.capture_dir") or os.environ.get("RPG_CAPTURE_DIR") or None
        logger.info(f"RPG: {flags.resolved_config(args)}")
        if self.capture_dir:
            os.makedirs(self.capture_dir, exist_ok=True)
            with open(os.path.join(self.capture_dir, "trainer.json"), "w", encoding="utf-8") as f:
                json.dump(
                    {
                        "reference_model": reference_model_group is not None,
                        "advantage_estimator": args.algo.advantage.estimator,
                        "kl_ctl": self.kl_ctl.value,
                        "rpg": flags.resolved_config(args),
                    },
                    f,
                    indent=1,
                    default=str,
                )

    # -- reference refresh ----------------------------------------------------------------
    def _actor_state_dict(self) -> dict[str, torch.Tensor]:
        sleep = bool(self.args.ds.enable_sleep)  # actor states are offloaded between fits
        if sleep:
            ray.get(self.actor_model_group.async_run_method(method_name="reload_states"))
        try:
            results = ray.get(self.actor_model_group.async_run_method(method_name="rpg_state_dict"))
        finally:
            if sleep:
                ray.get(self.actor_model_group.async_run_method(method_name="offload_states"))
        state = next((r for r in results if r is not None), None)
        if state is None:
            raise RuntimeError("RPG: the actor group returned no weights")
        return state

    def _reference_state_dict(self) -> dict[str, torch.Tensor]:
        results = ray.get(self.reference_model_group.async_run_method(method_name="rpg_state_dict"))
        return next(r for r in results if r is not None)

    def refresh_reference(self) -> None:
        """pi_ref <- pi_theta: copy the actor's full weights into every reference actor."""
        state_ref = ray.put(self._actor_state_dict())
        ray.get(
            self.reference_model_group.async_run_method(method_name="rpg_load_state_dict", state=state_ref)
        )

    def train_step(self, rollout_samples, global_step: int):
        status, global_step = super().train_step(rollout_samples, global_step)
        kl = status.get("kl")
        refresh = self.ref_schedule.observe(None if kl is None else float(kl))
        capture = self.capture_dir is not None and self.reference_model_group is not None
        before = self._reference_state_dict() if capture else None
        if refresh:
            self.refresh_reference()
            logger.info(f"RPG: reference refreshed at global step {global_step} (pi_ref <- pi_theta)")
        if capture:
            self._capture_refresh(global_step, refresh, before)
        status["rpg/ref_refreshed"] = float(refresh)
        status["rpg/ref_refreshes"] = float(len(self.ref_schedule.refreshes))
        if self.ref_schedule.mode == "kl_threshold":
            running = self.ref_schedule.running_kl
            status["rpg/ref_running_kl"] = 0.0 if running != running else running
        return status, global_step

    def _capture_refresh(self, global_step: int, refreshed: bool, before: dict) -> None:
        os.makedirs(self.capture_dir, exist_ok=True)
        record = {
            "global_step": global_step,
            "refreshed": refreshed,
            "actor": self._actor_state_dict(),
            "ref_before": before,
            "ref_after": self._reference_state_dict(),
        }
        path = os.path.join(self.capture_dir, f"refresh_step{global_step:05d}.pt")
        torch.save(record, path + ".tmp")
        os.replace(path + ".tmp", path)


RPGPPOTrainer = ray.remote(_RPGPPOTrainer)
