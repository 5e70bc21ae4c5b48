"""Checkpoints in careless hands (docs/contracts.md, "Threat model"), without Ray: a committed checkpoint
with files added to it is resumed and never deleted; a directory the run did not write is left in place
and never written into; one run per --ckpt.path; a resume with other settings than the run's is refused
before Ray, naming them (rpg-train in-process, ``ray.init`` booby-trapped)."""

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
    warned = [n for n in notes if n.startswith("warning:") and "holds files" in n]
    assert len(warned) == 2 and "README.md, eval/" in warned[1] and "notes.txt" in warned[0], notes
    assert not any("removed" in n for n in notes), notes


def test_resume_removes_only_the_killed_saves_it_recorded(tmp_path: Path) -> None:
    """A checkpoint changed since its commit (a partial copy over it) and a folder the run did not write
    (a hand-made copy: no marker) are passed over, named and left in place; the save a kill stopped is removed."""
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    committed(tmp_path, "global_step2", 2)
    commit.end(tmp_path, "global_step1", "global_step2")
    foreign, changed = tmp_path / "global_step1_hf", tmp_path / "global_step2_hf" / "model.safetensors"
    (foreign / ck.MARKER).unlink()
    changed.write_bytes(b"w" * 10)
    write_tag(tmp_path, "global_step3")  # the run was killed writing this one
    notes = _prepare(tmp_path)
    assert (foreign / "model.safetensors").is_file() and changed.read_bytes() == b"w" * 10
    assert not (tmp_path / "global_step3_hf").exists() and not (tmp_path / "_actor" / "global_step3").exists()
    left = [n for n in notes if "left in place" in n]
    assert len(left) == 1 and "global_step1_hf" in left[0] and "global_step2_hf" in left[0], notes
    assert commit.being_written(tmp_path) == set()


# ----------------------------------------------------------------------------- issue 38, items 1-3
def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("the user's own file\n")
    return outside


def _foreign(run: Path, outside: Path, name: str = "global_step3_hf") -> Path:
    """A checkpoint folder copied in by hand: no marker, config.json a link to a file outside."""
    foreign = run / name
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"theirs")
    (foreign / "config.json").symlink_to(outside / "config.json")
    return foreign


def test_a_foreign_folder_where_a_step_is_saved_is_never_written_into(monkeypatch, tmp_path: Path) -> None:
    """Item 1: copied in before the start (refused at the start, before anything changes) or while the run
    goes on (refused at that step's save): never written into, never marked, the outside file intact."""
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    run, outside = tmp_path / "ckpt", _outside(tmp_path)
    _prepare(run)
    trainer = _trainer(run)
    for step in (1, 2):
        trainer.save_logs_and_checkpoints(step, {}, {})
    foreign = _foreign(run, outside)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ValueError, match=r"global_step3_hf not written by this run .* steps after 2") as info:
        _prepare(run)  # the resume: step 3 would be saved into it
    assert "\n" not in str(info.value) and sorted(p.name for p in run.iterdir()) == before
    with pytest.raises(ValueError, match=r"global_step3_hf was not written by the run"):
        trainer.save_logs_and_checkpoints(3, {}, {})  # copied in while the run went on
    assert (outside / "config.json").read_text() == "the user's own file\n"
    assert sorted(p.name for p in foreign.iterdir()) == ["config.json", "model.safetensors"]
    assert (foreign / "model.safetensors").read_bytes() == b"theirs"


_HOLDER = """
import sys, time
from types import SimpleNamespace
from rpg_openrlhf.extras.checkpoints import resume
args = SimpleNamespace(ckpt=SimpleNamespace(path=sys.argv[1], max_num=3, save_steps=1, load_enable=True),
                       rpg=SimpleNamespace(max_steps=None))
resume.prepare(args)
print(args.ckpt.rpg_run_lock, flush=True)
time.sleep(600)
"""


def test_one_run_per_checkpoint_directory(monkeypatch, tmp_path: Path, no_ray, capsys) -> None:  # noqa: F811
    """Item 3: a second start while a run holds --ckpt.path is refused before Ray, one line naming the
    holder; the holder's death releases it; a trainer whose driver is gone commits no further step."""
    import subprocess
    import sys

    import ray

    from rpg_openrlhf.extras.checkpoints import run_lock
    from rpg_openrlhf.launch.cli import main

    run = tmp_path / "ckpt"
    first = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        token = first.stdout.readline().strip()
        assert token, "the first run did not start"
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main([*BASE, "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.max_steps", "2",
                  "--ckpt.path", str(run), "--ckpt.load_enable", "--ckpt.save_steps", "1"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1, err
        assert f"another rpg-train run (pid {first.pid}) holds {run}" in err[0], err
        # the first run's trainer, with the token its driver handed over
        monkeypatch.setattr(ray, "get", lambda refs: refs)
        trainer = _trainer(run, rpg_run_lock=token)
        trainer.save_logs_and_checkpoints(1, {}, {})
        assert ck.is_complete(run / "_actor" / "global_step1")
    finally:
        first.kill()
        first.wait()
    with pytest.raises(run_lock.RunStopped, match="no longer holds rpg_run.lock"):
        trainer.save_logs_and_checkpoints(2, {}, {})  # the driver died: no further step
    assert not (run / "_actor" / "global_step2").exists()
    assert _prepare(run)  # the lock was released with the first run's death: the resume starts


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


def test_reference_files_are_hard_linked_while_unchanged(tmp_path: Path) -> None:
    """The RPG reference weights beside a checkpoint: written once, hard-linked while unchanged (no
    second gather), read back with ``weights_only=True``."""
    import torch

    from rpg_openrlhf.extras.checkpoints.reference_files import ReferenceFiles

    refs = ReferenceFiles(str(tmp_path))
    first = refs.write("global_step1", 1, lambda: {"w": torch.ones(2)})
    second = refs.write("global_step2", 1, lambda: pytest.fail("gathered again while unchanged"))
    assert Path(first).stat().st_ino == Path(second).stat().st_ino
    assert torch.equal(refs.load(second)["state_dict"]["w"], torch.ones(2))
    third = refs.write("global_step3", 2, lambda: {"w": torch.zeros(2)})  # refreshed: written anew
    assert Path(third).stat().st_ino != Path(first).stat().st_ino and Path(third).stat().st_nlink == 1


# ----------------------------------------------------------------------------- issue 38, item 8: the record
@pytest.mark.parametrize("damage", ["missing", "emptied", "a_directory"])
def test_a_lost_record_is_said_never_silently_skipped(tmp_path: Path, damage: str) -> None:
    """rpg_run.json missing or emptied: the resume says it could not compare (not "resumed with the changes
    --rpg.resume_changes names"); a directory at its name is refused at the start, naming it (not a temp file)."""
    resume.prepare(_args(tmp_path))
    committed(tmp_path, "global_step1", 1)
    record = tmp_path / run_settings.FILE
    record.unlink()
    if damage == "emptied":
        record.write_text(json.dumps({"format": 1, "settings": {}}))
    elif damage == "a_directory":
        record.mkdir()
        with pytest.raises(ValueError) as info:
            resume.prepare(_args(tmp_path, train__seed=7))
        assert str(info.value).startswith(f"{record}: is a directory") and "\n" not in str(info.value)
        return
    notes = resume.prepare(_args(tmp_path, train__seed=7))
    warned = [n for n in notes if n.startswith("warning:") and str(record) in n]
    assert (
        len(warned) == 1 and ("missing" if damage == "missing" else "none of the run's settings") in warned[0]
    ), notes
    assert not any("--rpg.resume_changes names" in n for n in notes), notes
    assert run_settings.recorded(tmp_path)["train.seed"] == 7  # checked from the next resume on
    with pytest.raises(ValueError, match=r"--train\.seed 7 \(now 42\)"):
        resume.prepare(_args(tmp_path))


def test_a_grader_change_named_as_the_refusal_names_it(monkeypatch, tmp_path: Path) -> None:
    """Item 9: the refusal names RPG_REWARD_GRADER; --rpg.resume_changes RPG_REWARD_GRADER lets it change."""
    monkeypatch.setenv("RPG_REWARD_GRADER", "paper")
    resume.prepare(_args(tmp_path))
    committed(tmp_path, "global_step1", 1)
    monkeypatch.setenv("RPG_REWARD_GRADER", "math_verify")
    with pytest.raises(ValueError, match=r"RPG_REWARD_GRADER=paper \(now math_verify\)"):
        resume.prepare(_args(tmp_path))
    notes = resume.prepare(_args(tmp_path, rpg__resume_changes="RPG_REWARD_GRADER"))
    assert any(
        "--rpg.resume_changes names (RPG_REWARD_GRADER=paper (now math_verify))" in n for n in notes
    ), notes
