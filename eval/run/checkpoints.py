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
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rpg_openrlhf.common.checkpoints import (
    ACTOR_DIR,
    MARKER,
    RUN_FILE,
    model_dir_state,
    read_marker,
    tag_step,
)

_STEP_RES = (
    re.compile(r"global_step[_-]?([0-9]+)"),
    re.compile(r"checkpoint[_-]([0-9]+)"),
    re.compile(r"(?:^|[_-])step[_-]?([0-9]+)"),
)


@dataclass(frozen=True)
class Checkpoint:
    """A model directory and its training step."""

    path: Path
    name: str
    step: int


class CheckpointNameError(ValueError):
    """A checkpoint directory name whose step is not a step number, or two names of one step."""


# A step keyword followed by what is no step number: "global_stepNaN", "global_step-1" (OpenRLHF
# writes global_step<N>; "-1" is no separator there), "checkpoint-inf", "step_-3".
_BAD_STEP_RES = (
    re.compile(r"global_step(?!_?[0-9])"),
    re.compile(r"(?:checkpoint|(?:^|[_-])step)(?:[_-][-+][0-9]|[_-]?(?:nan|inf))", re.IGNORECASE),
)


def step_name_damage(name: str) -> str | None:
    """Why ``name`` names no step although it says it does (None: it is fine or names none)."""
    for r in _BAD_STEP_RES:
        m = r.search(name)
        if m:
            return f"the step in {name!r} is not a number >= 0 (at {m.group(0)!r}; expected a name like global_step12)"
    return None


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


def marker_diff(directory: Path) -> tuple[list[str], list[str], list[str]] | None:
    """(missing, changed size, extra) files of ``directory`` against its completeness marker, or
    None without a valid marker.  Only missing or changed files make a checkpoint incomplete; extra
    ones were added after its commit (a README, an ``eval/`` folder) and are reported."""
    body = read_marker(directory)
    if body is None:
        return None
    listed, now = body["files"], {}
    for root, _, names in os.walk(directory):
        for name in names:
            rel = Path(root, name).relative_to(directory).as_posix()
            if rel != MARKER:
                try:
                    now[rel] = Path(root, name).stat().st_size
                except OSError:
                    continue  # a dangling link: not a file the marker can vouch for
    missing = sorted(f for f in listed if f not in now)
    changed = sorted(
        f"{f} ({now[f]} bytes, the marker says {listed[f]})"
        for f in listed
        if f in now and now[f] != listed[f]
    )
    return missing, changed, sorted(f for f in now if f not in listed)


def why_incomplete(directory: Path) -> str:
    """Why a torn checkpoint (``model_dir_state`` "torn") is not complete, in words."""
    diff = marker_diff(directory)
    if diff is None:
        return "incomplete checkpoint (no completeness marker)"  # being written, or torn by a kill
    missing, changed, _ = diff
    what = ([f"missing {', '.join(missing[:3])}"] if missing else []) + (
        [f"changed {', '.join(changed[:3])}"] if changed else []
    )
    return f"incomplete checkpoint (files differ from its completeness marker: {'; '.join(what)})"


def checkpoint_holding(path: Path, ckpts: list[Checkpoint] = ()) -> Path | None:
    """The checkpoint directory that ``path`` is, or is inside (None: none): one of ``ckpts``, a
    directory with a completeness marker, a model directory (config.json beside weights), a step
    directory or ``_actor`` of a run that declares markers.  Nothing may be written there: a file
    added to a committed checkpoint is not in its marker."""
    path = Path(os.path.abspath(path))
    for d in (path, *path.parents):
        real = d.resolve()
        if any(real == c.path.resolve() for c in ckpts) or (d / MARKER).is_file():
            return d
        weights = any(d.glob("*.safetensors")) or any(d.glob("pytorch_model*.bin"))
        if weights and (d / "config.json").is_file():
            return d
        if (tag_step(d.name) is not None or d.name == ACTOR_DIR) and (d.parent / RUN_FILE).is_file():
            return d
    return None


def find_checkpoints(
    spec: str | Path,
    final_step: int | None = None,
    skipped: list[Path] | None = None,
    notes: list[str] | None = None,
) -> list[Checkpoint]:
    """Complete checkpoints under a directory or matching a glob, sorted by step; the torn ones
    (see the module docstring) are appended to ``skipped``, and a line for each checkpoint holding
    files its completeness marker does not list (added after its commit; it is evaluated) to
    ``notes``."""
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
    torn, added = _torn_and_added(candidates)
    if skipped is not None:
        skipped += sorted(torn)
    dirs = [d for d in dirs if d not in torn]
    if notes is not None:
        notes += [note for d, note in added.items() if d in dirs]
    if not dirs and torn:
        raise FileNotFoundError(
            f"{spec}: every checkpoint is incomplete: "
            + "; ".join(f"{d.name}: {why_incomplete(d)}" for d in sorted(torn))
        )
    if not dirs:
        raise FileNotFoundError(f"{spec}: no model directories (with config.json) found")
    out = _with_steps(dirs, final_step)
    names = [c.name for c in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        # Records key on the name; make clashing names unique with the parent directory.
        out = [
            Checkpoint(c.path, f"{c.path.parent.name}/{c.name}" if c.name in dup else c.name, c.step)
            for c in out
        ]
    return sorted(out, key=lambda c: (c.step, c.name))


def _torn_and_added(candidates: list[Path]) -> tuple[set[Path], dict[Path, str]]:
    """The torn directories among ``candidates``, and a note for each committed one holding files
    its marker does not list (complete: added after the commit, reported)."""
    torn, added = set(), {}
    for d in sorted(dict.fromkeys(c.resolve() for c in candidates if c.is_dir())):
        diff = marker_diff(d)
        if diff is not None and diff[2] and not diff[0] and not diff[1]:
            extra = diff[2]
            added[d] = (
                f"{d}: holds files its completeness marker does not list (added after its commit; evaluated "
                f"as committed): {', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}"
            )
        elif model_dir_state(d) == "torn":
            torn.add(d)
    return torn, added


def _with_steps(dirs: list[Path], final_step: int | None) -> list[Checkpoint]:
    """Checkpoints of ``dirs`` with the step of each name (a name without one: ``final_step`` or the
    highest + 1); a step name that is no number, or two of one step, is CheckpointNameError."""
    for d in dirs:
        damage = step_name_damage(d.name)
        if damage:
            raise CheckpointNameError(f"{d}: {damage}; rename it or leave it out of --checkpoints")
    stepped = [(d, parse_step(d.name)) for d in dirs]
    steps = [st for _, st in stepped if st is not None]
    default_final = final_step if final_step is not None else (max(steps) + 1 if steps else 0)
    out = [Checkpoint(d, d.name, st if st is not None else default_final) for d, st in stepped]
    _refuse_shared_steps(out)
    return out


def _refuse_shared_steps(ckpts: list[Checkpoint]) -> None:
    """Two checkpoints of one run directory at one step ("global_step00010" and "global_step10", or
    --final-step 10 beside global_step10) would make Last and Best of "step 10" two models."""
    first: dict[tuple[Path, int], Checkpoint] = {}
    for c in sorted(ckpts, key=lambda c: c.name):
        other = first.setdefault((c.path.parent, c.step), c)
        if other is not c:
            raise CheckpointNameError(
                f"{c.path.parent}: {other.name} and {c.name} are both step {c.step}; which one is step "
                f"{c.step} is ambiguous: rename or remove one (or give --final-step another step)"
            )
