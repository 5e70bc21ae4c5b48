"""Off-policy RPG inside OpenRLHF, without Ray: OpenRLHF's is_correction flags become the core's
correction, invalid combinations fail before Ray naming both flags, make_experience runs no actor
forward with ``--rpg.old_logp engine``, and the async generator stops at the rollout-step budget. (The
runs through the real pipeline, where the engines return the processed log-probs of the sampled
tokens with the correction off: tests/test_e2e_offpolicy.py.)"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from test_rpg_flags import _nested, dry_run, dry_run_error

from rpg_openrlhf.plugin import flags


@pytest.fixture(scope="module", autouse=True)
def _stand_ins():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.trainer.ray imports vllm at import time


# ----------------------------------------------------------------------------- flags -> core
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {"level": "off", "mode": "mask", "gating": "ratio", "low": 0.5, "high": 5.0}),
        (["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.8", "1.25"],
         {"level": "seq", "mode": "mask", "gating": "ratio", "low": 0.8, "high": 1.25}),
        (["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"],
         {"level": "token", "mode": "clip", "gating": "ratio", "low": 0.5, "high": 5.0}),
        # one threshold is HIGH (OpenRLHF: LOW 0), the divergence gatings' form
        (["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "binary_kl",
          "--algo.advantage.is_correction_threshold", "0.01"],
         {"level": "seq", "mode": "mask", "gating": "binary_kl", "low": 0.0, "high": 0.01}),
    ],
)  # fmt: skip
def test_openrlhf_correction_flags_become_the_core_correction(argv, expected, capsys):
    cfg = dry_run(["--rpg.loss", "urkl", *argv], capsys)
    assert cfg["rpg"]["loss_config"]["rollout_correction"] == expected
    assert cfg["rpg"]["engine_logprobs_requested"] is (expected["level"] != "off")
    assert cfg["rpg"]["old_logp"] == "actor"


_LEVEL, _MODE = "--algo.advantage.is_correction_level", "--algo.advantage.is_correction_mode"
_GATING, _THRESHOLD = "--algo.advantage.is_correction_gating", "--algo.advantage.is_correction_threshold"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([_LEVEL, "token", "--rpg.weight_level", "sequence"], [_LEVEL, "--rpg.weight_level"]),
        ([_LEVEL, "seq", "--rpg.old_logp", "engine"], [_LEVEL, "--rpg.old_logp"]),
        (["--train.async_enable"], ["--train.async_enable", "--rpg.old_logp", _LEVEL]),
        (["--train.async_enable", "--train.partial_rollout_enable"], ["--train.async_enable", "--rpg.old_logp"]),
        ([_LEVEL, "seq", _MODE, "clip"], [_MODE, _LEVEL]),
        ([_LEVEL, "token", _MODE, "clip", _GATING, "tv", _THRESHOLD, "0.1"], [_MODE, _GATING]),
        ([_LEVEL, "token", _GATING, "tv", _THRESHOLD, "0.1", "0.2"], [_GATING, _THRESHOLD]),
        ([_LEVEL, "token", _THRESHOLD, "2", "1"], [_THRESHOLD]),
        (["--rpg.old_logp", "bypass"], ["--rpg.old_logp"]),
    ],
)  # fmt: skip
def test_invalid_offpolicy_combinations_fail_naming_both_flags(argv, named, capsys):
    err = dry_run_error(["--rpg.loss", "urkl", *argv], capsys)
    assert err.count("\n") == 1 and err.startswith("rpg-train: error: "), err  # one line
    for flag in named:
        assert flag in err, (flag, err)


def test_max_steps_under_async_needs_rpg(capsys):
    """(with --rpg.loss it runs: tests/test_e2e_offpolicy.py's async run)"""
    err = dry_run_error(["--train.async_enable", "--rpg.max_steps", "3"], capsys)
    assert "--rpg.max_steps" in err and "--train.async_enable" in err and "--rpg.loss" in err


def test_enable_applies_the_engine_logprobs_stage_only_when_needed(monkeypatch):
    from rpg_openrlhf.plugin import enable

    applied: list[str] = []
    monkeypatch.setattr(enable.seam, "apply", lambda patches, stage: applied.append(stage))
    for overrides, stages in (
        ({}, ["rpg"]),
        ({"rpg.old_logp": "engine"}, ["rpg", "engine-logprobs"]),
        ({"algo.advantage.is_correction_level": "seq"}, ["rpg"]),  # OpenRLHF asks the engines itself
    ):
        applied.clear()
        enable.enable(_nested(**{"rpg.loss": "urkl", **overrides}))
        assert applied == stages, overrides


# ----------------------------------------------------------------------------- engine log-probs
class _NoForward:
    """An actor group that must not be asked for a forward (``--rpg.old_logp engine``)."""

    def async_run_method_batch(self, **kwargs):
        raise AssertionError(f"the actor was asked for {kwargs.get('method_name')}")

    def async_run_method(self, **kwargs):
        raise AssertionError(f"the actor was asked for {kwargs.get('method_name')}")


def _samples(seed: int, b: int = 2, t: int = 5):
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:] = False
    rollout = torch.where(mask, -torch.rand(b, t, generator=g) * 2, 0.0)
    return Experience(
        sequences=torch.randint(3, 9, (b, t + 3), generator=g), attention_mask=torch.ones(b, t + 3, dtype=torch.long),
        action_mask=mask, rollout_log_probs=rollout, rewards=torch.tensor([1.0, 0.0]), info={},
    )  # fmt: skip


@pytest.mark.parametrize("duplicates", [1, 2])
def test_make_experience_takes_pi_old_from_the_engine(duplicates, monkeypatch):
    import ray
    from openrlhf.trainer.ppo_utils import experience_maker as em
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from rpg_openrlhf.plugin.trainer import RPGExperienceMaker

    monkeypatch.setattr(ray, "put", lambda x: x)  # no Ray: objects are their own refs
    monkeypatch.setattr(em.ray, "get", lambda refs: refs)
    args = _nested(**{"rpg.loss": "urkl", "rpg.old_logp": "engine"})
    args.ds = SimpleNamespace(ring_attn_size=duplicates, tensor_parallel_size=1)
    args.train.colocate_all = args.train.colocate_actor_ref = False
    args.algo.kl.estimator = "k1"
    maker = RPGExperienceMaker(
        _NoForward(), None, None, None, FixedKLController(0.0), SimpleNamespace(args=args), None
    )
    batches = [_samples(1), _samples(2)]
    engine = [b.rollout_log_probs.clone() for b in batches]
    out = maker.make_experience(batches)
    for experience, logp in zip(out, engine):
        assert torch.equal(experience.action_log_probs, logp) and experience.base_action_log_probs is None
    batches[0].rollout_log_probs = None
    with pytest.raises(RuntimeError, match="rollout_log_probs"):
        maker.make_experience(batches)


# ----------------------------------------------------------------------------- async budget
class _Generator:
    def __init__(self) -> None:
        self.calls = 0

    def generate_samples(self, **kwargs):
        self.calls += 1
        return [f"batch{self.calls}"], None, 1, False


@pytest.mark.parametrize(("start", "budget", "expected"), [(0, 3, 3), (2, 3, 1), (3, 3, 0), (0, None, 5)])
def test_async_generator_produces_up_to_the_budget(start, budget, expected):
    from rpg_openrlhf.extras.async_budget import GeneratorBudgetMixin

    actor = GeneratorBudgetMixin()
    actor.args = _nested(**{"rpg.max_steps": budget})
    actor.samples_generator = generator = _Generator()
    actor.rpg_budget_from(start)
    results = [generator.generate_samples() for _ in range(5)]
    assert sum(bool(r[0]) for r in results) == expected
    assert all(r == ([], None, 0, True) for r in results[expected:])  # reported exhausted from then on
    actor.rpg_budget_from(0)  # a second call does not reset the count
    assert (generator.generate_samples()[0] != []) is (budget is None)


# ----------------------------------------------------------------------------- Ray actor classes
def _broken_super_methods(cls: type) -> list[str]:
    """Methods of the actor class ``cls`` that would run with a broken zero-argument ``super()``.

    Ray wraps every method of an actor class when it builds the actor, and pickles the wrappers with
    the functions they hold. A function of an OpenRLHF ``@ray.remote`` class cannot be pickled by
    reference (its module binds the class name to the ActorClass, not to the plain class), so the
    worker gets a copy of it whose ``__class__`` cell is a copy of the class, not the one in the
    instance's MRO: ``super()`` in it raises TypeError. Any such method must be redefined below it."""
    import sys

    from ray.actor import ActorClass

    broken = []
    for name in dir(cls):
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        fn = vars(owner).get(name) if owner else None
        if not inspect.isfunction(fn) or "__class__" not in fn.__code__.co_freevars:
            continue
        if isinstance(getattr(sys.modules[owner.__module__], owner.__name__, None), ActorClass):
            broken.append(f"{owner.__qualname__}.{name}")
    return broken


def test_rpg_actor_classes_hold_no_inherited_super_call():
    from rpg_openrlhf.plugin import actor, async_trainer, trainer

    classes = (actor._RPGPolicyModelActor, actor._RPGReferenceModelActor, trainer._RPGBudgetedPPOTrainer,
               async_trainer._RPGTrainingActor, async_trainer._RPGGenerateSamplesActor,
               async_trainer._RPGPPOTrainerAsync)  # fmt: skip
    assert {c.__name__: _broken_super_methods(c) for c in classes} == {c.__name__: [] for c in classes}


def test_a_correction_threshold_of_three_values_is_refused():
    """OpenRLHF's --algo.advantage.is_correction_threshold is HIGH or LOW HIGH (one value, and the default
    band: test_openrlhf_correction_flags_become_the_core_correction)."""
    with pytest.raises(ValueError, match="HIGH or LOW HIGH"):
        flags.correction_threshold(SimpleNamespace(**{"algo.advantage.is_correction_threshold": [1, 2, 3]}))
