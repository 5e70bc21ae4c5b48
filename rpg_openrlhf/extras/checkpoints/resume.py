"""Before a run starts (driver side, before Ray): one run per checkpoint directory, and resume from the last
*complete* checkpoint (OpenRLHF resumes from whatever ``_actor/latest`` names: after a kill, a torn
checkpoint or nothing). :func:`prepare` takes the run's lock (``run_lock``); refuses, before anything
changes, a folder the run did not write where it will save and a resume with other settings
(``extras.run_settings``); declares the run's checkpoints marked (``common.checkpoints.declare``: from
the step resumed for a run from before markers); removes what a killed save left (its staging directory
and the torn tags recorded in ``rpg_saving.json``); with ``--ckpt.load_enable`` points ``latest`` at the
newest complete checkpoint (none: step 0), one line saying so; and tells the workers to stage their
saves. Stock ``--train.async_enable`` runs keep OpenRLHF's own trainer: only the lock.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rpg_openrlhf.common import checkpoints
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import set_value
from rpg_openrlhf.common.atomic import atomic_write, mark
from rpg_openrlhf.extras import run_settings
from rpg_openrlhf.extras.checkpoints import run_lock, staging
from rpg_openrlhf.extras.checkpoints.commit import being_written, committed, end

LATEST = "latest"


def _tags(actor: Path) -> dict[str, int]:
    """DeepSpeed checkpoint directories under ``_actor``: name -> global step."""
    if not actor.is_dir():
        return {}
    return {
        d.name: s for d in actor.iterdir() if d.is_dir() and (s := checkpoints.tag_step(d.name)) is not None
    }


def _read_latest(actor: Path) -> str | None:
    try:
        return (actor / LATEST).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def torn(run_dir: Path) -> list[Path]:
    """Every torn checkpoint directory of ``run_dir`` (DeepSpeed's and Hugging Face's), by step."""
    actor = run_dir / checkpoints.ACTOR_DIR
    found = [actor / name for name in _tags(actor)]
    found += [d for d in run_dir.iterdir() if d.is_dir() and d.name.endswith(checkpoints.HF_SUFFIX)]
    bad = [
        d
        for d in found
        if checkpoints.tag_step(d.name) is not None and checkpoints.state(d, run_dir) == "torn"
    ]
    return sorted(bad, key=lambda d: (checkpoints.tag_step(d.name), d.name))


def last_complete(run_dir: str | Path) -> str | None:
    """The tag to resume: ``latest`` when it names a checkpoint that is not torn, else the newest
    one that is not torn (a regular tag before a best one of the same step); None when there is none."""
    run_dir = Path(run_dir)
    actor = run_dir / checkpoints.ACTOR_DIR
    tags = {t: s for t, s in _tags(actor).items() if checkpoints.state(actor / t, run_dir) != "torn"}
    latest = _read_latest(actor)
    if latest in tags:
        return latest
    return max(tags, key=lambda t: (tags[t], not t.startswith("best")), default=None)


def last_complete_dir(args: Any) -> str | None:
    """The DeepSpeed directory a resume of this run would load now (:func:`last_complete`), or None."""
    run_dir = Path(_get(args, "ckpt.path"))
    tag = last_complete(run_dir)
    return str(run_dir / checkpoints.ACTOR_DIR / tag) if tag else None


def _declare(run_dir: Path, resuming: bool) -> None:
    if checkpoints.declared_since(run_dir) is not None:
        return
    actor = run_dir / checkpoints.ACTOR_DIR
    # A run from before markers: its checkpoints up to the one resumed are trusted as OpenRLHF would.
    tags = _tags(actor) if resuming else {}
    since = tags.get(_read_latest(actor) or "", max(tags.values(), default=0))
    checkpoints.declare(run_dir, since)


def _tag_name(d: Path) -> str:
    return d.name.removesuffix(checkpoints.HF_SUFFIX)


def _extras(run_dir: Path) -> list[str]:
    """Warnings naming what was added to complete checkpoints (kept; they stay complete)."""
    actor = run_dir / checkpoints.ACTOR_DIR
    dirs = [actor / t for t in _tags(actor)] + [
        d for d in run_dir.iterdir() if d.name.endswith(checkpoints.HF_SUFFIX) and d.is_dir()
    ]
    notes = []
    for d in sorted(dirs, key=lambda d: (checkpoints.tag_step(d.name) or 0, str(d))):
        extra = checkpoints.extra_files(d) if checkpoints.is_complete(d) else []
        if extra:
            notes.append(
                f"warning: {d} holds files the run did not write (kept; the checkpoint is complete): "
                f"{', '.join(extra)}"
            )
    return notes


def _clear_actor(actor: Path) -> None:
    """OpenRLHF fails on an ``_actor`` without a checkpoint to load: remove what DeepSpeed left there
    (``latest``, ``zero_to_fp32.py``) and the directory; refuse when something else is in it."""
    if not actor.is_dir():
        return
    for name in staging.ACTOR_FILES:  # what DeepSpeed writes beside the tags
        if (actor / name).is_file():
            (actor / name).unlink()
    others = sorted(p.name for p in actor.iterdir())
    if others:
        raise ValueError(
            f"{actor}: no complete checkpoint to resume, but it holds what the run did not write or "
            f"cannot remove ({', '.join(others)}); move them away, or use another --ckpt.path"
        )
    actor.rmdir()


def _ours_torn(run_dir: Path) -> list[Path]:
    """Torn directories the trainer recorded writing (no marker): what a killed save left."""
    writing = being_written(run_dir)
    return [d for d in torn(run_dir) if not (d / checkpoints.MARKER).exists() and _tag_name(d) in writing]


def _remove_killed_saves(run_dir: Path) -> list[str]:
    """Remove a killed save's staging directory and the torn directories the run recorded writing."""
    left = staging.remove_leftovers(run_dir)
    ours = _ours_torn(run_dir)
    for d in ours:
        shutil.rmtree(d)
    end(run_dir, *{_tag_name(d) for d in ours}, *(n.rsplit(".", 1)[0] for n in left))
    notes = []
    if left:
        notes.append(
            f"save(s) stopped before their commit left their files in {run_dir / staging.STAGING_DIR}: removed "
            f"({', '.join(sorted(n.rsplit('.', 1)[0] for n in left))})"
        )
    if ours:
        notes.append(
            f"torn checkpoint(s) in {run_dir} passed over and removed (no completeness marker: the run "
            f"stopped while writing them): {', '.join(d.name for d in ours)}"
        )
    return notes


def _select(run_dir: Path) -> list[str]:
    """Pass over torn checkpoints: point ``latest`` at the last complete one; leave the torn ones the
    run did not write (they are before the step resumed: :func:`_refuse_in_the_way`)."""
    actor = run_dir / checkpoints.ACTOR_DIR
    notes = _extras(run_dir)
    bad = torn(run_dir)
    keep = last_complete(run_dir)
    was = _read_latest(actor)
    if bad:
        notes.append(
            f"incomplete checkpoint(s) in {run_dir} passed over and left in place (a completeness marker "
            "whose files changed since, or a directory this run did not write): "
            + ", ".join(d.name for d in bad)
        )
    if keep is None:
        _clear_actor(actor)
        if bad or was:
            notes.append(f"no complete checkpoint in {run_dir}: starting from step 0")
        return notes
    if keep != was:
        with atomic_write(actor / LATEST) as f:
            f.write(keep)
    notes.append(f"resuming from {keep} (the last complete checkpoint in {run_dir})")
    return notes


def _in_the_way(run_dir: Path, start: int) -> list[str]:
    """Entries at the name of a checkpoint the run may write (a step after ``start``) that it did not
    write: not complete, not recorded as being written (a folder copied in by hand)."""
    writing = being_written(run_dir)
    actor = run_dir / checkpoints.ACTOR_DIR
    entries = [
        actor / n
        for n in (
            sorted(p.name for p in actor.iterdir()) if actor.is_dir() and not actor.is_symlink() else []
        )
    ]
    entries += sorted(run_dir.iterdir())
    found = []
    for d in entries:
        step = checkpoints.tag_step(d.name)
        if step is None or step <= start or d == actor:
            continue
        if d.is_dir() and not d.is_symlink() and (checkpoints.is_complete(d) or _tag_name(d) in writing):
            continue
        found.append(d.relative_to(run_dir).as_posix())
    return found


def _refuse_in_the_way(run_dir: Path, resuming: bool) -> None:
    tag = last_complete(run_dir) if resuming else None
    start = checkpoints.tag_step(tag) or 0 if tag else 0
    found = _in_the_way(run_dir, start)
    if found:
        shown = ", ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
        raise ValueError(
            f"--ckpt.path {run_dir}: {shown} not written by this run (no completeness marker) where the run "
            f"saves the steps after {start}; it would be written into: move it out of --ckpt.path, or use "
            "another --ckpt.path"
        )


def prepare(args: Any) -> list[str]:
    """Driver side, before Ray: lock, check, declare, clean up, select the checkpoint to resume, stage
    the saves. Returns the lines to log."""
    saves = _get(args, "ckpt.save_steps", -1) != -1 or _get(args, "rpg.max_steps") is not None
    if not saves and not _get(args, "ckpt.load_enable"):
        return []  # nothing will be written or read
    run_dir = Path(_get(args, "ckpt.path"))
    run_lock.acquire(args, run_dir)  # one run per checkpoint directory, for the life of this process
    mark(run_dir, "rpg-train")  # checked by the preflight (a foreign non-empty folder: refused)
    if not committed(args):
        return []  # OpenRLHF's own trainer writes and reads them (stock async runs)
    resuming = bool(_get(args, "ckpt.load_enable")) and (run_dir / checkpoints.ACTOR_DIR).is_dir()
    _refuse_in_the_way(run_dir, resuming)
    # another run's settings are refused before anything changes here (only a checkpoint can mix runs)
    notes = run_settings.check(args, run_dir, resuming and last_complete(run_dir) is not None)
    _declare(run_dir, resuming)
    notes += _remove_killed_saves(run_dir)
    if resuming:
        notes += _select(run_dir)
    set_value(args, staging.STAGED_KEY, True)  # the workers write into staging directories
    return notes
