"""Completeness markers of training checkpoints, written by ``extras.checkpoint`` and read by resume
and ``rpg-eval``. OpenRLHF writes a checkpoint in pieces, none atomically; once every piece is on disk
the trainer writes :data:`MARKER` (each file with its size: one missing or resized makes it incomplete,
files added later do not). ``<ckpt.path>/`` :data:`RUN_FILE` declares that the run's checkpoints after
step ``since`` carry markers: there one without a valid marker is **torn** (passed over); folders of
other runs are **unmarked**, read as OpenRLHF would. No torch, no Ray (``rpg_eval`` imports it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from rpg_openrlhf.common.atomic import write_file

MARKER = "rpg_complete.json"
RUN_FILE = "rpg_checkpoints.json"
FORMAT = 1
ACTOR_DIR = "_actor"  # OpenRLHF's DeepSpeed checkpoints under --ckpt.path
HF_SUFFIX = "_hf"

State = Literal["complete", "torn", "unmarked"]
_TAG = re.compile(r"^(?:best_)?global_step(\d+)(?:_hf)?$")


def tag_step(name: str) -> int | None:
    """The step of ``global_step12``, ``best_global_step12`` (either with ``_hf``), else None."""
    m = _TAG.match(name)
    return int(m.group(1)) if m else None


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, unreadable or not an object."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _files(directory: Path) -> dict[str, int]:
    found = {
        Path(r, n).relative_to(directory).as_posix(): Path(r, n)
        for r, _, ns in os.walk(directory)
        for n in ns
    }
    return {rel: p.stat().st_size for rel, p in sorted(found.items()) if rel != MARKER}


def write_marker(directory: str | Path, tag: str, global_step: int) -> None:
    """Mark ``directory`` complete (atomically); call only once every file of it is written."""
    body = {"format": FORMAT, "tag": tag, "global_step": int(global_step), "files": _files(Path(directory))}
    write_file(Path(directory) / MARKER, json.dumps(body, indent=1))


def read_marker(directory: str | Path) -> dict[str, Any] | None:
    body = read_json(Path(directory) / MARKER)
    return body if body.get("format") == FORMAT and isinstance(body.get("files"), dict) else None


def is_complete(directory: str | Path) -> bool:
    """A valid marker, and every file it lists there with its size (files added since are allowed)."""
    body = read_marker(directory)
    try:
        present = {} if body is None else _files(Path(directory))
    except OSError:
        return False
    return body is not None and all(present.get(name) == size for name, size in body["files"].items())


def declare(run_dir: str | Path, since: int = 0) -> None:
    """Declare that ``run_dir``'s checkpoints after step ``since`` carry markers."""
    write_file(
        Path(run_dir) / RUN_FILE, json.dumps({"format": FORMAT, "marker": MARKER, "since": int(since)})
    )


def declared_since(run_dir: str | Path) -> int | None:
    """``since`` of ``run_dir``'s declaration, or None when it declares nothing."""
    since = read_json(Path(run_dir) / RUN_FILE).get("since")
    return since if isinstance(since, int) else None


def state(directory: str | Path, run_dir: str | Path) -> State:
    """``complete`` (valid marker), ``torn`` (``run_dir`` declares markers for this step, none valid)
    or ``unmarked`` (no declaration, a step before it, or not a checkpoint name)."""
    if is_complete(directory):
        return "complete"
    since, step = declared_since(run_dir), tag_step(Path(directory).name)
    return "unmarked" if since is None or step is None or step <= since else "torn"


def model_dir_state(directory: str | Path) -> State:
    """:func:`state` of a ``<ckpt.path>/<tag>_hf`` folder: its run folder is its parent."""
    return state(directory, Path(directory).parent)
