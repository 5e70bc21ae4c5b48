"""Checkpoints in careless hands (docs/contracts.md, "Threat model"), without Ray: a folder the run did
not write is never written into; one run per --ckpt.path; a resume with other settings than the run's
is refused before anything changes, naming them; the RPG reference files beside the checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_checkpoint_commit import _prepare, _trainer, committed
from test_launch_rejects_before_ray import no_ray  # noqa: F401 - the fixture
from test_rpg_flags import BASE

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras import checkpoint, run_settings
from rpg_openrlhf.launch.cli import main


@pytest.mark.parametrize("name", ["global_step3_hf", "_actor/global_step3", "_actor/best_global_step1"])
def test_a_foreign_folder_where_the_run_saves_is_refused_before_anything_changes(tmp_path, name) -> None:
    """Copied in by hand (no marker, config.json a link to a file outside): refused at the start, one
    line; a best one at any step (OpenRLHF's save of a new best removes the other best folders)."""
    run, outside = tmp_path / "ckpt", tmp_path / "outside.json"
    outside.write_text("the user's own file\n")
    committed(run, "global_step1", 1)
    committed(run, "global_step2", 2)
    _prepare(run)  # the run's start; then the folder is copied in
    (run / name).mkdir()
    (run / name / "config.json").symlink_to(outside)
    before = sorted(p.name for p in run.rglob("*"))
    with pytest.raises(ValueError, match=rf"{name} not written by this run .* steps after 2") as info:
        _prepare(run)
    assert "\n" not in str(info.value) and sorted(p.name for p in run.rglob("*")) == before
    assert outside.read_text() == "the user's own file\n"


def _train_argv(run: Path) -> list[str]:
    return [*BASE, "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.max_steps", "2",
            "--ckpt.path", str(run), "--ckpt.load_enable", "--ckpt.save_steps", "1"]  # fmt: skip


_HOLDER = """
import sys, time
from types import SimpleNamespace
from rpg_openrlhf.extras import checkpoint
args = SimpleNamespace(ckpt=SimpleNamespace(path=sys.argv[1], max_num=3, save_steps=1, load_enable=True),
                       rpg=SimpleNamespace(max_steps=None))
checkpoint.prepare(args)
print(args.ckpt.rpg_run_lock, flush=True)
time.sleep(600)
"""


def test_one_run_per_checkpoint_directory(monkeypatch, tmp_path: Path, no_ray, capsys) -> None:  # noqa: F811
    """A second start while a run holds --ckpt.path is refused before Ray, one line naming the holder;
    the holder's death releases it; a trainer whose driver is gone commits no further step."""
    import ray

    run = tmp_path / "ckpt"
    first = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        token = first.stdout.readline().strip()
        assert token, "the first run did not start"
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            main(_train_argv(run))
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1, err
        assert f"another rpg-train run (pid {first.pid}) holds {run}" in err[0], err
        monkeypatch.setattr(ray, "get", lambda refs: refs)
        trainer = _trainer(run, rpg_run_lock=token)  # the first run's trainer, with its driver's token
        trainer.save_logs_and_checkpoints(1, {}, {})
        assert ck.is_complete(run / "_actor" / "global_step1")
    finally:
        first.kill()
        first.wait()
    with pytest.raises(checkpoint.RunStopped, match="no longer holds rpg_run.lock"):
        trainer.save_logs_and_checkpoints(2, {}, {})
    assert not (run / "_actor" / "global_step2").exists()
    assert _prepare(run)  # released with the first run's death: the resume starts


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


def test_settings_named_by_resume_changes_pass_and_are_recorded(monkeypatch, tmp_path: Path) -> None:
    """Another seed or loss than the run's is refused, naming them (the CLI's one line: the ref_update
    test below); those named by --rpg.resume_changes pass and are recorded; budget and placement pass."""
    monkeypatch.setenv("RPG_REWARD_GRADER", "paper")
    checkpoint.prepare(_args(tmp_path))
    committed(tmp_path, "global_step1", 1)
    monkeypatch.setenv("RPG_REWARD_GRADER", "math_verify")
    with pytest.raises(ValueError, match=r"--train\.seed 42 \(now 7\)") as info:
        checkpoint.prepare(_args(tmp_path, rpg__loss="fkl", train__seed=7, rpg__resume_changes="rpg.loss"))
    assert "--rpg.loss" not in str(info.value) and "RPG_REWARD_GRADER=paper (now math_verify)" in str(
        info.value
    )
    notes = checkpoint.prepare(
        _args(tmp_path, rpg__loss="fkl", rpg__resume_changes="--rpg.loss,RPG_REWARD_GRADER")
    )
    assert any("records them" in n for n in notes), notes
    with pytest.raises(ValueError, match=r"--rpg\.loss fkl \(now urkl\)"):  # the record now says fkl
        checkpoint.prepare(_args(tmp_path))
    args = _args(tmp_path, rpg__loss="fkl", rpg__max_steps=10)  # what may change: the budget, placement
    args.actor.num_gpus_per_node = 4
    checkpoint.prepare(args)


@pytest.mark.parametrize("damage", ["missing", "emptied"])
def test_a_lost_record_is_said_never_silently_skipped(tmp_path: Path, damage: str) -> None:
    checkpoint.prepare(_args(tmp_path))
    committed(tmp_path, "global_step1", 1)
    record = tmp_path / run_settings.FILE
    record.unlink()
    if damage == "emptied":
        record.write_text(json.dumps({"format": 1, "settings": {}}))
    notes = checkpoint.prepare(_args(tmp_path, train__seed=7))
    warned = [n for n in notes if n.startswith("warning:") and str(record) in n]
    assert (
        len(warned) == 1 and ("missing" if damage == "missing" else "none of the run's settings") in warned[0]
    )
    with pytest.raises(ValueError, match=r"--train\.seed 7 \(now 42\)"):  # checked from the next resume on
        checkpoint.prepare(_args(tmp_path))


def test_changed_ref_update_refused_by_rpg_train_before_ray(tmp_path: Path, no_ray, capsys) -> None:  # noqa: F811
    run = tmp_path / "ckpt"
    common = _train_argv(run)
    with pytest.raises(AssertionError, match="ray.init was called"):  # the first start: recorded, then Ray
        main([*common, "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "2"])
    committed(run, "global_step1", 1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main([*common, "--rpg.ref_update", "initial"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert "--rpg.ref_update every_k (now initial)" in err[0] and "--rpg.ref_update_k 2 (now unset)" in err[0]


def test_reference_files_are_hard_linked_while_unchanged(tmp_path: Path) -> None:
    """Written once, hard-linked while unchanged (no second gather), read with ``weights_only=True``,
    pruned with the tags rotated out of ``_actor``."""
    import torch

    refs = checkpoint.ReferenceFiles(str(tmp_path))
    first = refs.write("global_step1", 1, lambda: {"w": torch.ones(2)})
    second = refs.write("global_step2", 1, lambda: pytest.fail("gathered again while unchanged"))
    assert Path(first).stat().st_ino == Path(second).stat().st_ino
    assert torch.equal(refs.load(second)["state_dict"]["w"], torch.ones(2))
    third = refs.write("global_step3", 2, lambda: {"w": torch.zeros(2)})  # refreshed: written anew
    assert Path(third).stat().st_ino != Path(first).stat().st_ino and Path(third).stat().st_nlink == 1
    (tmp_path / "_actor" / "global_step3").mkdir(parents=True)
    refs.prune(keep="global_step2.pt")
    assert sorted(os.listdir(tmp_path / "_rpg_reference")) == ["global_step2.pt", "global_step3.pt"]
