"""A step's end is one function that every trainer calls (issue #27, item 3): the stock, the synchronous RPG
and the async RPG trainers call the same parts in the same order, written out below."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _trainers() -> dict[str, type]:
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from rpg_openrlhf.extras.trainer import stock_trainer
    from rpg_openrlhf.plugin.async_trainer import RPGTrainingActor
    from rpg_openrlhf.plugin.trainer import RPGPPOTrainer

    return {
        "stock": stock_trainer().__ray_actor_class__,
        "rpg": RPGPPOTrainer.__ray_actor_class__,
        "rpg_async": RPGTrainingActor.__ray_actor_class__,
    }


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every part's step-end call, in order (OpenRLHF's save records the save_steps it read)."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    from rpg_openrlhf.extras import checkpoint as commit
    from rpg_openrlhf.extras import run_length
    from rpg_openrlhf.plugin import reference

    calls: list[tuple] = []

    def openrlhf_save(self, global_step, logs_dict=None, client_states=None):
        calls.append(("openrlhf save", global_step, self.args.ckpt.save_steps))

    monkeypatch.setattr(BasePPOTrainer, "save_logs_and_checkpoints", openrlhf_save)
    monkeypatch.setattr(
        commit.CheckpointStore, "begin", lambda self, tag, rewrite=True: calls.append(("begin", tag))
    )
    monkeypatch.setattr(
        commit.CheckpointStore, "commit", lambda self, tag, step, rotate=True: calls.append(("commit", tag))
    )
    monkeypatch.setattr(
        reference.ReferenceRefresh,
        "add_to_checkpoint",
        lambda self, store, cs, tag: calls.append(("reference", tag)),
    )
    monkeypatch.setattr(
        reference.ReferenceRefresh,
        "after_checkpoint",
        lambda self, store, cs: calls.append(("prune references",)),
    )
    monkeypatch.setattr(run_length.StepBudget, "reached", lambda self: calls.append(("budget reached",)))
    return calls


@pytest.mark.parametrize("name", ["stock", "rpg", "rpg_async"])
def test_every_trainer_ends_a_step_through_the_same_parts_in_order(recorded, name: str, tmp_path) -> None:
    trainer = object.__new__(_trainers()[name])  # no __init__: no Ray, no models
    trainer.__dict__.update(
        args=SimpleNamespace(ckpt=SimpleNamespace(path=str(tmp_path), save_steps=2), rpg=SimpleNamespace(max_steps=3)),
        ref_schedule=None, reference_model_group=None,
    )  # fmt: skip
    for step in (1, 2, 3):  # 2: a regular save; 3: the budget's last step, saved although 3 % 2 != 0
        trainer.save_logs_and_checkpoints(step, {}, {"global_step": step})
    rpg = name != "stock"
    expected = [("openrlhf save", 1, 2)]
    for step, save_steps in ((2, 2), (3, 1)):
        expected += [("begin", f"global_step{step}")]
        expected += [("reference", f"global_step{step}")] if rpg else []
        expected += [("openrlhf save", step, save_steps)]
        expected += [("prune references",)] if rpg else []
        expected += [("commit", f"global_step{step}")]
    expected += [("budget reached",)]
    assert recorded == expected
    assert trainer.args.ckpt.save_steps == 2  # restored after the budget's save
