"""``--rpg.max_steps``: OpenRLHF's own ``PPOTrainer.fit`` loop with the budget, without Ray.

The trainer is the budgeted stock class ``rpg-train`` installs (and the RPG trainer), built without
``__init__``; only its collaborators are fakes: a sample generator that behaves like dynamic sampling
(several prompts consumed per accepted batch, exhaustion at the end of each episode), the actor group
(records checkpoints), and the step itself (``BasePPOTrainer.train_step`` patched to count). The loop,
the checkpoint decision and the resume logic are OpenRLHF's and the mixin's.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

BATCHES_PER_EPISODE = 4
EPISODES = 3  # the data allows 12 rollout steps


class FakeGenerator:
    """One accepted batch per call, 2-3 prompts consumed each (refills), exhausted every 4 batches."""

    def __init__(self) -> None:
        self.calls = 0

    def generate_samples(self, **_: object):
        self.calls += 1
        in_episode = (self.calls - 1) % BATCHES_PER_EPISODE
        sample = SimpleNamespace(
            sequences=torch.tensor([[self.calls]])
        )  # what the trainer reads of an Experience
        return [sample], 50.0, 2 + self.calls % 2, in_episode == BATCHES_PER_EPISODE - 1


class FakeLoader:
    def __len__(self) -> int:
        return 8

    def state_dict(self) -> dict:
        return {"pos": 0}

    def load_state_dict(self, state: dict) -> None:
        pass


class FakeActorGroup:
    def __init__(self, states: dict | None = None) -> None:
        self.saved: list[str] = []
        self.client_states: list[dict] = []
        self.states = states

    def async_run_method(self, method_name: str, **kwargs):
        if method_name == "save_checkpoint":
            self.saved.append(kwargs["tag"])
            self.client_states.append(kwargs.get("client_states") or {})
            return []
        if method_name == "get_checkpoint_states":
            return [self.states]
        return []


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch):
    """No Ray; ``train_step`` of OpenRLHF's base trainer counts the steps it is asked to run."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.trainer.ppo_trainer imports vllm
    import openrlhf.trainer.ppo_trainer as ppo_trainer_mod
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    steps: list[int] = []

    def train_step(self, rollout_samples, global_step):
        steps.append(global_step + 1)
        return {"policy_loss": 0.0}, global_step + 1

    monkeypatch.setattr(ppo_trainer_mod.BasePPOTrainer, "train_step", train_step)
    return steps


def make_trainer(cls, tmp_path, max_steps, save_steps=2, resume_states=None):
    args = SimpleNamespace(
        rpg=SimpleNamespace(max_steps=max_steps),
        ckpt=SimpleNamespace(
            save_steps=save_steps, load_enable=resume_states is not None, path=str(tmp_path)
        ),
        logger=SimpleNamespace(logging_steps=1),
        eval=SimpleNamespace(steps=math.inf),
        train=SimpleNamespace(num_episodes=EPISODES, max_epochs=1, batch_size=4),
        rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=4),
        algo=SimpleNamespace(dynamic_filtering_enable=True),
    )
    if resume_states is not None:
        (tmp_path / "_actor").mkdir(exist_ok=True)
    trainer = object.__new__(cls)
    trainer.__dict__.update(
        args=args, samples_generator=FakeGenerator(), prompts_dataloader=FakeLoader(), eval_dataloader=None,
        wandb_logger=None, tensorboard_logger=None, actor_model_group=FakeActorGroup(resume_states),
        critic_model_group=None, generate_kwargs={}, best_eval_metric_key="",
        best_eval_metric_value=float("-inf"), _latest_eval_metric_value=None,
        max_steps=EPISODES * BATCHES_PER_EPISODE * 2,  # OpenRLHF's data-based optimizer steps
    )  # fmt: skip
    trainer.broadcast_to_vllm = lambda: None
    return trainer


def budgeted_cls():
    from rpg_openrlhf.extras.trainer import stock_trainer

    return stock_trainer().__ray_actor_class__


def test_stops_at_the_budget_with_a_checkpoint_there(patched, tmp_path, caplog) -> None:
    trainer = make_trainer(budgeted_cls(), tmp_path, max_steps=5, save_steps=2)
    trainer.fit()
    assert patched == [1, 2, 3, 4, 5]  # 12 steps of data, 5 run
    assert trainer.samples_generator.calls == 5  # nothing generated after the last step
    # Every save_steps, plus step 5 itself although 5 % 2 != 0: Last = step 5.
    assert trainer.actor_model_group.saved == ["global_step2", "global_step4", "global_step5"]
    # The scheduler's length follows the budget: 5 rollouts x (2 x 4 / 4) optimizer steps.
    assert trainer.get_max_steps() == 10
    assert trainer.args.ckpt.save_steps == 2  # restored after the forced save


@pytest.mark.parametrize(("max_steps", "steps", "saved"), [(5, [], []), (7, [6, 7], ["global_step7"])])
def test_resume_trains_up_to_the_budget(patched, tmp_path, max_steps, steps, saved) -> None:
    """A resume of a run finished at step 5 trains nothing with the same budget and continues to a larger one."""
    states = {
        "episode": 1,
        "global_step": 5,
        "total_consumed_prompts": 12,
        "data_loader_state_dict": {"pos": 3},
    }
    trainer = make_trainer(budgeted_cls(), tmp_path, max_steps=max_steps, save_steps=10, resume_states=states)
    trainer.fit()
    assert patched == steps and trainer.actor_model_group.saved == saved
    assert trainer.samples_generator.calls == len(steps)


def test_without_a_budget_the_episodes_decide(patched, tmp_path) -> None:
    trainer = make_trainer(budgeted_cls(), tmp_path, max_steps=None, save_steps=5)
    trainer.fit()
    assert patched == list(range(1, 13))
    assert trainer.actor_model_group.saved == ["global_step5", "global_step10"]
    assert trainer.get_max_steps() == 24


def test_data_running_out_first_is_reported(patched, tmp_path, monkeypatch) -> None:
    from rpg_openrlhf.extras.run_length import RunLengthMixin

    logged: list[str] = []
    monkeypatch.setattr(RunLengthMixin, "_rpg_log", staticmethod(logged.append))
    trainer = make_trainer(budgeted_cls(), tmp_path, max_steps=20, save_steps=100)
    trainer.fit()
    assert patched == list(range(1, 13)) and trainer.actor_model_group.saved == []
    assert trainer.get_max_steps() == 24  # min(data, budget)
    assert any("data ran out at global step 12, before --rpg.max_steps 20" in m for m in logged), logged


def test_install_swaps_the_stock_trainer_for_every_stock_run(patched, monkeypatch) -> None:
    import openrlhf.trainer.ppo_trainer as ppo_trainer_mod
    import openrlhf.trainer.ray.ppo_actor as ppo_actor_mod

    from rpg_openrlhf.extras import run_length, trainer
    from rpg_openrlhf.extras.checkpoint import CheckpointCommitMixin, WorkerCheckpointMixin
    from rpg_openrlhf.plugin.trainer import RPGPPOTrainer

    stock, policy = ppo_trainer_mod.PPOTrainer, ppo_actor_mod.PolicyModelActor
    monkeypatch.setattr(ppo_trainer_mod, "PPOTrainer", stock)  # restored after the test
    monkeypatch.setattr(ppo_actor_mod, "PolicyModelActor", policy)
    assert trainer.enable(SimpleNamespace(rpg=SimpleNamespace(max_steps=3, loss="urkl"))) is False
    assert ppo_trainer_mod.PPOTrainer is stock
    assert issubclass(ppo_actor_mod.PolicyModelActor.__ray_actor_class__, WorkerCheckpointMixin)  # every run
    assert trainer.enable(SimpleNamespace(rpg=SimpleNamespace(max_steps=None, loss=None))) is True
    swapped = ppo_trainer_mod.PPOTrainer.__ray_actor_class__
    assert issubclass(swapped, run_length.RunLengthMixin) and issubclass(swapped, CheckpointCommitMixin)
    assert issubclass(swapped, stock.__ray_actor_class__)
    # RPG runs: the RPG trainer carries the budget, outermost, then the commit, then the RPG
    # checkpoint hooks (the budget's last save and the reference file are inside the commit).
    mro = RPGPPOTrainer.__ray_actor_class__.__mro__
    from rpg_openrlhf.plugin.trainer import _RPGPPOTrainer

    assert mro.index(run_length.RunLengthMixin) < mro.index(CheckpointCommitMixin) < mro.index(_RPGPPOTrainer)
