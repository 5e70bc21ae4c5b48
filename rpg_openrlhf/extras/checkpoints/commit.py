"""Committed checkpoints, for stock and RPG runs: a checkpoint counts once every piece of it is written.

OpenRLHF's ``save_logs_and_checkpoints`` writes DeepSpeed's ``_actor/<tag>/`` and ``latest``, then
``<tag>_hf/``, none of it atomically. :class:`CheckpointCommitMixin` wraps that call
(:class:`CheckpointStore`): before it the tag and its staging directory are recorded in :data:`SAVING`
and the tag's markers removed; the workers save into the staging directory (``staging``); after it the
markers are written, the tag moved into place (the commit) and older tags rotated out. A folder the run
did not write at a tag's name is refused (:func:`own_dirs`); nothing is begun or committed once the
driver no longer holds the run's lock (``run_lock.fence``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Protocol

from rpg_openrlhf.common import checkpoints, seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled
from rpg_openrlhf.common.atomic import UnsafePathError, atomic_write
from rpg_openrlhf.extras import hold, run_length
from rpg_openrlhf.extras.checkpoints import run_lock, staging
from rpg_openrlhf.extras.checkpoints.reference_files import ReferenceFiles
from rpg_openrlhf.extras.part import TrainerPart

SAVING = staging.SAVING  # the tags begun and not committed yet (staging.py: the workers read it too)


def being_written(ckpt_path: str | Path) -> set[str]:
    """The tags the trainer recorded as begun and not committed (a kill leaves them here)."""
    tags = staging.read_record(ckpt_path).get("tags")
    return {t for t in tags if isinstance(t, str)} if isinstance(tags, list) else set()


def _staged(ckpt_path: str | Path) -> dict[str, Any]:
    entries = staging.read_record(ckpt_path).get(staging.RECORD_KEY)
    return entries if isinstance(entries, dict) else {}


def _record(ckpt_path: str | Path, tags: set[str], stage: dict[str, Any]) -> None:
    body = {
        "format": 1,
        "tags": sorted(tags),
        staging.RECORD_KEY: {t: stage[t] for t in sorted(stage) if t in tags},
    }
    Path(ckpt_path).mkdir(parents=True, exist_ok=True)
    with atomic_write(Path(ckpt_path) / SAVING) as f:
        json.dump(body, f)


def begin(ckpt_path: str | Path, tag: str, stage: dict[str, Any] | None = None) -> None:
    """Record that the run writes ``tag`` now (before any of its files), with its staging directory."""
    entries = _staged(ckpt_path)
    if stage is not None:
        entries[tag] = stage
    _record(ckpt_path, being_written(ckpt_path) | {tag}, entries)


def end(ckpt_path: str | Path, *tags: str) -> None:
    """``tags`` are committed, or removed: no longer being written."""
    now = being_written(ckpt_path)
    if now & set(tags):
        _record(ckpt_path, now - set(tags), _staged(ckpt_path))


def tag_dirs(ckpt_path: str | Path, tag: str) -> tuple[Path, Path]:
    """(DeepSpeed's directory, the Hugging Face directory) of checkpoint ``tag``."""
    root = Path(ckpt_path)
    return root / checkpoints.ACTOR_DIR / tag, root / f"{tag}{checkpoints.HF_SUFFIX}"


def uncommit(ckpt_path: str | Path, tag: str) -> None:
    """Remove the markers of ``tag`` (the DeepSpeed one first: it is the commit)."""
    for directory in tag_dirs(ckpt_path, tag):
        checkpoints.remove_marker(directory)


def commit(ckpt_path: str | Path, tag: str, global_step: int) -> bool:
    """Mark ``tag`` complete where it lies (a checkpoint written in place, as OpenRLHF lays it out): the
    Hugging Face directory, then DeepSpeed's (the commit). Returns False when DeepSpeed's is absent."""
    ds_dir, hf_dir = tag_dirs(ckpt_path, tag)
    if hf_dir.is_dir():
        checkpoints.write_marker(hf_dir, tag, global_step)
    if not ds_dir.is_dir():
        return False
    checkpoints.write_marker(ds_dir, tag, global_step)
    return True


def own_dirs(ckpt_path: str | Path, tag: str) -> None:
    """UnsafePathError naming what is at ``tag``'s names that the run did not write: anything but a
    directory, or one neither complete nor recorded as being written (a folder copied in by hand)."""
    ours = tag in being_written(ckpt_path)
    for directory in tag_dirs(ckpt_path, tag):
        if not directory.is_symlink() and not directory.exists():
            continue
        if (
            directory.is_symlink()
            or not directory.is_dir()
            or not (ours or checkpoints.is_complete(directory))
        ):
            rel = directory.relative_to(ckpt_path).as_posix()
            raise UnsafePathError(
                f"{staging.FLAG} {ckpt_path}: {rel} was not written by the run (no completeness marker), "
                f"where step {checkpoints.tag_step(tag)} is saved: move it out of --ckpt.path"
            )


def committed(args: Any) -> bool:
    """Whether the run's trainer commits its checkpoints: every ``rpg-train`` trainer but OpenRLHF's own
    async one, which stock runs under ``--train.async_enable`` keep (read as OpenRLHF reads them)."""
    return not (_get(args, "train.async_enable") and not rpg_enabled(args))


class CheckpointStore(TrainerPart):
    """One run's checkpoint files as its trainer writes them (``--ckpt.path``; one per trainer: :meth:`of`):
    a tag begun (staged) before OpenRLHF's save and committed after it, and the RPG reference files beside it."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.references = ReferenceFiles(args.ckpt.path)

    @property
    def path(self) -> str:
        return self.args.ckpt.path

    def begin(self, tag: str, rewrite: bool = True) -> None:
        """Before any file of ``tag``: the run still holds its lock, no foreign directory at its names, a
        fresh staging directory recorded with the tag and, for a possible rewrite, the tag's markers removed."""
        run_lock.fence(self.args)
        own_dirs(self.path, tag)
        begin(self.path, tag, staging.create(self.path, tag))
        if rewrite:
            uncommit(self.path, tag)

    def commit(self, tag: str, global_step: int) -> None:
        """After every rank wrote ``tag`` into its staging directory: mark it, move it into place (the
        commit), then rotate as OpenRLHF would have before the save; ``tag`` is no longer being written."""
        run_lock.fence(self.args)
        hold.hold("commit", global_step)
        entry = _staged(self.path).get(tag, {})
        if staging.publish(self.path, tag, entry, global_step):
            ckpt = self.args.ckpt
            removed = staging.rotate(
                self.path, tag, getattr(ckpt, "max_num", None), getattr(ckpt, "max_mem", None)
            )
            log(f"committed {tag}" + (f"; removed {', '.join(removed)} (--ckpt.max_num/--ckpt.max_mem)" if removed else ""))  # fmt: skip
        staging.discard(self.path, entry)
        end(self.path, tag)

    def abandon(self, tag: str) -> None:
        """OpenRLHF wrote nothing for ``tag`` (a best checkpoint that is no new best): its staging goes."""
        staging.discard(self.path, _staged(self.path).get(tag, {}))
        end(self.path, tag)

    def written(self, tag: str) -> bool:
        """Whether OpenRLHF wrote DeepSpeed's directory of ``tag`` (a best one: only when it is a new best)."""
        return staging.written(staging.staged_dir(self.path, _staged(self.path).get(tag), tag), tag)


class CheckpointPart(Protocol):
    """What a trainer keeps in its checkpoints beyond OpenRLHF's (the RPG trainer's reference:
    ``plugin.reference.ReferenceRefresh``), returned by the trainer's ``checkpoint_part()``."""

    def add_to_checkpoint(self, store: CheckpointStore, client_states: dict, tag: str) -> None:
        """Before OpenRLHF writes ``tag``: its files written, its entries in ``client_states``."""

    def after_checkpoint(self, store: CheckpointStore, client_states: dict) -> None:
        """After OpenRLHF wrote a regular checkpoint (and perhaps rotated older ones out)."""

    def restore(self, store: CheckpointStore, states: dict) -> None:
        """After OpenRLHF loaded a checkpoint's ``client_states`` (``states``) at start."""


class CheckpointCommitMixin:
    """The trainer's checkpoint hooks, for every trainer of ``rpg-train`` (stock and RPG, the synchronous
    ``PPOTrainer`` and the async ``TrainingActor``): the one override of OpenRLHF's
    ``save_logs_and_checkpoints`` and ``save_best_checkpoint``, which call the named parts in the order
    written in :meth:`save_logs_and_checkpoints` (``run_length.StepBudget``, :class:`CheckpointStore`,
    the trainer's :class:`CheckpointPart`: what its ``checkpoint_part()`` returns, nothing for a stock
    trainer, which has no such method)."""

    def save_logs_and_checkpoints(
        self, global_step: int, logs_dict: Any = None, client_states: Any = None
    ) -> None:
        """The end of global step ``global_step`` (OpenRLHF's fit calls it after every ``train_step``), in
        this order: the budget (the step of ``--rpg.max_steps`` always saves: ``ckpt.save_steps`` is 1 for
        this call); the store begins the tag; the part adds its files and ``client_states`` entries (the RPG
        reference, before the checkpoint names them); OpenRLHF's logs and save (into the staging
        directory); the part after the checkpoint; the store commits the tag; the budget's last step.
        """
        budget = run_length.StepBudget.of(self)
        last = budget.is_last(global_step)
        # OpenRLHF's save decides from ckpt.save_steps alone (seam save_steps)
        forced = seam.swapped(self.args.ckpt, save_steps=1) if last else contextlib.nullcontext()
        client_states = {} if client_states is None else client_states  # one dict: fit() reuses it
        with forced:
            store, part = CheckpointStore.of(self), _part(self)
            tag = f"global_step{global_step}"
            saving = global_step % self.args.ckpt.save_steps == 0
            if saving:
                store.begin(tag)
                if part is not None:
                    part.add_to_checkpoint(store, client_states, tag)
            super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
            if saving:
                if part is not None:
                    part.after_checkpoint(store, client_states)
                store.commit(tag, global_step)
        if last:
            budget.reached()

    def save_best_checkpoint(self, eval_metrics: Any, global_step: int, client_states: Any = None) -> Any:
        """OpenRLHF's, decided inside (a new best or nothing), begun and committed around it; the part's
        files are written first (a best checkpoint becomes DeepSpeed's ``latest`` too); one that is not
        used is pruned at the next regular save."""
        if not eval_metrics:  # OpenRLHF saves nothing then
            return super().save_best_checkpoint(eval_metrics, global_step, client_states)
        store, part = CheckpointStore.of(self), _part(self)
        tag = f"best_global_step{global_step}"
        client_states = {} if client_states is None else client_states
        store.begin(tag, rewrite=False)
        if part is not None:
            part.add_to_checkpoint(store, client_states, tag)
        result = super().save_best_checkpoint(eval_metrics, global_step, client_states)
        if store.written(tag):  # OpenRLHF saved it: a new best
            store.commit(tag, global_step)
        else:
            store.abandon(tag)
        return result

    def init_checkpoint_states(self) -> dict:
        """OpenRLHF's (the checkpoint's ``client_states``, or a fresh start's), then the part's state back."""
        states = super().init_checkpoint_states()
        part = _part(self)
        if part is not None:
            part.restore(CheckpointStore.of(self), states)
        return states


def _part(trainer: Any) -> CheckpointPart | None:
    make = getattr(trainer, "checkpoint_part", None)
    return None if make is None else make()


def log(message: str) -> None:
    from openrlhf.utils.logging_utils import init_logger

    init_logger(__name__).info(f"[rpg] checkpoint: {message}")
