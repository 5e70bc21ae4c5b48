"""The RPG trainer's checkpoints: a run resumed from an OpenRLHF checkpoint restores the reference
schedule state and the reference weights, and refuses when the weights are missing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

# --------------------------------------------------------------------------- resume


class _Group:
    """A stand-in for a Ray actor group: records the calls, returns ready values."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def async_run_method(self, method_name: str, **kwargs):
        self.calls.append((method_name, kwargs))
        if method_name == "rpg_state_dict":
            return [{"w": torch.ones(2)}]
        return []


def test_checkpoint_carries_reference_schedule_and_weights(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "put", lambda obj: obj)
    from rpg_openrlhf import core
    from rpg_openrlhf.plugin.trainer import _RPGBudgetedPPOTrainer as _RPGPPOTrainer

    schedule = core.ReferenceSchedule("every_k", k=3)
    for _ in range(4):
        schedule.observe(0.01)  # refreshed at step 3
    actor, reference = _Group(), _Group()
    args = SimpleNamespace(
        logger=SimpleNamespace(logging_steps=1),
        ckpt=SimpleNamespace(save_steps=1, path=str(tmp_path)),
        ds=SimpleNamespace(enable_sleep=False),
    )
    # An instance without __init__ (no Ray, no models): the overrides call super(), which a
    # SimpleNamespace standing in for self would not allow.
    trainer = object.__new__(_RPGPPOTrainer)
    trainer.__dict__.update(
        args=args, wandb_logger=None, tensorboard_logger=None, best_eval_metric_key=None,
        best_eval_metric_value=None, _latest_eval_metric_value=None, actor_model_group=actor,
        critic_model_group=None, reference_model_group=reference, ref_schedule=schedule,
    )  # fmt: skip
    trainer.save_logs_and_checkpoints(4, {}, {"global_step": 4})
    saved = [kw for name, kw in actor.calls if name == "save_checkpoint"]
    assert saved, "no checkpoint was saved"
    states = saved[0]["client_states"]
    assert any(v == schedule.state_dict() for v in states.values()), sorted(states)
    reference_saved = [n for n, _ in reference.calls if n in ("save_checkpoint", "rpg_state_dict")]
    assert reference_saved or any(p.suffix == ".pt" for p in tmp_path.rglob("*")), (
        "reference weights not saved"
    )

    # Resume: a fresh schedule and fresh reference actors get the checkpoint's state back.
    (tmp_path / "_actor").mkdir(exist_ok=True)
    args.ckpt.load_enable = True
    resumed_actor, resumed_reference = _Group(), _Group()
    resumed_actor.async_run_method = lambda method_name, **kw: (
        [states] if method_name == "get_checkpoint_states" else []
    )
    fresh = core.ReferenceSchedule("every_k", k=3)
    resumed = object.__new__(_RPGPPOTrainer)
    resumed.__dict__.update(
        args=args,
        actor_model_group=resumed_actor,
        reference_model_group=resumed_reference,
        ref_schedule=fresh,
    )
    assert resumed.init_checkpoint_states()["global_step"] == 4
    assert fresh.state_dict() == schedule.state_dict()
    (load,) = [kw for name, kw in resumed_reference.calls if name == "rpg_load_state_dict"]
    assert torch.equal(load["state"][0]["w"], torch.ones(2))  # [state]: ref_refresh.send
    assert fresh.observe(0.01) is False and fresh.observe(0.01) is True  # step 6 = 3 after the refresh


def test_resume_without_reference_weights_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A refreshed schedule whose weights file is gone must not resume against the initial model."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    from rpg_openrlhf import core
    from rpg_openrlhf.plugin.trainer import _RPGBudgetedPPOTrainer as _RPGPPOTrainer

    saved = core.ReferenceSchedule("every_k", k=1)
    saved.observe(0.0)
    (tmp_path / "_actor").mkdir()
    states = {"global_step": 1, "rpg_ref_schedule": saved.state_dict(), "rpg_ref_weights": "global_step1.pt"}
    actor = _Group()
    actor.async_run_method = lambda method_name, **kw: [states]
    trainer = object.__new__(_RPGPPOTrainer)
    trainer.__dict__.update(
        args=SimpleNamespace(ckpt=SimpleNamespace(path=str(tmp_path), load_enable=True)),
        actor_model_group=actor, reference_model_group=_Group(),
        ref_schedule=core.ReferenceSchedule("every_k", k=1),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="weights are missing"):
        trainer.init_checkpoint_states()
