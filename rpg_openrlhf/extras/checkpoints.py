"""Committed checkpoints, for stock and RPG runs: a checkpoint counts once every piece of it is written.

OpenRLHF's ``save_logs_and_checkpoints`` (the trainer) has the actor ranks write DeepSpeed's checkpoint
(``<ckpt.path>/_actor/<tag>/``, ``_actor/latest``), then the Hugging Face weights (``<tag>_hf/``), and
returns when every rank is done; the RPG trainer writes its reference weights before (plugin/trainer.py).
None of it is atomic. :class:`CheckpointCommitMixin` wraps that call: before it, the markers of the tag
are removed (a tag written again is never taken for complete); after it returns, it writes the
completeness marker (``rpg_openrlhf.common.checkpoints``) into ``<tag>_hf/`` and then into
``_actor/<tag>/``, which is the commit: resume (``extras.resume``) and ``rpg-eval`` read a checkpoint
only when it is committed.

``--ckpt.max_num 1``: OpenRLHF deletes the previous checkpoint *before* writing the next one, so a kill
while saving would leave none. ``extras.resume.prepare`` lets the workers keep 2 and records the 1 asked
for (``ckpt.max_num_after_commit``); the mixin removes the older one once the new one is committed.

The trainer reads ``--ckpt.path`` as OpenRLHF's trainer does (its ``init_checkpoint_states`` checks it):
on several nodes it must be shared storage.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rpg_openrlhf.common import checkpoints
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.extras import hold

#: Set by ``extras.resume.prepare`` when it raised ``--ckpt.max_num 1`` to 2 for the workers.
KEEP_KEY = "ckpt.max_num_after_commit"


def tag_dirs(ckpt_path: str | Path, tag: str) -> tuple[Path, Path]:
    """(DeepSpeed's directory, the Hugging Face directory) of checkpoint ``tag``."""
    root = Path(ckpt_path)
    return root / checkpoints.ACTOR_DIR / tag, root / f"{tag}{checkpoints.HF_SUFFIX}"


def uncommit(ckpt_path: str | Path, tag: str) -> None:
    """Remove the markers of ``tag`` (the DeepSpeed one first: it is the commit)."""
    for directory in tag_dirs(ckpt_path, tag):
        checkpoints.remove_marker(directory)


def commit(ckpt_path: str | Path, tag: str, global_step: int) -> bool:
    """Mark ``tag`` complete: the Hugging Face directory, then DeepSpeed's (the commit). Call only after
    every rank finished writing it. Returns False when DeepSpeed's directory is absent (``--ckpt.disable_ds``:
    the Hugging Face one is still marked)."""
    ds_dir, hf_dir = tag_dirs(ckpt_path, tag)
    hold.hold("commit", global_step)
    if hf_dir.is_dir():
        checkpoints.write_marker(hf_dir, tag, global_step)
    if not ds_dir.is_dir():
        return False
    checkpoints.write_marker(ds_dir, tag, global_step)
    return True


def prune_regular(ckpt_path: str | Path, keep: int) -> list[str]:
    """Remove the oldest regular DeepSpeed checkpoints beyond the ``keep`` newest (best ones are kept,
    as OpenRLHF's rotation does; Hugging Face directories are never rotated). Returns the removed tags."""
    actor = Path(ckpt_path) / checkpoints.ACTOR_DIR
    if not actor.is_dir():
        return []
    regular = sorted(
        (step, d.name)
        for d in actor.iterdir()
        if d.is_dir() and not d.name.startswith("best") and (step := checkpoints.tag_step(d.name)) is not None
    )
    removed = [name for _, name in regular[: max(0, len(regular) - keep)]]
    for name in removed:
        shutil.rmtree(actor / name, ignore_errors=True)
    return removed


def committed(args: Any) -> bool:
    """Whether the run's trainer commits its checkpoints: every ``rpg-train`` trainer but OpenRLHF's own
    async one, which stock runs under ``--train.async_enable`` keep (their checkpoints are read as
    OpenRLHF reads them)."""
    return not (_get(args, "train.async_enable") and _get(args, "rpg.loss") is None)


class CheckpointCommitMixin:
    """Trainer mixin: OpenRLHF's checkpoint calls, committed with markers once complete.

    Put it after ``RunLengthMixin`` (whose last-step save sets ``ckpt.save_steps`` to 1 around the call)
    and before the trainer whose saves it commits (the RPG trainer's reference file is then inside).
    """

    def save_logs_and_checkpoints(
        self, global_step: int, logs_dict: Any = None, client_states: Any = None
    ) -> None:
        path = self.args.ckpt.path
        tag = f"global_step{global_step}"
        saving = global_step % self.args.ckpt.save_steps == 0
        if saving:
            uncommit(path, tag)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if saving and commit(path, tag, global_step):
            keep = _get(self.args, KEEP_KEY)
            removed = prune_regular(path, keep) if keep else []
            _log(f"committed {tag}" + (f"; removed the previous {', '.join(removed)}" if removed else ""))

    def save_best_checkpoint(self, eval_metrics: Any, global_step: int, client_states: Any = None) -> Any:
        result = super().save_best_checkpoint(eval_metrics, global_step, client_states)
        tag = f"best_global_step{global_step}"
        if tag_dirs(self.args.ckpt.path, tag)[0].is_dir():  # OpenRLHF saved it: a new best
            commit(self.args.ckpt.path, tag, global_step)
            _log(f"committed {tag}")
        return result


def _log(message: str) -> None:
    from openrlhf.utils.logging_utils import init_logger

    init_logger(__name__).info(f"[rpg] checkpoint: {message}")
