"""extras/grad_boundary.py: which runs it applies to, and that each micro-batch is marked as DeepSpeed
needs it (the gradient itself is checked through the real pipeline by tests/test_e2e_ranks.py's ZeRO-2
run, which fails without it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rpg_openrlhf.extras import grad_boundary


def args(dynamic: bool, stage: int) -> SimpleNamespace:
    return SimpleNamespace(
        train=SimpleNamespace(dynamic_batch_enable=dynamic), ds=SimpleNamespace(zero_stage=stage)
    )


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dynamic", [False, True])
def test_only_dynamic_batching_at_zero_1_and_2(dynamic: bool, stage: int) -> None:
    assert grad_boundary.needed(args(dynamic, stage)) is (dynamic and stage in (1, 2))


def test_every_micro_batch_but_the_steps_last_is_no_boundary() -> None:
    marks: list[bool] = []
    calls: list[int] = []
    engine = SimpleNamespace(set_gradient_accumulation_boundary=marks.append)
    trainer = SimpleNamespace(
        actor=SimpleNamespace(model=engine),
        # two optimizer steps of 3 and 2 micro-batches, as OpenRLHF's setup_dynamic_batch lays them out
        replay_buffer=SimpleNamespace(dynamic_optimizer_step=[0, 0, 1, 0, 1]),
        training_step=lambda experience, kl_ctl, step, info=None: calls.append(step) or {"step": step},
    )
    grad_boundary.attach(trainer)
    results = [trainer.training_step(None, 0.0, step) for step in range(5)]
    assert marks == [False, False, True, False, True]
    assert calls == [0, 1, 2, 3, 4] and [r["step"] for r in results] == calls
