"""Staged saves: the policy workers write a checkpoint into a fresh directory the run created, and the
trainer moves it into place once every rank is done (stock and RPG runs that commit their checkpoints).

OpenRLHF's workers write a checkpoint straight into its final names (``<ckpt.path>/_actor/<tag>/``,
``_actor/latest``, ``<tag>_hf/``), following a link found there and writing into whatever directory is
already there. A check before the save cannot hold for the whole save: a ``global_step3_hf -> /elsewhere``
planted after it received the weights and the marker, and a ``global_step3_hf`` copied in by hand was
written into and then marked complete. So:

1. **before the save** (trainer, :func:`create`): a new directory ``<ckpt.path>/.rpg_staging/<tag>.<random>``
   (mode 0700; ``mkdir`` fails on anything already at the name), recorded in ``rpg_saving.json`` with
   its inode, and the inodes of the run's own directories the save will replace (a rewrite after a
   resume from an earlier step);
2. **the save** (each policy worker, :class:`StagedSaveMixin`): the staging directory is opened one
   component at a time with ``O_NOFOLLOW``, its inode compared with the record, and OpenRLHF's
   ``save_checkpoint`` runs with ``args.ckpt.path = /proc/self/fd/<fd>`` (seam ``staged_save_path``):
   every file DeepSpeed and ``save_pretrained`` write is resolved from that open directory, whatever is
   renamed or planted under ``--ckpt.path`` meanwhile;
3. **after every rank returned** (trainer, :func:`publish`): the staged tree holds no link and nothing
   but files and directories (walked without following any), the completeness markers are written into
   it, then each directory is renamed into place (``renameat`` between directory descriptors: never
   over an entry other than the one recorded at step 1, never through a link), the Hugging Face one
   first and DeepSpeed's last (the commit), then DeepSpeed's ``latest``.

OpenRLHF's rotation (``--ckpt.max_num``, ``--ckpt.max_mem``, one best checkpoint) runs inside the
workers' save over the directory they write, now the empty staging one: the trainer applies the same
rule after the commit (:func:`rotate`), so a kill while saving never leaves fewer complete checkpoints.
A kill leaves the staging directory behind: the next start removes it (:func:`remove_leftovers`).

Not covered: a link planted *inside* the staging directory (its random name found, mode 0700, so only by
the run's own user) before a worker creates the entry there would receive that worker's file; step 3
then refuses the save (no link is ever moved into place). OpenRLHF's critic (``_critic/<tag>``, runs
with a value model) still writes in place.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rpg_openrlhf.common import checkpoints, seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.writes import OutputDir, UnsafePathError

#: Under ``--ckpt.path``: one fresh directory per save being written.
STAGING_DIR = ".rpg_staging"
#: In the args the workers get: the run stages its saves (set by ``checkpoints.resume.prepare``).
STAGED_KEY = "ckpt.rpg_staged"
#: In ``rpg_saving.json``: tag -> {"name", "ino", "replaces": {entry: ino}}.
RECORD_KEY = "staging"
#: DeepSpeed's files beside the tags in ``_actor`` (moved from the staging directory after the commit).
ACTOR_FILES = ("latest", "zero_to_fp32.py")
#: OpenRLHF's metric file in a DeepSpeed tag directory (``DeepspeedStrategy.CKPT_METRIC_FILENAME``).
METRIC_FILE = "metric.json"
#: In ``--ckpt.path``: the tags the trainer began to write and has not committed yet, with their
#: staging directories (written by commit.py, read by the workers here: no import of commit).
SAVING = "rpg_saving.json"
FLAG = "--ckpt.path"


def root(ckpt_path: str | Path) -> OutputDir:
    return OutputDir.open(ckpt_path, flag=FLAG)


def final_names(tag: str) -> tuple[str, str]:
    """(DeepSpeed's directory below ``_actor``, the Hugging Face directory below ``--ckpt.path``)."""
    return tag, f"{tag}{checkpoints.HF_SUFFIX}"


# ----------------------------------------------------------------------------- 1. before the save
def create(out: OutputDir, tag: str, replaces: dict[str, int]) -> dict[str, Any]:
    """A fresh staging directory for ``tag``; returns its record for ``rpg_saving.json``."""
    with out.subdir(STAGING_DIR, create=True) as staging_root:
        name = f"{tag}.{secrets.token_hex(6)}"
        with staging_root.mkdir_fresh(name, 0o700) as staged:
            ino = os.fstat(staged.fd).st_ino
    return {"name": f"{STAGING_DIR}/{name}", "ino": ino, "replaces": replaces}


def remove_leftovers(out: OutputDir) -> list[str]:
    """Remove what killed saves left in ``.rpg_staging`` (the run's own; a link there is removed, not
    followed). Returns the names removed."""
    what = out.kind(STAGING_DIR)
    if what is None:
        return []
    if what != "a directory":
        out.remove(STAGING_DIR)
        return [STAGING_DIR]
    with out.subdir(STAGING_DIR) as staging_root:
        names = staging_root.names()
    out.remove(STAGING_DIR)
    return names


# ----------------------------------------------------------------------------- 2. the save, in each worker
def read_record(out: OutputDir, saving: str) -> dict[str, Any]:
    """``rpg_saving.json``'s content (read without following a link; {} when absent or unreadable)."""
    try:
        with out.open_file(saving) as f:
            body = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def open_staged(out: OutputDir, entry: dict[str, Any], tag: str) -> OutputDir:
    """The staging directory of ``entry``, reached without following a link, and the one created for
    this save (its inode; the name is random, so only a rename of it could put another there)."""
    if not isinstance(entry.get("name"), str):
        raise UnsafePathError(
            f"{FLAG} {out.path}: no staging directory recorded for {tag} in rpg_saving.json; the checkpoint "
            "is never written or moved in place without one"
        )
    staged = out.subdir(entry["name"])
    if os.fstat(staged.fd).st_ino != entry.get("ino"):
        staged.close()
        raise UnsafePathError(
            f"{out.shown(entry['name'])}: not the directory the trainer created to save {tag} in (replaced "
            "while the run went on); nothing of the checkpoint is written through it"
        )
    return staged


@contextlib.contextmanager
def worker_path(ckpt_path: str, tag: str, saving: str) -> Iterator[str]:
    """In a policy worker: ``/proc/self/fd/N`` of ``tag``'s staging directory, open for the block."""
    with root(ckpt_path) as out:
        entry = read_record(out, saving).get(RECORD_KEY, {}).get(tag)
        with open_staged(out, entry if isinstance(entry, dict) else {}, tag) as staged:
            os.set_inheritable(staged.fd, False)
            yield f"/proc/self/fd/{staged.fd}"


class StagedSaveMixin:
    """Policy actor mixin: OpenRLHF's ``save_checkpoint`` writes into the staging directory the trainer
    created for the tag (module docstring, step 2), reached through an open descriptor."""

    def save_checkpoint(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        ckpt = self.strategy.args.ckpt
        if not _get(self.strategy.args, STAGED_KEY):
            return super().save_checkpoint(tag, *args, **kwargs)  # OpenRLHF's own trainer (stock async)
        with (
            worker_path(ckpt.path, tag, SAVING) as path,
            seam.swapped(ckpt, path=path),
        ):  # seam staged_save_path
            return super().save_checkpoint(tag, *args, **kwargs)


def use_staged_save_actor(module: Any) -> None:
    """The seam's ``staged_save_actor``: the current ``PolicyModelActor`` with :class:`StagedSaveMixin`
    in front (outermost: the RNG state's file goes into the staging directory too)."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, StagedSaveMixin)


# ----------------------------------------------------------------------------- 3. after every rank returned
def _check_tree(staged: OutputDir) -> None:
    """Nothing in the staged tree but directories and regular files (a link planted inside is named)."""
    for rel, st in staged.walk():
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise UnsafePathError(
                f"{staged.shown(rel)}: a checkpoint holds only files and directories, not a link or a device; "
                "the checkpoint is not moved into place (the run stopped)"
            )


def written(staged: OutputDir, tag: str) -> bool:
    """Whether the workers wrote DeepSpeed's directory of ``tag`` into ``staged``."""
    return staged.kind(f"{checkpoints.ACTOR_DIR}/{tag}") == "a directory"


def _put(
    src: OutputDir, name: str, dest: OutputDir, dest_name: str, replaces: int | None, aside: OutputDir
) -> None:
    """Move ``src/name`` to ``dest/dest_name``; the run's own directory there (inode ``replaces``) is
    moved into ``aside`` first; anything else there is refused."""
    what = dest.kind(dest_name)
    if what is not None:
        if replaces is None or dest.stat(dest_name).st_ino != replaces or what != "a directory":
            raise UnsafePathError(
                f"{dest.shown(dest_name)}: {what} appeared there while the run saved it (not the run's own); "
                "the checkpoint is not moved over or through it: move it out of --ckpt.path and resume"
            )
        dest.move(dest_name, aside, f"replaced-{dest_name}")
    src.move(name, dest, dest_name)


def publish(out: OutputDir, tag: str, entry: dict[str, Any], global_step: int) -> bool:
    """Mark the staged checkpoint and move it into place (module docstring, step 3). Returns False when
    the workers wrote no DeepSpeed directory (``--ckpt.disable_ds``: the Hugging Face one is still
    published)."""
    ds_name, hf_name = final_names(tag)
    replaces = entry.get("replaces") or {}
    with open_staged(out, entry, tag) as staged:
        _check_tree(staged)
        has_ds, has_hf = written(staged, tag), staged.kind(hf_name) == "a directory"
        if has_hf:
            with staged.subdir(hf_name) as d:
                checkpoints.write_marker(d, tag, global_step)
        if has_ds:
            with staged.subdir(f"{checkpoints.ACTOR_DIR}/{tag}") as d:
                checkpoints.write_marker(d, tag, global_step)
        if has_hf:
            _put(staged, hf_name, out, hf_name, replaces.get(hf_name), staged)
        if not has_ds:
            return False
        with (
            out.subdir(checkpoints.ACTOR_DIR, create=True) as actor,
            staged.subdir(checkpoints.ACTOR_DIR) as src,
        ):
            _put(
                src, ds_name, actor, ds_name, replaces.get(f"{checkpoints.ACTOR_DIR}/{ds_name}"), staged
            )  # the commit
            for name in ACTOR_FILES:
                if src.kind(name) == "a regular file":
                    src.replace_entry(name, actor, name)
    return True


def discard(out: OutputDir, entry: dict[str, Any]) -> None:
    """Remove a staging directory (published, or a best checkpoint OpenRLHF decided not to save)."""
    if isinstance(entry.get("name"), str):
        with contextlib.suppress(FileNotFoundError):
            out.remove(entry["name"])


# ----------------------------------------------------------------------------- rotation, after the commit
def _metric(out: OutputDir, tag_dir: str) -> float | None:
    """OpenRLHF's checkpoint metric (``_read_ckpt_metric``: None when absent or unreadable)."""
    try:
        with out.open_file(f"{tag_dir}/{METRIC_FILE}") as f:
            value = json.loads(f.read().decode("utf-8")).get("metric_value")
        return None if value is None else float(value)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _size(out: OutputDir, name: str) -> int:
    """Bytes of a checkpoint's files as OpenRLHF counts them (the completeness marker aside)."""
    with out.subdir(name) as d:
        return sum(
            st.st_size for rel, st in d.walk() if stat.S_ISREG(st.st_mode) and rel != checkpoints.MARKER
        )


def rotate(out: OutputDir, new_tag: str, max_num: int, max_mem_gib: float) -> list[str]:
    """OpenRLHF's rotation of ``_actor`` (``DeepspeedStrategy.save_ckpt``, seam ``checkpoint_rotation``),
    after ``new_tag`` was committed instead of before it was written: a new best removes the other best
    ones; then regular checkpoints other than ``new_tag`` are removed while more than ``max_num`` regular
    ones remain (not for a best save) or the others take more than ``max_mem_gib`` GiB, those without a
    metric first, then the worst metric, then the oldest. Only the run's complete checkpoints count and
    are removed: a directory someone else put there is never deleted. Returns the removed tags."""
    if out.kind(checkpoints.ACTOR_DIR) != "a directory":
        return []
    removed: list[str] = []
    with out.subdir(checkpoints.ACTOR_DIR) as actor:
        dirs = [
            n
            for n in actor.names()
            if actor.kind(n) == "a directory" and checkpoints.is_complete(actor.shown(n))
        ]
        is_best = new_tag.startswith("best")
        if is_best:
            for name in [n for n in dirs if n.startswith("best") and n != new_tag]:
                actor.remove(name)
                removed.append(name)
                dirs.remove(name)
        limit = math.inf if max_mem_gib is None else max_mem_gib * 1024**3
        while True:
            others = [n for n in dirs if n != new_tag]
            regular = [n for n in others if not n.startswith("best")]
            over_num = not is_best and max_num is not None and len(regular) + 1 > max_num  # with new_tag
            over_mem = sum(_size(actor, n) for n in others) > limit
            if not regular or not (over_num or over_mem):
                return removed
            metrics = {n: _metric(actor, n) for n in regular}
            victim = min(regular, key=lambda n: (metrics[n] is not None,
                                                 -math.inf if metrics[n] is None else metrics[n], actor.stat(n).st_mtime))  # fmt: skip
            actor.remove(victim)
            removed.append(victim)
            dirs.remove(victim)
