"""Checkpoints under hostile hands (issue 31, items 2, 3, 5), without Ray: a committed checkpoint with
files added to it is resumed and never deleted; a directory the run did not write is left in place; no
save goes through a symbolic link planted in the run directory; a resume with other settings than the
run's is refused before Ray, naming them (rpg-train in-process, ``ray.init`` booby-trapped)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_checkpoint_commit import _prepare, _trainer, committed, write_tag
from test_launch_rejects_before_ray import no_ray  # noqa: F401 - the fixture
from test_rpg_flags import BASE

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras import run_settings
from rpg_openrlhf.extras.checkpoints import commit, resume


# ----------------------------------------------------------------------------- item 2: never deleted
def test_files_added_to_a_committed_checkpoint_are_named_not_fatal(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    committed(tmp_path, "global_step2", 2)
    hf = tmp_path / "global_step2_hf"
    (hf / "README.md").write_text("my notes\n")
    (hf / "eval" / "run").mkdir(parents=True)  # rpg-eval run --out inside it
    (hf / "eval" / "run" / "samples.jsonl").write_text("{}\n")
    (tmp_path / "_actor" / "global_step2" / "notes.txt").write_text("x")
    notes = _prepare(tmp_path)
    assert (hf / "README.md").is_file() and (hf / "eval" / "run" / "samples.jsonl").is_file()
    assert (tmp_path / "_actor" / "global_step2" / "notes.txt").is_file()
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step2"
    warned = [n for n in notes if n.startswith("warning:")]
    assert len(warned) == 2 and "README.md, eval/" in warned[1] and "notes.txt" in warned[0], notes
    assert not any("removed" in n for n in notes), notes


def test_a_committed_checkpoint_changed_since_is_passed_over_and_kept(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    committed(tmp_path, "global_step2", 2)
    (tmp_path / "global_step2_hf" / "model.safetensors").write_bytes(b"w" * 10)  # a partial copy
    notes = _prepare(tmp_path)
    assert (tmp_path / "global_step2_hf" / "model.safetensors").is_file()
    assert any("left in place" in n and "global_step2_hf" in n for n in notes), notes


def test_a_directory_the_run_did_not_write_is_not_removed(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    commit.end(tmp_path, "global_step1")
    foreign = tmp_path / "global_step7_hf"  # copied in by hand: no marker, never written by this run
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"m")
    write_tag(tmp_path, "global_step2")  # the run was killed writing this one: removed
    notes = _prepare(tmp_path)
    assert (foreign / "model.safetensors").is_file()
    assert not (tmp_path / "global_step2_hf").exists() and not (tmp_path / "_actor" / "global_step2").exists()
    assert any("left in place" in n and "global_step7_hf" in n for n in notes), notes
    assert commit.being_written(tmp_path) == set()


# ----------------------------------------------------------------------------- item 3: no write through a link
def test_a_planted_link_receives_nothing(monkeypatch, tmp_path: Path) -> None:
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    run, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "global_step2_hf").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="global_step2_hf is a symbolic link"):
        _prepare(run)  # before Ray
    (run / "global_step2_hf").unlink()
    trainer = _trainer(run)
    trainer.save_logs_and_checkpoints(1, {}, {})
    (run / "global_step2_hf").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="global_step2_hf is a symbolic link"):
        trainer.save_logs_and_checkpoints(2, {}, {})  # planted while the run went on
    assert list(elsewhere.iterdir()) == []
    (run / "global_step2_hf").unlink()
    (run / "_actor" / "latest").unlink()
    (run / "_actor" / "latest").symlink_to(elsewhere / "latest")
    with pytest.raises(ValueError, match="latest is a symbolic link"):
        trainer.save_logs_and_checkpoints(2, {}, {})
    assert list(elsewhere.iterdir()) == []


# ----------------------------------------------------------------------------- item 5: another run's settings
def _args(run: Path, **changes: object) -> SimpleNamespace:
    rpg = dict(loss="urkl", style="reinforce_clip", max_steps=3, ref_update="every_k", ref_update_k=2)
    train = dict(seed=42, batch_size=4)
    for key, value in changes.items():
        section, name = key.split("__")
        (rpg if section == "rpg" else train)[name] = value
    return SimpleNamespace(
        ckpt=SimpleNamespace(path=str(run), max_num=3, save_steps=1, load_enable=True),
        rpg=SimpleNamespace(**rpg), train=SimpleNamespace(**train),
        actor=SimpleNamespace(model_name_or_path="/m", num_gpus_per_node=1),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "named"),
    [({"rpg__loss": "fkl"}, "--rpg.loss urkl (now fkl)"), ({"train__seed": 7}, "--train.seed 42 (now 7)"),
     ({"rpg__ref_update": "initial", "rpg__ref_update_k": None}, "--rpg.ref_update every_k (now initial)")],
)  # fmt: skip
def test_resume_with_other_settings_is_refused(tmp_path: Path, change: dict, named: str) -> None:
    resume.prepare(_args(tmp_path))  # the first start records the settings
    committed(tmp_path, "global_step1", 1)
    with pytest.raises(ValueError, match="started with other settings") as info:
        resume.prepare(_args(tmp_path, **change))
    assert named in str(info.value) and "\n" not in str(info.value)
    assert (tmp_path / "global_step1_hf").is_dir()  # nothing touched
    # what may change: the budget and placement
    resume.prepare(_args(tmp_path, rpg__max_steps=10))
    args = _args(tmp_path)
    args.actor.num_gpus_per_node = 4
    resume.prepare(args)


def test_settings_recorded_where_nothing_can_mix(tmp_path: Path) -> None:
    resume.prepare(_args(tmp_path))
    resume.prepare(_args(tmp_path, rpg__loss="fkl"))  # no checkpoint yet: a new run, recorded anew
    assert run_settings.recorded(tmp_path)["rpg.loss"] == "fkl"
    body = json.loads((tmp_path / run_settings.FILE).read_text())
    assert body["settings"]["train.seed"] == 42 and "rpg.max_steps" not in body["settings"]


def test_changed_ref_update_refused_by_rpg_train_before_ray(tmp_path: Path, no_ray, capsys) -> None:  # noqa: F811
    from rpg_openrlhf.launch.cli import main

    run = tmp_path / "ckpt"
    common = [*BASE, "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.max_steps", "2",
              "--ckpt.path", str(run), "--ckpt.load_enable", "--ckpt.save_steps", "1"]  # fmt: skip
    with pytest.raises(AssertionError, match="ray.init was called"):  # the first start: recorded, then Ray
        main([*common, "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "2"])
    committed(run, "global_step1", 1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main([*common, "--rpg.ref_update", "initial"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert "--rpg.ref_update every_k (now initial)" in err[0] and "--rpg.ref_update_k 2 (now unset)" in err[0]


def test_a_change_named_by_resume_changes_is_allowed_and_recorded(tmp_path: Path) -> None:
    """--rpg.resume_changes names what may differ on purpose: those settings pass and the record takes
    them; a setting it does not name is still refused."""
    resume.prepare(_args(tmp_path))
    committed(tmp_path, "global_step1", 1)
    with pytest.raises(ValueError, match=r"--train\.seed 42 \(now 7\)") as info:
        resume.prepare(_args(tmp_path, rpg__loss="fkl", train__seed=7, rpg__resume_changes="rpg.loss"))
    assert "--rpg.loss" not in str(info.value)
    notes = resume.prepare(_args(tmp_path, rpg__loss="fkl", rpg__resume_changes="--rpg.loss"))
    assert any("records them" in n for n in notes), notes
    resume.prepare(_args(tmp_path, rpg__loss="fkl"))  # the record now says fkl
    with pytest.raises(ValueError, match=r"--rpg\.loss fkl \(now urkl\)"):
        resume.prepare(_args(tmp_path))
