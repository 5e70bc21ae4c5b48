"""Committed checkpoints, for stock and RPG runs: a checkpoint counts once every piece of it is written.

OpenRLHF's ``save_logs_and_checkpoints`` (the trainer) has the actor ranks write DeepSpeed's checkpoint
(``<ckpt.path>/_actor/<tag>/``, ``_actor/latest``), then the Hugging Face weights (``<tag>_hf/``), and
returns when every rank is done; the RPG trainer writes its reference weights before (plugin/trainer.py).
None of it is atomic. :class:`CheckpointCommitMixin` wraps that call: before it, the markers of the tag
are removed (a tag written again is never taken for complete); after it returns, it writes the
completeness marker (``rpg_openrlhf.common.checkpoints``) into ``<tag>_hf/`` and then into
``_actor/<tag>/``, which is the commit: resume (``extras.resume``) and ``rpg-eval`` read a checkpoint
only when it is committed.

Before the save the trainer records the tag in ``<ckpt.path>/`` :data:`SAVING` (atomic; the tag is
dropped again after the commit): resume removes a torn directory only when the run recorded writing
it, never a directory it did not write (a copied-in one) nor a committed one. No write goes through a
symbolic link among the entries the run writes (:func:`refuse_links`): the run refuses to start, or
to save, naming the link (``ln -s /elsewhere <ckpt.path>/global_step2_hf`` would otherwise receive the
weights, the tokenizer and the marker).

``--ckpt.max_num 1``: OpenRLHF deletes the previous checkpoint *before* writing the next one, so a kill
while saving would leave none. ``extras.resume.prepare`` lets the workers keep 2 and records the 1 asked
for (``ckpt.max_num_after_commit``); the mixin removes the older one once the new one is committed.

The trainer reads ``--ckpt.path`` as OpenRLHF's trainer does (its ``init_checkpoint_states`` checks it):
on several nodes it must be shared storage.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rpg_openrlhf.common import checkpoints
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import rpg_enabled
from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.extras import hold, run_settings

#: Set by ``extras.resume.prepare`` when it raised ``--ckpt.max_num 1`` to 2 for the workers.
KEEP_KEY = "ckpt.max_num_after_commit"
#: In ``--ckpt.path``: the tags the trainer began to write and has not committed yet.
SAVING = "rpg_saving.json"
#: Under ``--ckpt.path``, what the run writes besides the tag directories (checked for links).
RUN_ENTRIES = (checkpoints.ACTOR_DIR, "_rpg_reference", checkpoints.RUN_FILE, SAVING, run_settings.FILE)


def being_written(ckpt_path: str | Path) -> set[str]:
    """The tags the trainer recorded as begun and not committed (a kill leaves them here)."""
    try:
        tags = json.loads((Path(ckpt_path) / SAVING).read_text(encoding="utf-8")).get("tags")
    except (OSError, ValueError, AttributeError):
        return set()
    return {t for t in tags if isinstance(t, str)} if isinstance(tags, list) else set()


def _record(ckpt_path: str | Path, tags: set[str]) -> None:
    os.makedirs(ckpt_path, exist_ok=True)
    with atomic_write(Path(ckpt_path) / SAVING) as f:
        json.dump({"format": 1, "tags": sorted(tags)}, f)


def begin(ckpt_path: str | Path, tag: str) -> None:
    """Record that the run writes ``tag`` now (before any of its files)."""
    _record(ckpt_path, being_written(ckpt_path) | {tag})


def end(ckpt_path: str | Path, *tags: str) -> None:
    """``tags`` are committed, or removed: no longer being written."""
    now = being_written(ckpt_path)
    if now & set(tags):
        _record(ckpt_path, now - set(tags))


def links(ckpt_path: str | Path) -> list[Path]:
    """Symbolic links among the entries the run writes under ``ckpt_path``: the tag directories
    (``_actor/<tag>``, ``<tag>_hf``), ``_actor/latest``, the reference files and the run's own files."""
    root = Path(ckpt_path)
    if not root.is_dir():
        return []
    found = [root / n for n in RUN_ENTRIES if (root / n).is_symlink()]
    found += [d for d in root.iterdir() if checkpoints.tag_step(d.name) is not None and d.is_symlink()]
    for sub, owned in ((checkpoints.ACTOR_DIR, lambda n: n == "latest" or checkpoints.tag_step(n) is not None),
                       ("_rpg_reference", lambda n: True)):  # fmt: skip
        d = root / sub
        if d.is_dir() and not d.is_symlink():
            found += [e for e in d.iterdir() if owned(e.name) and e.is_symlink()]
    return sorted(found)


def refuse_links(ckpt_path: str | Path) -> None:
    """ValueError naming the first symbolic link the run would write through (:func:`links`)."""
    found = links(ckpt_path)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(
            f"--ckpt.path {ckpt_path}: {found[0]} is a symbolic link (to {os.readlink(found[0])}){more}; the run "
            "writes its checkpoints there and never through a link: remove the link"
        )


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
    return not (_get(args, "train.async_enable") and not rpg_enabled(args))


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
            refuse_links(path)  # planted while the run went on: nothing is written through it
            begin(path, tag)
            uncommit(path, tag)
        super().save_logs_and_checkpoints(global_step, logs_dict, client_states)
        if saving and commit(path, tag, global_step):
            keep = _get(self.args, KEEP_KEY)
            removed = prune_regular(path, keep) if keep else []
            _log(f"committed {tag}" + (f"; removed the previous {', '.join(removed)}" if removed else ""))
        if saving:
            end(path, tag)

    def save_best_checkpoint(self, eval_metrics: Any, global_step: int, client_states: Any = None) -> Any:
        path, tag = self.args.ckpt.path, f"best_global_step{global_step}"
        if not eval_metrics:  # OpenRLHF saves nothing then
            return super().save_best_checkpoint(eval_metrics, global_step, client_states)
        refuse_links(path)
        begin(path, tag)  # OpenRLHF decides inside whether it is a new best
        result = super().save_best_checkpoint(eval_metrics, global_step, client_states)
        if tag_dirs(path, tag)[0].is_dir():  # OpenRLHF saved it: a new best
            commit(path, tag, global_step)
            _log(f"committed {tag}")
        end(path, tag)
        return result


def _log(message: str) -> None:
    from openrlhf.utils.logging_utils import init_logger

    init_logger(__name__).info(f"[rpg] checkpoint: {message}")
