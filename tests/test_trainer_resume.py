"""A resumed RPG trainer refuses a refreshed reference schedule whose weights file is gone (it would
train on against the initial model). That a checkpoint carries the schedule and the reference weights
and a resume restores them exactly: tests/test_e2e_preemption.py (killed, resumed, compared)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def test_resume_without_reference_weights_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
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
    trainer = object.__new__(_RPGPPOTrainer)  # no __init__: no Ray, no models
    trainer.__dict__.update(
        args=SimpleNamespace(ckpt=SimpleNamespace(path=str(tmp_path), load_enable=True)),
        actor_model_group=SimpleNamespace(async_run_method=lambda method_name, **kw: [states]),
        reference_model_group=SimpleNamespace(), ref_schedule=core.ReferenceSchedule("every_k", k=1),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="weights are missing"):
        trainer.init_checkpoint_states()
