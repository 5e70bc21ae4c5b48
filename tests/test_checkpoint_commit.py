"""Committed checkpoints without Ray: the marker contract (common/checkpoints.py), the trainer's
commit around OpenRLHF's save (extras/checkpoints.py), the choice of the checkpoint to resume
(extras/resume.py) and rpg-eval's discovery passing over torn ones (eval/checkpoints.py).

Checkpoint directories are laid out here as OpenRLHF 0.11.2 writes them (``_actor/<tag>/`` with
DeepSpeed's files and ``latest``, ``<tag>_hf/``); a "kill" is a directory left as a save leaves it
part-way (files present, no marker, ``latest`` already naming it, a truncated file)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras.checkpoints import commit, resume, staging


def write_tag(run: Path, tag: str, hf: bool = True, latest: bool = True) -> None:
    """What the trainer's save leaves in place for ``tag`` when it is killed (no marker): the record that
    it writes the tag (``extras.checkpoints.begin``), then OpenRLHF's: DeepSpeed's files, latest, the HF dir."""
    commit.begin(run, tag)
    openrlhf_files(run, tag, hf, latest)


def openrlhf_files(run: Path | str, tag: str, hf: bool = True, latest: bool = True) -> None:
    """OpenRLHF's files of ``tag`` under ``run`` (no marker)."""
    run = Path(run)
    ds = run / "_actor" / tag
    ds.mkdir(parents=True, exist_ok=True)  # os.makedirs(..., exist_ok=True), as DeepSpeed and OpenRLHF
    (ds / "mp_rank_00_model_states.pt").write_bytes(b"m" * 100)
    (ds / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 300)
    if latest:
        (run / "_actor" / "latest").write_text(tag)
    if hf:
        d = run / f"{tag}_hf"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"w" * 200)


def committed(run: Path, tag: str, step: int) -> None:
    write_tag(run, tag)
    commit.commit(run, tag, step)


# ----------------------------------------------------------------------------- the marker contract
def test_marker_lists_the_files_and_a_changed_directory_is_not_complete(tmp_path: Path) -> None:
    committed(tmp_path, "global_step1", 1)
    ds, hf = commit.tag_dirs(tmp_path, "global_step1")
    body = json.loads((ds / ck.MARKER).read_text())
    assert body["tag"] == "global_step1" and body["global_step"] == 1
    assert body["files"] == {
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 300,
        "mp_rank_00_model_states.pt": 100,
    }
    assert ck.is_complete(ds) and ck.is_complete(hf)
    (hf / "model.safetensors").write_bytes(b"w" * 150)  # truncated after the commit (a partial copy)
    assert not ck.is_complete(hf)
    (ds / "extra.pt").write_bytes(b"x")  # added after the commit: still complete, and named
    (ds / "eval" / "run").mkdir(parents=True)
    (ds / "eval" / "run" / "samples.jsonl").write_text("{}\n")
    assert ck.is_complete(ds) and ck.extra_files(ds) == ["eval/", "extra.pt"]
    (ds / "mp_rank_00_model_states.pt").unlink()  # a listed file gone: not complete
    assert not ck.is_complete(ds)
    (ds / ck.MARKER).write_text("{not json")
    assert ck.read_marker(ds) is None and not ck.is_complete(ds)


def test_states_under_a_declared_run_and_elsewhere(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    write_tag(run, "global_step1")
    write_tag(run, "global_step2")
    hf1, hf2 = run / "global_step1_hf", run / "global_step2_hf"
    assert ck.model_dir_state(hf2) == "unmarked"  # no declaration: another run's layout, read as before
    ck.declare(run, since=1)  # a run from before markers, resumed at step 1
    assert ck.model_dir_state(hf1) == "unmarked" and ck.model_dir_state(hf2) == "torn"
    assert ck.declare(run, since=0) is False and ck.declared_since(run) == 1  # kept
    ck.write_marker(hf2, "global_step2", 2)
    assert ck.model_dir_state(hf2) == "complete"
    final = run / "final"
    final.mkdir()
    assert ck.model_dir_state(final) == "unmarked"  # not a checkpoint name (--ckpt.output_dir)
    assert [ck.tag_step(n) for n in ("global_step12", "best_global_step3_hf", "global_step", "x")] == [
        12,
        3,
        None,
        None,
    ]


# ----------------------------------------------------------------------------- the trainer's commit
class _Actors:
    """OpenRLHF's actor group as the trainer sees it: save_checkpoint writes the tag (no marker)."""

    def __init__(self, run: Path, tear: bool = False) -> None:
        self.run, self.tear = run, tear

    def async_run_method(self, method_name: str, tag: str, **_: object) -> list:
        assert method_name == "save_checkpoint"
        for d in commit.tag_dirs(self.run, tag):  # a rewrite (resumed from an older step): unmarked first
            assert not (d / ck.MARKER).exists(), "a tag was rewritten while still marked complete"
        # as every policy worker does (staging.StagedSaveMixin): into the staging directory of the tag
        with staging.worker_path(str(self.run), tag) as path:
            openrlhf_files(path, tag)
        return []


def _trainer(run: Path, save_steps: int = 1, **ckpt: object):
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    class Trainer(commit.CheckpointCommitMixin, BasePPOTrainer):
        pass

    trainer = object.__new__(Trainer)
    trainer.__dict__.update(
        args=SimpleNamespace(
            logger=SimpleNamespace(logging_steps=1), ckpt=SimpleNamespace(path=str(run), save_steps=save_steps, **ckpt)
        ),
        wandb_logger=None, tensorboard_logger=None, best_eval_metric_key="", best_eval_metric_value=0.0,
        _latest_eval_metric_value=None, actor_model_group=_Actors(run), critic_model_group=None,
    )  # fmt: skip
    return trainer


def test_the_trainer_commits_after_openrlhf_saved_and_uncommits_before(monkeypatch, tmp_path: Path) -> None:
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    trainer = _trainer(tmp_path, save_steps=2)
    trainer.save_logs_and_checkpoints(1, {}, {})  # not a save step
    assert not (tmp_path / "_actor").exists()
    trainer.save_logs_and_checkpoints(2, {}, {})
    assert all(ck.is_complete(d) for d in commit.tag_dirs(tmp_path, "global_step2"))
    trainer.save_logs_and_checkpoints(2, {}, {})  # written again: unmarked first (_Actors checks)
    assert all(ck.is_complete(d) for d in commit.tag_dirs(tmp_path, "global_step2"))


def test_max_num_one_keeps_the_previous_checkpoint_until_the_next_is_committed(monkeypatch, tmp_path) -> None:
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(tmp_path), max_num=1, save_steps=1, load_enable=False),
        rpg=SimpleNamespace(max_steps=None),
    )
    resume.prepare(args)
    (tmp_path / "_actor" / "global_step0").mkdir(parents=True)  # the user's, unmarked: never rotated out
    (tmp_path / "_actor" / "global_step0" / "notes.txt").write_text("mine\n")
    trainer = _trainer(tmp_path, max_num=1)
    seen = []
    real_rotate = staging.rotate

    def rotate(out, new_tag, max_num, max_mem):  # what is complete when the rotation runs
        seen.append(sorted(p.name for p in (tmp_path / "_actor").iterdir() if ck.is_complete(p)))
        return real_rotate(out, new_tag, max_num, max_mem)

    monkeypatch.setattr(staging, "rotate", rotate)
    for step in (1, 2, 3):
        trainer.save_logs_and_checkpoints(step, {}, {})
    assert seen[1:] == [
        ["global_step1", "global_step2"],
        ["global_step2", "global_step3"],
    ]  # the older kept until then
    assert sorted(p.name for p in (tmp_path / "_actor").iterdir() if p.is_dir()) == [
        "global_step0",
        "global_step3",
    ]
    assert (tmp_path / "_actor" / "global_step0" / "notes.txt").read_text() == "mine\n"
    assert not (tmp_path / staging.STAGING_DIR).exists() or not any(
        (tmp_path / staging.STAGING_DIR).iterdir()
    )


# ----------------------------------------------------------------------------- resume
def _prepare(run: Path) -> list[str]:
    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(run), max_num=3, save_steps=1, load_enable=True),
        rpg=SimpleNamespace(max_steps=None),
    )
    return resume.prepare(args)


def test_resume_passes_over_a_torn_checkpoint_that_latest_names(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    committed(tmp_path, "global_step2", 2)
    write_tag(tmp_path, "global_step3")  # killed before the commit: files there, latest names it
    notes = _prepare(tmp_path)
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step2"
    assert not (tmp_path / "_actor" / "global_step3").exists() and not (tmp_path / "global_step3_hf").exists()
    assert any("torn" in n and "global_step3" in n for n in notes), notes
    assert any("resuming from global_step2" in n for n in notes), notes


def test_resume_with_a_half_written_directory_and_an_empty_latest(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    write_tag(tmp_path, "global_step2", hf=False)  # killed inside DeepSpeed's save
    (tmp_path / "_actor" / "latest").write_text("")  # killed while latest was rewritten in place
    _prepare(tmp_path)
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step1"
    assert sorted(p.name for p in (tmp_path / "_actor").iterdir()) == ["global_step1", "latest"]


def test_resume_with_nothing_complete_starts_from_step_zero(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    write_tag(tmp_path, "global_step1")
    (tmp_path / "_actor" / "zero_to_fp32.py").write_text("")  # DeepSpeed copies it beside the tags
    notes = _prepare(tmp_path)
    assert not (tmp_path / "_actor").exists()  # OpenRLHF then loads nothing (an _actor without latest fails)
    assert any("starting from step 0" in n for n in notes), notes


def test_a_run_from_before_markers_is_resumed_as_openrlhf_would(tmp_path: Path) -> None:
    write_tag(tmp_path, "global_step1")
    write_tag(tmp_path, "global_step2")
    notes = _prepare(tmp_path)  # an older version wrote no rpg_run.json either: said, then recorded
    assert notes[0].startswith(f"warning: {tmp_path / 'rpg_run.json'} is missing") and notes[1:] == [
        "resuming from global_step2 (the last complete checkpoint in " + str(tmp_path) + ")"
    ]
    assert ck.declared_since(tmp_path) == 2  # from here on the run's checkpoints are marked
    assert (tmp_path / "_actor" / "global_step2").is_dir()


# ----------------------------------------------------------------------------- rpg-eval's discovery
def test_rpg_eval_finds_only_complete_checkpoints_and_names_the_others(tmp_path: Path) -> None:
    from rpg_eval.run.checkpoints import find_checkpoints

    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    write_tag(tmp_path, "global_step2")  # being written: every file there, no marker
    (tmp_path / "global_step3_hf").mkdir()  # killed before its config.json
    skipped: list[Path] = []
    assert [c.name for c in find_checkpoints(tmp_path, skipped=skipped)] == ["global_step1_hf"]
    assert [p.name for p in skipped] == ["global_step2_hf", "global_step3_hf"]
    commit.commit(tmp_path, "global_step2", 2)  # the trainer committed it: the next run sees it
    assert [c.name for c in find_checkpoints(tmp_path)] == ["global_step1_hf", "global_step2_hf"]
    with pytest.raises(FileNotFoundError, match="incomplete"):
        find_checkpoints(tmp_path / "global_step3_hf")


# ----------------------------------------------------------------------------- the policy worker's RNG
def test_a_resumed_worker_draws_what_the_uninterrupted_one_would(tmp_path: Path) -> None:
    """OpenRLHF shuffles a step's samples into micro-batches with the worker's global torch RNG."""
    import torch

    from rpg_openrlhf.extras.checkpoints.rng_state import RngStateMixin

    class Stock:  # OpenRLHF's PolicyModelActor as the mixin uses it
        def save_checkpoint(self, tag: str, client_states: dict | None = None) -> None:
            (tmp_path / "_actor" / tag).mkdir(parents=True)

        def init_model_from_pretrained(self, strategy: object, pretrain: str) -> None:
            self.checkpoint_states = {"global_step": 1}  # a checkpoint was loaded

    class Actor(RngStateMixin, Stock):
        pass

    args = SimpleNamespace(ckpt=SimpleNamespace(path=str(tmp_path), disable_ds=False, load_enable=True))
    strategy = SimpleNamespace(args=args, print=print)
    before = Actor()
    before.strategy = strategy
    torch.manual_seed(42)
    torch.randperm(10)  # step 1's shuffle
    before.save_checkpoint("global_step1")
    uninterrupted = torch.randperm(10)  # step 2's shuffle, had the run gone on
    (tmp_path / "_actor" / "latest").write_text("global_step1")
    torch.manual_seed(42)  # a new worker starts from the seed
    Actor().init_model_from_pretrained(strategy, "model")
    assert torch.equal(torch.randperm(10), uninterrupted)


@pytest.mark.parametrize("loss", [None, "urkl"])
def test_only_stock_async_runs_keep_openrlhfs_checkpoints(tmp_path: Path, loss: str | None) -> None:
    """OpenRLHF's own async trainer writes no markers: declaring them for a stock async run would make its
    next start remove every checkpoint as torn. The RPG async trainer commits, so RPG runs declare."""
    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(tmp_path), max_num=1, save_steps=1, load_enable=True),
        train=SimpleNamespace(async_enable=True),
        rpg=SimpleNamespace(max_steps=None, loss=loss),
    )
    resume.prepare(args)  # the first start
    write_tag(tmp_path, "global_step1")  # written by the trainer, unmarked
    write_tag(tmp_path, "global_step2")
    notes = resume.prepare(args)  # the same command again
    if loss is None:
        assert notes == [] and ck.declared_since(tmp_path) is None
        assert (tmp_path / "_actor" / "global_step1").is_dir() and (
            tmp_path / "_actor" / "global_step2"
        ).is_dir()
    else:
        assert ck.declared_since(tmp_path) == 0
        assert not (tmp_path / "_actor" / "global_step2").exists()  # unmarked under a declaring run: torn


@pytest.mark.parametrize(("max_num", "max_mem_gib"), [(2, 1000), (3, 1000), (5, 1.2e-6)])
def test_rotation_after_the_commit_is_openrlhfs_rule(
    monkeypatch, tmp_path: Path, max_num: int, max_mem_gib: float
) -> None:
    """The trainer's rotation after the commit (staging.rotate) removes what OpenRLHF's own rotation
    (DeepspeedStrategy.save_ckpt, run as installed, before each save) removes: best checkpoints aside,
    regular ones without a metric first, then the worst metric, then the oldest; by count and by size."""
    import time

    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()  # OpenRLHF's modules import flash_attn
    from openrlhf.utils.deepspeed import deepspeed as ds_module

    monkeypatch.setattr(ds_module, "torch_dist_barrier_and_cuda_sync", lambda: None)
    strategy = object.__new__(ds_module.DeepspeedStrategy)
    strategy.print, strategy.is_rank_0 = (lambda *a: None), (lambda: True)
    engine = object.__new__(ds_module.deepspeed.DeepSpeedEngine)
    engine.__dict__["save_checkpoint"] = lambda save_dir, tag, client_state, save_latest: (
        Path(save_dir, tag).mkdir(),
        Path(save_dir, tag, "model.pt").write_bytes(b"w" * 300),
    )
    theirs, ours = tmp_path / "theirs" / "_actor", tmp_path / "ours"
    saves = [("global_step1", 0.5), ("global_step2", None), ("best_global_step2", 0.9), ("global_step3", 0.2),
             ("global_step4", 0.7), ("best_global_step4", 0.95), ("global_step5", None), ("global_step6", 0.1)]  # fmt: skip
    for tag, metric in saves:
        strategy.save_ckpt(
            engine, str(theirs), tag, max_num, max_mem_gib, {}, metric_value=metric, metric_key="acc"
        )
        commit.begin(ours, tag)
        ds = ours / "_actor" / tag
        ds.mkdir(parents=True)
        (ds / "model.pt").write_bytes(b"w" * 300)
        (ds / staging.METRIC_FILE).write_text(json.dumps({"metric_key": "acc", "metric_value": metric}))
        commit.commit(ours, tag, int(tag.rsplit("step", 1)[1]))
        staging.rotate(ours, tag, max_num, max_mem_gib)
        assert sorted(p.name for p in (ours / "_actor").iterdir()) == sorted(
            p.name for p in theirs.iterdir()
        ), tag
        time.sleep(0.01)  # distinct mtimes: "the oldest" is well defined
