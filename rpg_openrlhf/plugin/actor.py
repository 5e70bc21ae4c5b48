"""RPG inside OpenRLHF's policy actor (runs in the Ray workers): :class:`RPGPolicyLoss` (OpenRLHF's
``PolicyLoss`` signature, ``rpg_openrlhf.core.compute_loss`` inside: the math is only in the core),
:class:`RPGActorPPOTrainer` (OpenRLHF's ``training_step`` with its KL coefficient 0, so the KL enters the
loss once, inside the RPG loss) and the policy / reference actor classes (Schedule-Free AdamW, full
weights for the reference refresh).

Debug capture: with ``--rpg.capture_dir DIR`` (or env ``RPG_CAPTURE_DIR``) every loss call is
saved to ``DIR/loss_rank{r}_{i:05d}.pt`` (inputs, config, loss, metrics), so a test can check
that the loss a worker computed equals ``rpg_openrlhf.core.compute_loss`` on the same tensors.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict
from typing import Any

import ray
import torch
import torch.distributed as dist
from openrlhf.models.utils import masked_mean
from openrlhf.trainer.ray import ppo_actor as _ppo_actor_mod
from openrlhf.trainer.ray.launcher import ReferenceModelActor as _StockReferenceActorClass
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor as _StockPolicyActorClass
from openrlhf.utils.logging_utils import init_logger

from rpg_openrlhf import core
from rpg_openrlhf.common import seam
from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.zero import gather_full_state_dict, rank_world
from rpg_openrlhf.extras import step_dump
from rpg_openrlhf.plugin import finite, flags, ref_refresh, schedule_free

logger = init_logger(__name__)

METRIC_PREFIX = "rpg/"
#: The correction's metrics that OpenRLHF's training_step logs under its own names (from the loss's
#: return value); the rest of the correction's metrics (is_weight_mean) go under rpg/.
OPENRLHF_CORRECTION_METRICS = ("vllm_kl", "is_filter_ratio")


class RPGPolicyLoss:
    """Drop-in for OpenRLHF's ``PolicyLoss`` that calls ``rpg_openrlhf.core.compute_loss``.

    The reference log-probs and the metric sink come from the experience bound by
    :meth:`RPGActorPPOTrainer.training_step` (``experience.base_action_log_probs``; ``None``
    with ``--rpg.ref_update rollout``, i.e. pi_ref = pi_old).
    """

    def __init__(
        self,
        name: str,
        style: str,
        config: core.LossConfig,
        capture_dir: str | None = None,
        use_reference: bool = False,
    ) -> None:
        self.name, self.style, self.config = name, style, config
        self.capture_dir = capture_dir
        self.use_reference = use_reference
        self.experience: Any = None
        self._calls = 0

    @classmethod
    def from_args(cls, args: Any) -> RPGPolicyLoss:
        """Build from the (hierarchized) OpenRLHF args carrying ``args.rpg``."""
        return cls(
            flags.get(args, flags.LOSS.name),
            flags.get(args, "rpg.style"),
            flags.loss_config(args),
            capture_dir=flags.get(args, "rpg.capture_dir") or os.environ.get("RPG_CAPTURE_DIR") or None,
            use_reference=flags.needs_reference_model(args),
        )

    def compute(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        dp_size: int = 1,
        batch_num_tokens: Any = None,
        global_batch_size: Any = None,
        rollout_logp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The whole RPG loss of one micro-batch: ``core.compute_loss`` (plus the capture).

        ``rollout_logp``: the engine's log-probs of the sampled tokens (mu), given with the rollout
        correction on: the loss is then SG(c) L, c ~ pi_old / mu (core/correction.py).
        A NaN/inf input on any rank stops every rank with the same error (``finite.agree_finite``)
        instead of raising on that rank alone while the others wait in a collective."""
        inputs = {"logp": logp, "old_logp": old_logp, "advantages": advantages, "ref_logp": ref_logp}
        finite.agree_finite({**inputs, "rollout_logp": rollout_logp})
        norms = {
            "dp_size": dp_size,
            "batch_num_tokens": batch_num_tokens,
            "global_batch_size": global_batch_size,
        }
        loss, metrics = core.compute_loss(
            self.name,
            self.style,
            logp,
            old_logp,
            advantages,
            action_mask,
            ref_logp,
            config=self.config,
            rollout_logp=rollout_logp,
            **norms,
        )
        if self.capture_dir:
            self._capture(
                {**inputs, "action_mask": action_mask, "rollout_logp": rollout_logp, **norms}, loss, metrics
            )
        return loss, metrics

    def _capture(self, tensors: dict[str, Any], loss: torch.Tensor, metrics: dict[str, float]) -> None:
        os.makedirs(self.capture_dir, exist_ok=True)

        def cpu(x):
            return x.detach().cpu().clone() if isinstance(x, torch.Tensor) else x

        record = {
            "name": self.name,
            "style": self.style,
            "config": asdict(self.config),
            **{k: cpu(v) for k, v in tensors.items()},
            "loss": cpu(loss),
            "metrics": dict(metrics),
        }
        path = os.path.join(self.capture_dir, f"loss_rank{rank_world()[0]}_{self._calls:05d}.pt")
        with atomic_write(path, "wb") as f:
            torch.save(record, f)

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: Any = None,
        global_batch_size: Any = None,
    ):
        """PolicyLoss's signature and return value ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)``:
        the last two (OpenRLHF logs them under these names) with the rollout correction on, else None."""
        experience = self.experience
        loss, metrics = self.compute(
            log_probs,
            old_log_probs,
            advantages,
            action_mask,
            self._reference(experience),
            dp_size,
            batch_num_tokens,
            global_batch_size,
            self._rollout(rollout_log_probs),
        )
        self._calls += 1
        device = log_probs.device
        # what the loss measured, nothing made up: NaN (not 0) for a loss that reports no clip
        clip = [metrics[k] for k in core.CLIP_METRICS if k in metrics]
        clip_ratio = torch.tensor(sum(clip) if clip else float("nan"), device=device)
        ppo_kl = masked_mean(-(log_probs - old_log_probs).detach(), action_mask, dim=None)
        if experience is not None:
            info = experience.info
            if "kl" in metrics:  # else OpenRLHF's own rollout-time kl stays
                info["kl"] = torch.tensor(metrics["kl"], device=device)
            for key, value in metrics.items():
                if key not in OPENRLHF_CORRECTION_METRICS:  # OpenRLHF logs those from the return value
                    info[METRIC_PREFIX + key] = torch.tensor(value, device=device)
        vllm_kl, is_filter_ratio = (
            torch.tensor(metrics[k], device=device) if k in metrics else None
            for k in OPENRLHF_CORRECTION_METRICS
        )
        return loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio

    def _reference(self, experience: Any) -> torch.Tensor | None:
        """pi_ref's log-probs: the experience's reference log-probs, or None (pi_ref = pi_old)."""
        if not self.use_reference:
            return None
        ref_logp = None if experience is None else experience.base_action_log_probs
        if ref_logp is None:
            raise RuntimeError(
                "RPG: --rpg.ref_update needs reference log-probs, but the experience has none "
                "(is the reference model running?)"
            )
        return ref_logp

    def _rollout(self, rollout_log_probs: torch.Tensor | None) -> torch.Tensor | None:
        """mu's log-probs for the correction (None with it off: no weight, no vllm_kl)."""
        correction = self.config.rollout_correction
        if not correction.enabled:
            return None
        if rollout_log_probs is None:
            raise RuntimeError(
                f"RPG: --algo.advantage.is_correction_level {correction.level} needs the engine's log-probs, "
                "but the experience has none (rollout_log_probs)"
            )
        return rollout_log_probs


class RPGActorPPOTrainer(ActorPPOTrainer):
    """OpenRLHF's actor trainer with the RPG loss in place of ``PolicyLoss``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor_loss_fn = RPGPolicyLoss.from_args(self.args)
        step_dump.attach(self)  # debug dumps for tests, only with RPG_STEP_DUMP_DIR

    def training_step(self, experience, kl_ctl: float, step: int, loss_batch_info=None) -> dict:
        """OpenRLHF's training step with the RPG loss; OpenRLHF's own KL term is off (kl_ctl = 0)."""
        if self.args.algo.kl.use_loss:
            raise RuntimeError("RPG: --algo.kl.use_loss must be off (the KL is inside the RPG loss)")
        self.actor_loss_fn.experience = experience
        try:
            return super().training_step(experience, 0.0, step, loss_batch_info)
        finally:
            self.actor_loss_fn.experience = None


# ----------------------------------------------------------------------------- weights
def _hf_module(actor: Any) -> torch.nn.Module:
    """The Hugging Face module inside an OpenRLHF ``Actor`` (``actor.model``: a DeepSpeed engine)."""
    from openrlhf.models import Actor

    if not isinstance(actor, Actor):
        raise TypeError(f"expected an openrlhf Actor, got {type(actor)}")
    engine = actor.model
    return getattr(engine, "module", engine)


def _zero3(strategy: Any) -> bool:
    return flags.get(strategy.args, "ds.zero_stage") == 3


def gather_state_dict(model: Any, strategy: Any) -> dict[str, torch.Tensor] | None:
    """Full parameters on CPU (gathered under ZeRO-3; every rank must call), on rank 0 only."""
    return gather_full_state_dict(_hf_module(model), zero3=_zero3(strategy))


# ----------------------------------------------------------------------------- Ray actors
class _RPGPolicyModelActor(_StockPolicyActorClass.__ray_actor_class__):
    """OpenRLHF's policy actor building :class:`RPGActorPPOTrainer` (and Schedule-Free AdamW)."""

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        args = strategy.args
        self._rpg_schedulefree = flags.get(args, "rpg.optimizer") == "schedulefree"
        sf = (
            schedule_free.schedulefree_initialize(args.actor.lr_warmup_ratio, max_steps)
            if self._rpg_schedulefree
            else contextlib.nullcontext()
        )
        with seam.swapped(_ppo_actor_mod, ActorPPOTrainer=RPGActorPPOTrainer), sf:  # seam actor_trainer
            super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        # Schedule-Free starts in eval mode with x = y: nothing to switch yet.

    def fit(self, kl_ctl: float = 0):
        """OpenRLHF's fit; Schedule-Free weights are y while training and x otherwise
        (generation, log-prob forward, evaluation, saving)."""
        if getattr(self, "_rpg_schedulefree", False):
            schedule_free.set_mode(self.actor.model, "train")
        try:
            return super().fit(0.0)
        finally:
            if getattr(self, "_rpg_schedulefree", False):
                schedule_free.set_mode(self.actor.model, "eval")

    def rpg_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The actor's full weights on rank 0 (all ranks must be called under ZeRO-3)."""
        return gather_state_dict(self.actor, self.strategy)


class _RPGReferenceModelActor(_StockReferenceActorClass.__ray_actor_class__):
    """OpenRLHF's reference actor whose weights can be replaced by the actor's (refresh)."""

    def rpg_load_state_dict(self, state: Any) -> int:
        """``state``: ``[ObjectRef]`` from ``ref_refresh.send`` (only rank 0 fetches it), copied into every
        rank's parameters."""
        n = ref_refresh.load_from_rank0(_hf_module(self.model), _zero3(self.strategy), state)["params"]
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return n

    def rpg_state_dict(self) -> dict[str, torch.Tensor] | None:
        return gather_state_dict(self.model, self.strategy)


RPGPolicyModelActor = ray.remote(num_gpus=1)(_RPGPolicyModelActor)
RPGReferenceModelActor = ray.remote(num_gpus=1)(_RPGReferenceModelActor)
