"""The seam to OpenRLHF & co.: every patch's upstream is still what it was checked against, the
version check stops a run before anything starts."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.common import seam

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("patch", seam.registry(), ids=lambda p: p.key)
def test_upstream_of_every_patch_is_unchanged(patch: seam.Patch) -> None:
    """Signature and the lines the patch depends on, read from the installed upstream source."""
    assert seam.check_patch(patch) is None


def _copy_of(module: str, tmp_path: Path) -> Path:
    copy = tmp_path / Path(seam._source_file(module)).name
    shutil.copy(seam._source_file(module), copy)
    return copy


def test_a_modified_upstream_copy_names_the_patch_to_recheck(tmp_path: Path) -> None:
    patch = next(p for p in seam.registry() if p.key == "advantages")
    copy = _copy_of(patch.upstream.partition(":")[0], tmp_path)
    assert seam.check_patch(patch, origin=copy) is None  # the unmodified copy passes
    text = copy.read_text()

    # a changed line the patch depends on
    copy.write_text(
        text.replace("experience.kl = None", "experience.kl = None if experience.kl is None else None", 1)
    )
    msg = seam.check_patch(patch, origin=copy)
    assert msg is not None and "[advantages]" in msg and "changed" in msg and "Re-check" in msg

    # a line that is gone
    copy.write_text(text.replace("apply_length_penalties(experiences, args)", "pass"))
    msg = seam.check_patch(patch, origin=copy)
    assert msg is not None and "no line holds 'apply_length_penalties(experiences, args)'" in msg

    # an unrelated edit elsewhere in the function does not disturb it
    copy.write_text(text.replace("# ── Length penalties", "# ── length penalties (edited comment)"))
    assert seam.check_patch(patch, origin=copy) is None


def test_registry_is_consistent_and_documented() -> None:
    keys = [p.key for p in seam.registry()]
    assert len(keys) == len(set(keys))
    for p in seam.registry():
        assert p.kind in seam.KINDS and p.package in seam.FINGERPRINTED_AT, p.key
        assert p.why and p.why_no_extension_point and p.anchors and len(p.fingerprint) == 16, p.key
        if p.kind == "replace" and p.stage is not None:
            assert p.stage and p.hook_module, p.key
            module, _, name = p.apply.partition(":")  # defined there (read, not imported: no side effects)
            assert seam.upstream_source(f"{module}:{name}")[1][0].startswith(f"def {name}("), p.key
    # docs/contracts.md carries the registry's table as it is
    assert seam.table() in (REPO / "docs" / "contracts.md").read_text()


def test_apply_stage_rpg_swaps_the_classes_and_only_those() -> None:
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins
    from rpg_openrlhf.plugin.patches import PATCHES

    provide_stand_ins()
    import openrlhf.trainer.ppo_trainer as ppo_trainer_mod
    import openrlhf.trainer.ppo_trainer_async as async_mod
    import openrlhf.trainer.ray.launcher as launcher_mod
    import openrlhf.trainer.ray.ppo_actor as ppo_actor_mod

    saved = (ppo_actor_mod.PolicyModelActor, launcher_mod.ReferenceModelActor, ppo_trainer_mod.PPOTrainer)
    saved_async = (async_mod.PPOTrainerAsync, async_mod.GenerateSamplesActor, async_mod.TrainingActor)
    try:
        from rpg_openrlhf.plugin.actor import RPGPolicyModelActor, RPGReferenceModelActor
        from rpg_openrlhf.plugin.trainer import RPGPPOTrainer

        applied = seam.apply(PATCHES, "rpg")
        assert applied == ["policy_actor", "reference_actor", "ppo_trainer", "ppo_trainer_async"]
        assert ppo_actor_mod.PolicyModelActor is RPGPolicyModelActor
        assert launcher_mod.ReferenceModelActor is RPGReferenceModelActor
        assert ppo_trainer_mod.PPOTrainer is RPGPPOTrainer and async_mod.PPOTrainerAsync is not saved_async[0]
        # the async actors are swapped only while PPOTrainerAsync builds them (seam async_actors)
        assert (async_mod.GenerateSamplesActor, async_mod.TrainingActor) == saved_async[1:]
    finally:
        ppo_actor_mod.PolicyModelActor, launcher_mod.ReferenceModelActor, ppo_trainer_mod.PPOTrainer = saved
        async_mod.PPOTrainerAsync = saved_async[0]
    with pytest.raises(ValueError, match="stage 'nope'"):
        seam.apply(PATCHES, "nope")


# ----------------------------------------------------------------------------- versions
def test_version_outside_the_checked_set_stops_rpg_train_before_anything_runs(monkeypatch, capsys) -> None:
    from rpg_openrlhf.common.deferred_main import DeferredMain
    from rpg_openrlhf.cpu_backend import standins
    from rpg_openrlhf.launch import cli

    ran = []
    monkeypatch.setattr(DeferredMain, "run", lambda *a, **k: ran.append("train_ppo_ray"))
    monkeypatch.setattr(standins, "provide_stand_ins", lambda: ran.append("stand-ins"))
    monkeypatch.setitem(seam.CHECKED_VERSIONS, "openrlhf", ("0.12.0",))
    monkeypatch.delenv("RPG_ALLOW_UNCHECKED_VERSIONS", raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--dry-run"])
    assert exc.value.code == 2 and ran == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "openrlhf 0.11.2 is installed; checked: 0.12.0" in err
    assert "RPG_ALLOW_UNCHECKED_VERSIONS=1" in err

    monkeypatch.setenv("RPG_ALLOW_UNCHECKED_VERSIONS", "1")
    cli.main(["--dry-run"])  # runs (train_ppo_ray's code is the stub), after one warning
    assert ran == ["stand-ins", "train_ppo_ray"]
    assert (
        "WARNING: rpg-train with unchecked versions (openrlhf 0.11.2 is installed; checked: 0.12.0)"
        in capsys.readouterr().err
    )


def test_rpg_eval_checks_lm_eval_before_running(monkeypatch, capsys, tmp_path: Path) -> None:
    from rpg_eval import cli
    from rpg_eval.run import patches

    monkeypatch.setitem(patches.CHECKED_VERSIONS, "lm_eval", ("0.5.0",))
    monkeypatch.delenv("RPG_ALLOW_UNCHECKED_VERSIONS", raising=False)
    out = tmp_path / "out"
    assert cli.main(["run", "--checkpoints", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rpg-eval: error: lm_eval 0.4.13 is installed; checked: 0.5.0")
    assert not out.exists()  # nothing ran


# ----------------------------------------------------------------------------- the rpg estimator
def _experiences(rewards: torch.Tensor, order: list[list[int]], t: int = 6):
    from openrlhf.trainer.ppo_utils.experience import Experience

    exps = []
    for idx in order:
        b = len(idx)
        mask = torch.ones(b, t, dtype=torch.bool)
        mask[0, 2:] = False  # a short response (length penalty applies to it differently)
        exps.append(
            Experience(
                sequences=torch.zeros(b, t + 2, dtype=torch.long),
                attention_mask=torch.ones(b, t + 2, dtype=torch.long),
                action_mask=mask,
                rewards=rewards[idx].clone(),
                response_length=mask.sum(-1).float(),
                total_length=mask.sum(-1).float() + 2,
                kl=torch.zeros(b, t),
                index=idx,
                info={},
            )
        )
    return exps


@pytest.mark.parametrize(("baseline", "upstream"), [("mean", "dr_grpo"), ("loo", "rloo")])
def test_rpg_estimator_equals_openrlhfs_own_estimator(baseline: str, upstream: str) -> None:
    """--rpg.advantage mean / loo = OpenRLHF's dr_grpo / rloo (neither whitens), with the overlong
    length penalty on: the RPG pass is OpenRLHF's, only the baseline is the core's. (The reward clip
    is inactive here: RPG clips before its baseline, OpenRLHF after; trainer.py.)"""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # openrlhf.models imports flash_attn (absent on CPU): not left to another test
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    from rpg_openrlhf.plugin.trainer import RPGExperienceMaker

    def args(estimator: str) -> SimpleNamespace:
        return SimpleNamespace(
            algo=SimpleNamespace(
                advantage=SimpleNamespace(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False),
                kl=SimpleNamespace(use_loss=False),
            ),
            rollout=SimpleNamespace(n_samples_per_prompt=3, max_new_tokens=6),
            reward=SimpleNamespace(clip_range=(-10.0, 10.0), overlong_buffer_len=3, overlong_penalty_factor=1.0,
                                   stop_properly_penalty_coef=None),
            rpg=SimpleNamespace(advantage=baseline),
        )  # fmt: skip

    raw = torch.tensor([1.0, 0.0, 2.0, 1.0, 1.0, -3.0])
    order = [[4, 0, 2], [1, 5, 3]]
    ours = RPGExperienceMaker(
        None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args("rpg")), None
    )
    theirs = RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args(upstream)), None
    )  # fmt: skip
    got = ours.compute_advantages_and_returns(_experiences(raw, order))
    want = theirs.compute_advantages_and_returns(_experiences(raw, order))
    for g, w in zip(got, want):
        assert torch.allclose(g.advantages, w.advantages.to(g.advantages.dtype), atol=1e-6)
        assert torch.equal(g.info["group_reward_std"], w.info["group_reward_std"])
        assert g.kl is None
