"""Staged saves. OpenRLHF's workers write straight into the final names (``_actor/<tag>/``, ``latest``,
``<tag>_hf/``), rotating older checkpoints out first; here instead:

1. the trainer (:func:`create`) makes ``<ckpt.path>/.rpg_staging/<tag>.<random>/``, recorded in
   ``rpg_saving.json``;
2. each policy worker (:class:`StagedSaveMixin`) runs OpenRLHF's ``save_checkpoint`` with ``args.ckpt.path``
   at that directory (``/proc/self/fd/N``, seam ``staged_save_path``), so OpenRLHF's rotation sees nothing;
3. after every rank returned, the trainer (:func:`publish`) writes the markers, renames the Hugging Face
   directory, then DeepSpeed's (the commit), then ``latest``; :func:`rotate` applies OpenRLHF's rule.

A kill leaves the staging directory behind; the next start removes it (:func:`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rpg_openrlhf.common import checkpoints, seam
from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.atomic import UnsafePathError

#: Under ``--ckpt.path``: one fresh directory per save being written.
STAGING_DIR = ".rpg_staging"
#: In the args the workers get: the run stages its saves (set by ``checkpoints.resume.prepare``).
STAGED_KEY = "ckpt.rpg_staged"
#: In ``rpg_saving.json``: tag -> {"name": the staging directory below --ckpt.path}.
RECORD_KEY = "staging"
#: DeepSpeed's files beside the tags in ``_actor`` (moved from the staging directory after the commit).
ACTOR_FILES = ("latest", "zero_to_fp32.py")
#: OpenRLHF's metric file in a DeepSpeed tag directory (``DeepspeedStrategy.CKPT_METRIC_FILENAME``).
METRIC_FILE = "metric.json"
#: In ``--ckpt.path``: the tags the trainer began and has not committed, with their staging directories.
SAVING = "rpg_saving.json"
FLAG = "--ckpt.path"


def create(ckpt_path: str | Path, tag: str) -> dict[str, Any]:
    """A fresh staging directory for ``tag``; returns its record for ``rpg_saving.json``."""
    name = f"{STAGING_DIR}/{tag}.{secrets.token_hex(6)}"
    (Path(ckpt_path) / STAGING_DIR).mkdir(parents=True, exist_ok=True)
    (Path(ckpt_path) / name).mkdir(0o700)
    return {"name": name}


def remove_leftovers(ckpt_path: str | Path) -> list[str]:
    """Remove what killed saves left in ``.rpg_staging`` (only the run writes there); the names removed."""
    root = Path(ckpt_path) / STAGING_DIR
    if not root.is_dir() or root.is_symlink():
        return []
    names = sorted(os.listdir(root))
    shutil.rmtree(root)
    return names


def read_record(ckpt_path: str | Path) -> dict[str, Any]:
    """``rpg_saving.json``'s content ({} when absent or unreadable)."""
    try:
        body = json.loads((Path(ckpt_path) / SAVING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def staged_dir(ckpt_path: str | Path, entry: Any, tag: str) -> Path:
    """The staging directory recorded for ``tag`` (refused when none is: nothing is saved in place)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UnsafePathError(f"{FLAG} {ckpt_path}: no staging directory recorded for {tag} in {SAVING}")
    return Path(ckpt_path) / entry["name"]


@contextlib.contextmanager
def worker_path(ckpt_path: str, tag: str) -> Iterator[str]:
    """In a policy worker: ``/proc/self/fd/N`` of ``tag``'s staging directory, open for the block."""
    entry = read_record(ckpt_path).get(RECORD_KEY, {}).get(tag)
    fd = os.open(
        staged_dir(ckpt_path, entry, tag), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    )
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class StagedSaveMixin:
    """Policy actor mixin: OpenRLHF's ``save_checkpoint`` writes into the tag's staging directory."""

    def save_checkpoint(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        ckpt = self.strategy.args.ckpt
        if not _get(self.strategy.args, STAGED_KEY):
            return super().save_checkpoint(tag, *args, **kwargs)  # OpenRLHF's own trainer (stock async)
        with worker_path(ckpt.path, tag) as path, seam.swapped(ckpt, path=path):  # seam staged_save_path
            return super().save_checkpoint(tag, *args, **kwargs)


def use_staged_save_actor(module: Any) -> None:
    """The seam's ``staged_save_actor``: the current ``PolicyModelActor`` with :class:`StagedSaveMixin`
    in front (outermost: the RNG state's file goes into the staging directory too)."""
    from rpg_openrlhf.extras.policy_actor import prepend_mixin

    prepend_mixin(module, StagedSaveMixin)


def written(staged: Path, tag: str) -> bool:
    """Whether the workers wrote DeepSpeed's directory of ``tag`` into ``staged``."""
    return (staged / checkpoints.ACTOR_DIR / tag).is_dir()


def _put(src: Path, dest: Path, aside: Path) -> None:
    """Rename ``src`` to ``dest``; the run's own directory there (a rewrite) is moved into ``aside`` first."""
    if dest.is_dir() and not dest.is_symlink():
        os.rename(dest, aside / f"replaced-{dest.name}")
    os.rename(src, dest)  # onto anything else (checked at begin) it fails, naming it


def publish(ckpt_path: str | Path, tag: str, entry: dict[str, Any], global_step: int) -> bool:
    """Mark the staged checkpoint and move it into place (module docstring, step 3). Returns False when
    the workers wrote no DeepSpeed directory (``--ckpt.disable_ds``: the Hugging Face one still goes)."""
    root, staged = Path(ckpt_path), staged_dir(ckpt_path, entry, tag)
    hf_name = f"{tag}{checkpoints.HF_SUFFIX}"
    has_ds, has_hf = written(staged, tag), (staged / hf_name).is_dir()
    for d in [staged / hf_name] * has_hf + [staged / checkpoints.ACTOR_DIR / tag] * has_ds:
        checkpoints.write_marker(d, tag, global_step)
    if has_hf:
        _put(staged / hf_name, root / hf_name, staged)
    if not has_ds:
        return False
    actor, src = root / checkpoints.ACTOR_DIR, staged / checkpoints.ACTOR_DIR
    actor.mkdir(exist_ok=True)
    _put(src / tag, actor / tag, staged)  # the commit
    for name in ACTOR_FILES:
        if (src / name).is_file():
            os.replace(src / name, actor / name)
    return True


def discard(ckpt_path: str | Path, entry: dict[str, Any]) -> None:
    """Remove a staging directory (published, or a best checkpoint OpenRLHF decided not to save)."""
    if isinstance(entry.get("name"), str):
        shutil.rmtree(Path(ckpt_path) / entry["name"], ignore_errors=True)


def _metric(tag_dir: Path) -> float | None:
    """OpenRLHF's checkpoint metric (``_read_ckpt_metric``: None when absent or unreadable)."""
    try:
        value = json.loads((tag_dir / METRIC_FILE).read_text(encoding="utf-8")).get("metric_value")
        return None if value is None else float(value)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _size(tag_dir: Path) -> int:
    """Bytes of a checkpoint's files as OpenRLHF counts them (the completeness marker aside)."""
    return sum(p.stat().st_size for p in tag_dir.rglob("*") if p.is_file() and p.name != checkpoints.MARKER)


def rotate(ckpt_path: str | Path, new_tag: str, max_num: int | None, max_mem_gib: float | None) -> list[str]:
    """OpenRLHF's rotation of ``_actor`` (``DeepspeedStrategy.save_ckpt``, seam ``checkpoint_rotation``),
    after ``new_tag`` was committed: a new best removes the other best ones; then regular checkpoints
    other than ``new_tag`` go while more than ``max_num`` regular ones remain (not for a best save) or
    the others take more than ``max_mem_gib`` GiB: those without a metric first, then the worst metric,
    then the oldest. Only complete checkpoints count and are removed: an unmarked folder is never
    deleted. Returns the removed tags."""
    actor = Path(ckpt_path) / checkpoints.ACTOR_DIR
    if not actor.is_dir():
        return []
    dirs = [d for d in sorted(actor.iterdir()) if d.is_dir() and checkpoints.is_complete(d)]
    is_best = new_tag.startswith("best")
    removed = [d for d in dirs if is_best and d.name.startswith("best") and d.name != new_tag]
    limit = math.inf if max_mem_gib is None else max_mem_gib * 1024**3
    while True:
        others = [d for d in dirs if d.name != new_tag and d not in removed]
        regular = [d for d in others if not d.name.startswith("best")]
        over_num = not is_best and max_num is not None and len(regular) + 1 > max_num  # with new_tag
        if not regular or not (over_num or sum(map(_size, others)) > limit):
            break
        metrics = {d: _metric(d) for d in regular}
        removed.append(min(regular, key=lambda d: (metrics[d] is not None,
                                                   -math.inf if metrics[d] is None else metrics[d], d.stat().st_mtime)))  # fmt: skip
    for d in removed:
        shutil.rmtree(d)
    return [d.name for d in removed]
