"""The RPG trainer's reference model: :class:`ReferenceRefresh` (``--rpg.ref_update``) and :class:`DebugCapture`.

:class:`ReferenceRefresh` is the trainer's view of its reference: the ``core.ReferenceSchedule`` observed
once per global step; on refresh the actor's full weights are put once and copied into every reference
actor through reference rank 0 (``ref_refresh.send``). It is also the trainer's checkpoint part
(``extras.checkpoint.CheckpointCommitMixin``): OpenRLHF's checkpoint holds the actor only and the
reference actors are rebuilt from the initial model on start, so without it a ``--ckpt.load_enable``
run would restart every_k / kl_threshold from step 0 with pi_ref = the initial model. The schedule goes
into the checkpoint's ``client_states``; the weights (after a refresh) into the store's reference files.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ray
import torch
from openrlhf.utils.logging_utils import init_logger

from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.extras.checkpoint import CheckpointStore
from rpg_openrlhf.plugin import flags, ref_refresh

logger = init_logger(__name__)

#: Keys the RPG trainer adds to OpenRLHF's checkpoint ``client_states``.
STATE_SCHEDULE = "rpg_ref_schedule"
STATE_WEIGHTS = "rpg_ref_weights"


class ReferenceRefresh:
    """The reference of ``trainer`` (its ``ref_schedule``, ``actor_model_group``, ``reference_model_group``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    @property
    def schedule(self) -> Any:
        return self.trainer.ref_schedule

    @property
    def reference_group(self) -> Any:
        return self.trainer.reference_model_group

    # -- the weight transfer ------------------------------------------------------------------------
    def actor_state_dict(self) -> dict[str, torch.Tensor]:
        group = self.trainer.actor_model_group
        sleep = bool(self.trainer.args.ds.enable_sleep)  # actor states are offloaded between fits
        if sleep:
            ray.get(group.async_run_method(method_name="reload_states"))
        try:
            results = ray.get(group.async_run_method(method_name="rpg_state_dict"))
        finally:
            if sleep:
                ray.get(group.async_run_method(method_name="offload_states"))
        state = next((r for r in results if r is not None), None)
        if state is None:
            raise RuntimeError("RPG: the actor group returned no weights")
        return state

    def reference_state_dict(self) -> dict[str, torch.Tensor]:
        results = ray.get(self.reference_group.async_run_method(method_name="rpg_state_dict"))
        return next(r for r in results if r is not None)

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Every reference rank gets ``state``, put once, through rank 0."""
        ray.get(ref_refresh.send(self.reference_group, ray.put(state)))

    def refresh(self) -> None:
        """pi_ref <- pi_theta."""
        self.load(self.actor_state_dict())

    # -- once per global step -------------------------------------------------------------------------
    def after_train_step(self, status: dict, global_step: int, capture: DebugCapture | None) -> None:
        """Observe the step's KL, refresh when the schedule says so, log it in ``status``."""
        kl = status.get("kl")
        refresh = self.schedule.observe(None if kl is None else float(kl))
        capture = capture if self.reference_group is not None else None
        before = self.reference_state_dict() if capture else None
        if refresh:
            self.refresh()
            logger.info(f"RPG: reference refreshed at global step {global_step} (pi_ref <- pi_theta)")
        if capture:
            capture.refresh(
                global_step, refresh, self.actor_state_dict(), before, self.reference_state_dict()
            )
        status["rpg/ref_refreshed"] = float(refresh)
        status["rpg/ref_refreshes"] = float(len(self.schedule.refreshes))
        if self.schedule.mode == "kl_threshold":
            running = self.schedule.running_kl
            status["rpg/ref_running_kl"] = 0.0 if running != running else running

    # -- the checkpoint part ----------------------------------------------------------------------------
    def add_to_checkpoint(self, store: CheckpointStore, client_states: dict, tag: str) -> None:
        """The schedule state and, after a refresh, the reference weights file (written first)."""
        schedule = self.schedule
        client_states[STATE_SCHEDULE] = schedule.state_dict()
        client_states.pop(STATE_WEIGHTS, None)
        if not schedule.refreshes or self.reference_group is None:
            return  # pi_ref is still the initial model, which a resumed run loads anyway
        path = store.references.write(tag, schedule.last_refresh, self.reference_state_dict)
        client_states[STATE_WEIGHTS] = os.path.basename(path)
        logger.info(
            f"RPG: checkpoint {tag}: reference schedule (step {schedule.step}, refreshes "
            f"{schedule.refreshes}) and reference weights {path}"
        )

    def after_checkpoint(self, store: CheckpointStore, client_states: dict) -> None:
        store.references.prune(keep=client_states.get(STATE_WEIGHTS, ""))

    def restore(self, store: CheckpointStore, states: dict) -> None:
        """The checkpoint's schedule and reference weights back; refuses a refreshed schedule whose
        weights are missing (training on against the wrong pi_ref without a word is worse)."""
        schedule = self.schedule
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
        if not schedule.refreshes or self.reference_group is None:
            return
        path = store.references.path(states.get(STATE_WEIGHTS))
        if path is None or not os.path.exists(path):
            raise RuntimeError(
                f"RPG: the checkpoint's reference was refreshed at steps {schedule.refreshes} but its "
                f"weights are missing ({path or 'not recorded'}); resume from another checkpoint"
            )
        payload = store.references.load(path)
        self.load(payload["state_dict"])
        logger.info(f"RPG: resumed reference weights (refresh at step {payload['refresh_step']}) from {path}")


class DebugCapture:
    """``--rpg.capture_dir`` (or ``RPG_CAPTURE_DIR``): what the trainer ran with (``trainer.json``) and, at
    every step with a reference model, the weights around the refresh (``refresh_step<N>.pt``), for tests."""

    def __init__(self, directory: str) -> None:
        self.dir = directory

    @staticmethod
    def directory(args: Any) -> str | None:
        return flags.get(args, "rpg.capture_dir") or os.environ.get("RPG_CAPTURE_DIR") or None

    def trainer(self, trainer: Any) -> None:
        os.makedirs(self.dir, exist_ok=True)
        args = trainer.args
        with open(os.path.join(self.dir, "trainer.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "reference_model": trainer.reference_model_group is not None,
                    "advantage_estimator": args.algo.advantage.estimator,
                    "kl_ctl": trainer.kl_ctl.value,
                    "rpg": flags.resolved_config(args),
                    "trainer": type(trainer).__name__,
                },
                f,
                indent=1,
                default=str,
            )

    def refresh(self, global_step: int, refreshed: bool, actor: dict, before: dict, after: dict) -> None:
        os.makedirs(self.dir, exist_ok=True)
        record = {"global_step": global_step, "refreshed": refreshed, "actor": actor, "ref_before": before,
                  "ref_after": after}  # fmt: skip
        path = os.path.join(self.dir, f"refresh_step{global_step:05d}.pt")
        with atomic_write(path, "wb") as f:
            torch.save(record, f)
