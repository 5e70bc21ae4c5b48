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
  are put once and copied into every reference actor through reference rank 0,
  ``ref_refresh.send``, and the step is logged as ``rpg/ref_refreshed``).

Granularity: OpenRLHF computes reference log-probs once per rollout (global step), so a
refresh takes effect at the next rollout; ``--rpg.ref_update_k`` counts global steps.
"""

from __future__ import annotations

import contextlib
import json
import os
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
from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.extras.trainer import MIXINS
from rpg_openrlhf.plugin import engine_logprobs, flags, ref_refresh

logger = init_logger(__name__)

#: Under ``--ckpt.path``: the reference weights of each checkpoint (after a refresh).
REFERENCE_DIR = "_rpg_reference"
#: Keys the RPG trainer adds to OpenRLHF's checkpoint ``client_states``.
STATE_SCHEDULE = "rpg_ref_schedule"
STATE_WEIGHTS = "rpg_ref_weights"


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
    async ``TrainingActor``): the RPG experience maker, the KL controller at 0, the reference refresh
    and its checkpoint state. Put it before the trainer class in the bases."""

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
        self.capture_dir = flags.get(args, "rpg.capture_dir") or os.environ.get("RPG_CAPTURE_DIR") or None
        logger.info(f"RPG: {flags.resolved_config(args)}")
        if self.capture_dir:
            os.makedirs(self.capture_dir, exist_ok=True)
            with open(os.path.join(self.capture_dir, "trainer.json"), "w", encoding="utf-8") as f:
                json.dump(
                    {
                        "reference_model": self.reference_model_group is not None,
                        "advantage_estimator": args.algo.advantage.estimator,
                        "kl_ctl": self.kl_ctl.value,
                        "rpg": flags.resolved_config(args),
                        "trainer": type(self).__name__,
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
        """pi_ref <- pi_theta: the actor's full weights, put once, reach every reference rank via rank 0."""
        ray.get(ref_refresh.send(self.reference_model_group, ray.put(self._actor_state_dict())))

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

    # -- checkpoint / resume ----------------------------------------------------------------
    # OpenRLHF's checkpoint holds the actor (and its client_states) only; the reference actors
    # are rebuilt from the initial model on start. Without these hooks a --ckpt.load_enable run
    # would restart every_k / kl_threshold from step 0 with pi_ref = the initial model.
    def _rpg_reference_dir(self) -> str:
        return os.path.join(self.args.ckpt.path, REFERENCE_DIR)

    def _rpg_checkpoint_states(self, client_states: dict[str, Any], tag: str) -> None:
        """Add the schedule state and, after a refresh, the reference weights file to a checkpoint.

        The weights go to ``<ckpt.path>/_rpg_reference/<tag>.pt`` before the actor checkpoint that
        names them is written, so a checkpoint never points at a missing file. Between refreshes
        the reference does not change: the previous file is hard-linked instead of re-gathered.
        """
        schedule = self.ref_schedule
        client_states[STATE_SCHEDULE] = schedule.state_dict()
        client_states.pop(STATE_WEIGHTS, None)
        if not schedule.refreshes or self.reference_model_group is None:
            return  # pi_ref is still the initial model, which a resumed run loads anyway
        os.makedirs(self._rpg_reference_dir(), exist_ok=True)
        name = f"{tag}.pt"
        path = os.path.join(self._rpg_reference_dir(), name)
        tmp = path + ".tmp"
        previous = getattr(self, "_rpg_ref_file", None)  # (path, refresh step) written by this process
        linked = False
        if previous and previous[1] == schedule.last_refresh and os.path.exists(previous[0]):
            if os.path.abspath(previous[0]) == os.path.abspath(path):
                linked = True
            else:
                with contextlib.suppress(OSError):  # no hard links on this filesystem: write anew
                    if os.path.exists(tmp):
                        os.remove(tmp)
                    os.link(previous[0], tmp)
                    os.replace(tmp, path)
                    linked = True
        if not linked:
            payload = {"refresh_step": schedule.last_refresh, "state_dict": self._reference_state_dict()}
            with atomic_write(path, "wb", tmp=os.path.basename(tmp)) as f:  # old file or new, never half
                torch.save(payload, f)
        self._rpg_ref_file = (path, schedule.last_refresh)
        client_states[STATE_WEIGHTS] = name
        logger.info(
            f"RPG: checkpoint {tag}: reference schedule (step {schedule.step}, refreshes "
            f"{schedule.refreshes}) and reference weights {path}"
        )

    def _rpg_prune_reference_files(self, keep: str) -> None:
        """Remove reference files of checkpoints that OpenRLHF has rotated out (keeps ``keep``)."""
        actor_dir = os.path.join(self.args.ckpt.path, "_actor")
        ref_dir = self._rpg_reference_dir()
        if not os.path.isdir(actor_dir) or not os.path.isdir(ref_dir):
            return  # actor checkpoints on another node's disk: nothing to compare with, keep all
        tags = set(os.listdir(actor_dir))
        for name in os.listdir(ref_dir):
            if name != keep and name.endswith((".pt", ".pt.tmp")) and name.split(".pt")[0] not in tags:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(ref_dir, name))

    def save_logs_and_checkpoints(self, global_step: int, logs_dict=None, client_states=None) -> None:
        """OpenRLHF's, with the reference schedule and weights in the checkpoint (resume)."""
        client_states = {} if client_states is None else client_states
        saving = global_step % self.args.ckpt.save_steps == 0
        if saving:
            # In place: OpenRLHF's fit() passes the same dict on to save_best_checkpoint.
            self._rpg_checkpoint_states(client_states, f"global_step{global_step}")
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if saving:
            self._rpg_prune_reference_files(keep=client_states.get(STATE_WEIGHTS, ""))

    def save_best_checkpoint(self, eval_metrics, global_step, client_states=None):
        """OpenRLHF's; a best checkpoint becomes DeepSpeed's ``latest`` too, so it needs its own file.

        The file is written before OpenRLHF decides whether this is the best; one that is not
        used is pruned at the next regular save.
        """
        client_states = {} if client_states is None else client_states
        if eval_metrics:
            self._rpg_checkpoint_states(client_states, f"best_global_step{global_step}")
        return super().save_best_checkpoint(eval_metrics, global_step, client_states)

    def init_checkpoint_states(self) -> dict:
        """OpenRLHF's, then the reference schedule and weights of the checkpoint are restored."""
        states = super().init_checkpoint_states()
        self._rpg_restore(states)
        return states

    def _rpg_restore(self, states: dict[str, Any]) -> None:
        schedule = self.ref_schedule
        saved = states.get(STATE_SCHEDULE)
        if saved is None:
            if states.get("global_step", 0) > 0 and schedule.mode in ("every_k", "kl_threshold"):
                logger.warning(
                    "RPG: the checkpoint holds no reference schedule (saved without RPG's resume "
                    "support): the schedule restarts and pi_ref is the initial model"
                )
            return
        try:
            schedule.load_state_dict(saved)
        except ValueError as e:
            raise RuntimeError(f"RPG: cannot resume, the --rpg.ref_update flags changed: {e}") from e
        logger.info(f"RPG: resumed reference schedule: step {schedule.step}, refreshes {schedule.refreshes}")
        if not schedule.refreshes or self.reference_model_group is None:
            return
        name = states.get(STATE_WEIGHTS)
        path = os.path.join(self._rpg_reference_dir(), name) if name else None
        if path is None or not os.path.exists(path):
            # Refusing is better than training on against the wrong pi_ref without a word.
            raise RuntimeError(
                f"RPG: the checkpoint's reference was refreshed at steps {schedule.refreshes} but its "
                f"weights are missing ({path or 'not recorded'}); resume from another checkpoint"
            )
        payload = torch.load(path, map_location="cpu", weights_only=True)
        ray.get(ref_refresh.send(self.reference_model_group, ray.put(payload["state_dict"])))
        self._rpg_ref_file = (path, int(payload["refresh_step"]))
        logger.info(f"RPG: resumed reference weights (refresh at step {payload['refresh_step']}) from {path}")

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
        with atomic_write(path, "wb") as f:
            torch.save(record, f)


class _RPGPPOTrainer(RPGTrainerMixin, _StockPPOTrainerClass.__ray_actor_class__):
    """OpenRLHF's PPO trainer with the RPG advantage estimator and reference refresh."""


class _RPGBudgetedPPOTrainer(*MIXINS, _RPGPPOTrainer):
    """The RPG trainer with the extras' mixins: ``--rpg.max_steps`` (inert without it) and committed
    checkpoints. They come first so that the budget's final checkpoint goes through the RPG checkpoint
    hooks (reference schedule and weights) and the commit covers the reference file too."""


RPGPPOTrainer = ray.remote(_RPGBudgetedPPOTrainer)
