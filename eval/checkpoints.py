"""Finding checkpoints to evaluate.

``--checkpoints`` is a directory or a glob.  A directory with a ``config.json`` is one
checkpoint; otherwise its subdirectories (two levels deep) with a ``config.json`` are.
Steps come from the name: ``global_step<N>_hf`` (OpenRLHF's --save_hf_ckpt layout),
``global_step<N>``, ``checkpoint-<N>``, ``step<N>``/``step_<N>``.  A directory without a
step in its name is the final output of training (OpenRLHF's --save_path): its step is
the highest step found + 1, so it counts as "Last"; alone, it is step 0 (a base model).
``--final-step`` overrides that.

Checkpoints of this project's training runs carry a completeness marker
(``rpg_openrlhf.common.checkpoints``): under a run directory that declares markers, a
``global_step<N>_hf`` without a valid one is being written or was torn by a kill. It is never
evaluated: :func:`find_checkpoints` leaves it out and names it in ``skipped``; a later run over the
same checkpoints picks it up once its marker is written.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

from rpg_openrlhf.common.checkpoints import model_dir_state

_STEP_RES = (
    re.compile(r"global_step[_-]?(\d+)"),
    re.compile(r"checkpoint[_-](\d+)"),
    re.compile(r"(?:^|[_-])step[_-]?(\d+)"),
)


@dataclass(frozen=True)
class Checkpoint:
    """A model directory and its training step."""

    path: Path
    name: str
    step: int
    final: bool = False


def parse_step(name: str) -> int | None:
    """The training step in a checkpoint directory name, or None."""
    for r in _STEP_RES:
        m = r.search(name)
        if m:
            return int(m.group(1))
    return None


def _model_dirs(root: Path) -> list[Path]:
    if (root / "config.json").is_file():
        return [root]
    found = []
    for child in sorted(root.iterdir()):
        if child.is_dir():
            if (child / "config.json").is_file():
                found.append(child)
            else:
                found += [g for g in sorted(child.iterdir()) if g.is_dir() and (g / "config.json").is_file()]
    return found


def find_checkpoints(
    spec: str | Path, final_step: int | None = None, skipped: list[Path] | None = None
) -> list[Checkpoint]:
    """Complete checkpoints under a directory or matching a glob, sorted by step; the torn ones
    (see the module docstring) are appended to ``skipped``."""
    s = str(spec)
    roots = [Path(p) for p in sorted(glob.glob(s))] if any(c in s for c in "*?[") else [Path(s)]
    dirs: list[Path] = []
    for r in roots:
        if not r.exists():
            raise FileNotFoundError(f"{r}: no such checkpoint directory")
        if r.is_dir():
            dirs += _model_dirs(r)
    dirs = list(dict.fromkeys(d.resolve() for d in dirs))
    # torn: found ones, and any checkpoint-named directory given or beside them (config.json or not)
    candidates = [*roots, *(c for r in roots if r.is_dir() for c in r.iterdir() if c.is_dir()), *dirs]
    torn = {d.resolve() for d in candidates if d.is_dir() and model_dir_state(d) == "torn"}
    if skipped is not None:
        skipped += sorted(torn)
    dirs = [d for d in dirs if d not in torn]
    if not dirs and torn:
        raise FileNotFoundError(
            f"{spec}: every checkpoint is incomplete (no completeness marker): {sorted(torn)}"
        )
    if not dirs:
        raise FileNotFoundError(f"{spec}: no model directories (with config.json) found")
    stepped = [(d, parse_step(d.name)) for d in dirs]
    steps = [st for _, st in stepped if st is not None]
    default_final = final_step if final_step is not None else (max(steps) + 1 if steps else 0)
    out = [
        Checkpoint(d, d.name, st if st is not None else default_final, final=st is None) for d, st in stepped
    ]
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        # Records key on the name; make clashing names unique with the parent directory.
        out = [
            Checkpoint(c.path, f"{c.path.parent.name}/{c.name}" if c.name in dup else c.name, c.step, c.final)
            for c in out
        ]
    return sorted(out, key=lambda c: (c.step, c.name))
