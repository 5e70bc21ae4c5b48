"""Committed checkpoints without Ray: the marker contract (common/checkpoints.py), the trainer's commit
after OpenRLHF's save and its rotation, the checkpoint resumed (extras/checkpoint.py); rpg-eval's
discovery passing over torn ones: tests/test_e2e_preemption.py, tests/test_eval_hostile_input.py. Folders are laid out as OpenRLHF 0.11.2 writes them (``_actor/<tag>/``
with DeepSpeed's files and ``latest``, ``<tag>_hf/``); a "kill" leaves a tag part-way: files, no marker,
``latest`` naming it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras import checkpoint


def openrlhf_files(run: Path, tag: str, hf: bool = True) -> None:
    """OpenRLHF's files of ``tag`` (no marker), written in place as its save does."""
    ds = run / "_actor" / tag
    ds.mkdir(parents=True, exist_ok=True)
    (ds / "mp_rank_00_model_states.pt").write_bytes(b"m" * 100)
    (ds / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 300)
    (run / "_actor" / "latest").write_text(tag)
    if hf:
        (run / f"{tag}_hf").mkdir(exist_ok=True)
        (run / f"{tag}_hf" / "config.json").write_text("{}")
        (run / f"{tag}_hf" / "model.safetensors").write_bytes(b"w" * 200)


def write_tag(run: Path, tag: str, hf: bool = True) -> None:
    """What a save killed before its commit leaves: the record that the run writes ``tag``, its files."""
    checkpoint.being_written(run, checkpoint.being_written(run) | {tag})
    openrlhf_files(run, tag, hf)


def committed(run: Path, tag: str, step: int) -> None:
    write_tag(run, tag)
    checkpoint.commit(run, tag, step)


def _prepare(run: Path, **ckpt: object) -> list[str]:
    ckpt = {"path": str(run), "max_num": 3, "save_steps": 1, "load_enable": True, **ckpt}
    return checkpoint.prepare(
        SimpleNamespace(ckpt=SimpleNamespace(**ckpt), rpg=SimpleNamespace(max_steps=None))
    )


def test_marker_lists_the_files_and_a_changed_directory_is_not_complete(tmp_path: Path) -> None:
    committed(tmp_path, "global_step1", 1)
    ds, hf = checkpoint.tag_dirs(tmp_path, "global_step1")
    body = json.loads((ds / ck.MARKER).read_text())
    assert (body["tag"], body["global_step"]) == ("global_step1", 1)
    want = {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 300, "mp_rank_00_model_states.pt": 100}
    assert body["files"] == want
    assert ck.is_complete(ds) and ck.is_complete(hf)
    (hf / "model.safetensors").write_bytes(b"w" * 150)  # truncated after the commit
    (ds / "eval").mkdir()
    (ds / "eval" / "samples.jsonl").write_text("{}\n")  # added after the commit: still complete
    assert not ck.is_complete(hf) and ck.is_complete(ds)
    (ds / "mp_rank_00_model_states.pt").unlink()
    assert not ck.is_complete(ds)
    (ds / ck.MARKER).write_text("{not json")
    assert ck.read_marker(ds) is None
    run = tmp_path / "ckpt"  # torn only where the run declares markers, for its steps after "since"
    write_tag(run, "global_step1")
    write_tag(run, "global_step2")
    assert ck.model_dir_state(run / "global_step2_hf") == "unmarked"
    ck.declare(run, since=1)
    assert ck.declared_since(run) == 1
    assert [ck.model_dir_state(run / f"global_step{s}_hf") for s in (1, 2)] == ["unmarked", "torn"]
    names = ("global_step12", "best_global_step3_hf", "global_step", "x")
    assert [ck.tag_step(n) for n in names] == [12, 3, None, None]


class _Actors:
    """OpenRLHF's actor group as the trainer sees it: its save writes the tag in place."""

    def __init__(self, run: Path) -> None:
        self.run = run

    def async_run_method(self, method_name: str, tag: str, **_: object) -> list:
        for d in checkpoint.tag_dirs(self.run, tag):  # a rewrite: unmarked before any file changes
            assert not (d / ck.MARKER).exists(), "a tag was rewritten while still marked complete"
        openrlhf_files(self.run, tag)
        return []


def _trainer(run: Path, save_steps: int = 1, **ckpt: object):
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    class Trainer(checkpoint.CheckpointCommitMixin, BasePPOTrainer):
        pass

    trainer = object.__new__(Trainer)
    trainer.__dict__.update(
        args=SimpleNamespace(logger=SimpleNamespace(logging_steps=1), ckpt=SimpleNamespace(path=str(run), save_steps=save_steps, **ckpt)),
        wandb_logger=None, tensorboard_logger=None, best_eval_metric_key="", best_eval_metric_value=0.0,
        _latest_eval_metric_value=None, actor_model_group=_Actors(run), critic_model_group=None,
    )  # fmt: skip
    return trainer


def test_the_commit_follows_the_save_and_rotation_keeps_unmarked_folders(monkeypatch, tmp_path: Path) -> None:
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    _prepare(tmp_path, max_num=1, load_enable=False)
    (tmp_path / "_actor" / "global_step0").mkdir(parents=True)  # the user's, unmarked: never rotated out
    (tmp_path / "_actor" / "global_step0" / "notes.txt").write_text("mine\n")
    trainer, seen = _trainer(tmp_path, save_steps=2, max_num=1), []
    real_rotate = checkpoint.rotate

    def rotate(*args):  # what is complete when the rotation runs
        seen.append(sorted(p.name for p in (tmp_path / "_actor").iterdir() if ck.is_complete(p)))
        return real_rotate(*args)

    monkeypatch.setattr(checkpoint, "rotate", rotate)
    for step in (1, 2, 2, 4):  # step 2 twice: a rewrite (unmarked first: _Actors checks)
        trainer.save_logs_and_checkpoints(step, {}, {})
    assert seen == [["global_step2"], ["global_step2"], ["global_step2", "global_step4"]]
    assert sorted(os.listdir(tmp_path / "_actor")) == ["global_step0", "global_step4", "latest"]
    assert (tmp_path / "_actor" / "global_step0" / "notes.txt").read_text() == "mine\n"
    assert all(ck.is_complete(d) for d in checkpoint.tag_dirs(tmp_path, "global_step4"))
    assert checkpoint.being_written(tmp_path) == set()


@pytest.mark.parametrize(("max_num", "max_mem_gib"), [(2, 1000), (3, 1000), (5, 1.2e-6)])
def test_rotation_after_the_commit_is_openrlhfs_rule(monkeypatch, tmp_path, max_num, max_mem_gib) -> None:
    """OpenRLHF's own save (DeepspeedStrategy.save_ckpt, as installed) with its rotation on, and with it
    off as the workers run it (WorkerCheckpointMixin) then the trainer's rotation after the commit: the
    same checkpoints remain; and the workers' save deletes no regular checkpoint before the commit."""
    import time

    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.utils.deepspeed import deepspeed as ds_module

    monkeypatch.setattr(ds_module, "torch_dist_barrier_and_cuda_sync", lambda: None)
    monkeypatch.setattr(checkpoint, "rng_file", lambda path, tag, rank: str(tmp_path / f"rng_{tag}.pt"))
    strategy = object.__new__(ds_module.DeepspeedStrategy)
    strategy.print, strategy.is_rank_0 = (lambda *a: None), (lambda: True)
    engine = object.__new__(ds_module.deepspeed.DeepSpeedEngine)
    engine.__dict__["save_checkpoint"] = lambda save_dir, tag, client_state, save_latest: (
        Path(save_dir, tag).mkdir(),
        Path(save_dir, tag, "model.pt").write_bytes(b"w" * 300),
    )

    class Stock:  # PolicyModelActor.save_checkpoint's call
        def save_checkpoint(self, tag: str, metric_value: float | None) -> None:
            c = self.strategy.args.ckpt
            actor = os.path.join(c.path, "_actor")
            strategy.save_ckpt(
                engine, actor, tag, c.max_num, c.max_mem, {}, metric_value=metric_value, metric_key="acc"
            )

    class Worker(checkpoint.WorkerCheckpointMixin, Stock):
        pass

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    c = dict(max_num=max_num, max_mem=max_mem_gib, disable_ds=False)
    stock, worker = Stock(), Worker()
    stock.strategy = SimpleNamespace(args=SimpleNamespace(ckpt=SimpleNamespace(path=str(theirs), **c)))
    worker.strategy = SimpleNamespace(
        args=SimpleNamespace(ckpt=SimpleNamespace(path=str(ours), rpg_committed=True, **c))
    )
    saves = [("global_step1", 0.5), ("global_step2", None), ("best_global_step2", 0.9), ("global_step3", 0.2),
             ("global_step4", 0.7), ("best_global_step4", 0.95), ("global_step5", None), ("global_step6", 0.1)]  # fmt: skip
    for tag, metric in saves:
        stock.save_checkpoint(tag, metric)
        before = {p.name for p in (ours / "_actor").glob("global_step*")}
        worker.save_checkpoint(tag, metric)
        assert before <= {p.name for p in (ours / "_actor").iterdir()}, tag
        assert worker.strategy.args.ckpt.max_num == max_num  # restored after the save
        checkpoint.commit(ours, tag, ck.tag_step(tag))
        checkpoint.rotate(ours, tag, max_num, max_mem_gib)
        assert sorted(os.listdir(ours / "_actor")) == sorted(os.listdir(theirs / "_actor")), tag
        time.sleep(0.01)  # distinct mtimes: "the oldest" is well defined


def test_resume_passes_over_torn_checkpoints_and_removes_only_its_own(tmp_path: Path) -> None:
    """Killed saving step 3 (files in place, latest naming it): removed, latest back at step 2. A
    checkpoint changed since its commit and a folder the run did not write are left in place."""
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    committed(tmp_path, "global_step2", 2)
    checkpoint.being_written(tmp_path, set())
    (tmp_path / "global_step1_hf" / ck.MARKER).unlink()  # a hand-made copy: no marker
    (tmp_path / "global_step2_hf" / "model.safetensors").write_bytes(b"w" * 10)  # changed since
    write_tag(tmp_path, "global_step3")
    notes = _prepare(tmp_path)
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step2"
    assert not (tmp_path / "_actor" / "global_step3").exists() and not (tmp_path / "global_step3_hf").exists()
    assert (tmp_path / "global_step1_hf" / "model.safetensors").is_file()
    assert (tmp_path / "global_step2_hf" / "model.safetensors").read_bytes() == b"w" * 10
    assert f"left their files in {tmp_path}: removed (global_step3)" in notes[-3], notes
    assert "left in place" in notes[-2] and "global_step1_hf, global_step2_hf" in notes[-2], notes
    assert notes[-1].startswith("resuming from global_step2") and checkpoint.being_written(tmp_path) == set()


def test_resume_with_an_empty_latest_or_nothing_complete(tmp_path: Path) -> None:
    ck.declare(tmp_path)
    committed(tmp_path, "global_step1", 1)
    write_tag(tmp_path, "global_step2", hf=False)  # killed inside DeepSpeed's save
    (tmp_path / "_actor" / "latest").write_text("")  # killed while latest was rewritten
    _prepare(tmp_path)
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step1"
    assert sorted(p.name for p in (tmp_path / "_actor").iterdir()) == ["global_step1", "latest"]
    run = tmp_path / "none"
    ck.declare(run)
    write_tag(run, "global_step1")
    (run / "_actor" / "zero_to_fp32.py").write_text("")  # DeepSpeed copies it beside the tags
    assert any("starting from step 0" in n for n in _prepare(run))
    assert not (run / "_actor").exists()  # OpenRLHF fails on an _actor without latest


def test_a_run_from_before_markers_is_resumed_as_openrlhf_would(tmp_path: Path) -> None:
    openrlhf_files(tmp_path, "global_step1")
    openrlhf_files(tmp_path, "global_step2")
    notes = _prepare(tmp_path)
    assert notes[-1] == f"resuming from global_step2 (the last complete checkpoint in {tmp_path})"
    assert ck.declared_since(tmp_path) == 2 and (tmp_path / "_actor" / "global_step2").is_dir()


@pytest.mark.parametrize("loss", [None, "urkl"])
def test_only_stock_async_runs_keep_openrlhfs_checkpoints(tmp_path: Path, loss: str | None) -> None:
    """OpenRLHF's own async trainer writes no markers: a stock async run declares none (its next start
    would remove every checkpoint as torn); the RPG async trainer commits, so RPG runs declare."""
    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(tmp_path), max_num=1, save_steps=1, load_enable=True),
        train=SimpleNamespace(async_enable=True), rpg=SimpleNamespace(max_steps=None, loss=loss),
    )  # fmt: skip
    checkpoint.prepare(args)
    write_tag(tmp_path, "global_step1")
    notes = checkpoint.prepare(args)
    assert (tmp_path / "_actor" / "global_step1").is_dir() == (loss is None)  # else torn: removed
    assert ck.declared_since(tmp_path) == (None if loss is None else 0) and (notes == []) == (loss is None)


def test_a_resumed_worker_draws_what_the_uninterrupted_one_would(tmp_path: Path) -> None:
    """OpenRLHF shuffles a step's samples into micro-batches with the worker's global torch RNG; the
    workers' rotation is off while they save for a run that commits."""
    import torch

    seen = []

    class Stock:  # OpenRLHF's PolicyModelActor as the mixin uses it
        def save_checkpoint(self, tag: str) -> None:
            seen.append((self.strategy.args.ckpt.max_num, self.strategy.args.ckpt.max_mem))
            (tmp_path / "_actor" / tag).mkdir(parents=True)

        def init_model_from_pretrained(self, strategy: object, pretrain: str) -> None:
            self.checkpoint_states = {"global_step": 1}  # a checkpoint was loaded

    class Actor(checkpoint.WorkerCheckpointMixin, Stock):
        pass

    ckpt = SimpleNamespace(
        path=str(tmp_path), disable_ds=False, load_enable=True, max_num=1, max_mem=5, rpg_committed=True
    )
    strategy = SimpleNamespace(args=SimpleNamespace(ckpt=ckpt), print=print)
    before = Actor()
    before.strategy = strategy
    torch.manual_seed(42)
    torch.randperm(10)  # step 1's shuffle
    before.save_checkpoint("global_step1")
    uninterrupted = torch.randperm(10)  # step 2's, had the run gone on
    (tmp_path / "_actor" / "latest").write_text("global_step1")
    torch.manual_seed(42)  # a new worker starts from the seed
    Actor().init_model_from_pretrained(strategy, "model")
    assert torch.equal(torch.randperm(10), uninterrupted)
    assert seen == [(math.inf, math.inf)] and (ckpt.max_num, ckpt.max_mem) == (1, 5)
