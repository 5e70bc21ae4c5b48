"""The output directory of ``rpg-eval run``: whose it is, who writes it now, what made its records.

* **Ownership.** A run writes ``run.json`` (``"format": "rpg-eval run/2"``) before any record; a
  non-empty directory without one, or with one of another shape, is refused before anything in it is
  touched. The previous format's directories (a flat run.json) can be summarized and re-scored, not resumed.
* **One writer.** :func:`lock`: ``atomic.hold_lock`` on ``<out>/.lock`` for the whole run.
* **Fingerprints.** run.json records the settings that shape a record, a content hash of every
  benchmark's problems and a content fingerprint and step of every checkpoint; a resume that differs
  where records exist is refused, naming what changed (:func:`reconcile`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import atomic_write, hold_lock
from rpg_openrlhf.common.inputs import open_input

from .outputs import _V1_KEYS, RUN_FORMAT, RUN_JSON, OutputDir, is_run_dir

LOCK = ".lock"
# What a run leaves in its directory; a directory holding only these may lack run.json (a run
# killed before it wrote run.json).
_BOOTSTRAP = {LOCK, RUN_JSON + ".tmp"}
# Bytes of a large checkpoint file that enter its fingerprint: head, middle and tail.
_SAMPLE = 1 << 20


class OutputDirError(ValueError):
    """The output directory cannot be used for this run (the message says why and what to do)."""


def read_run_json(out: Path) -> dict[str, Any] | None:
    """run.json of ``out`` (None if absent); OutputDirError if it is not this tool's."""
    meta = out / RUN_JSON
    if not meta.exists():
        return None
    with open_input(meta) as f:  # a FIFO at the name is refused, not waited on
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise OutputDirError(
            f"{meta}: not a run.json written by rpg-eval run ({type(e).__name__}); use another --out"
        ) from None
    if isinstance(data, dict) and data.get("format") == RUN_FORMAT:
        damage = run_json_damage(data)
        if damage:
            raise OutputDirError(
                f"{meta}: damaged run.json ({damage}); restore the run.json rpg-eval wrote, or use another --out"
            )
        return data
    if isinstance(data, dict) and set(data) >= _V1_KEYS:
        raise OutputDirError(
            f"{meta}: written by an older rpg-eval, which did not record the data, checkpoints and "
            "grader behind its records; they can be summarized (rpg-eval summarize) and re-scored "
            "(rpg-eval score), but a run cannot resume into this directory: use another --out"
        )
    raise OutputDirError(f"{meta}: not a run.json written by rpg-eval run; use another --out")


def run_dir_of(path: Path) -> Path | None:
    """The directory ``rpg-eval run`` wrote that holds ``path`` (``path`` itself or one of its
    parents with a run.json of this tool, of any format), or None."""
    return next((d for d in (path, *path.parents) if is_run_dir(d)), None)


def run_json_damage(data: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a run.json of this format (None: nothing): the sections
    rpg-eval reads, with the types it wrote."""
    for section in ("settings", "grading", "data", "checkpoints"):
        if not isinstance(data.get(section), dict):
            return f"'{section}' must be a mapping, got {type(data.get(section)).__name__}"
    fields = {
        "data": {"source": str, "sha256": str},
        "checkpoints": {"path": str, "step": int, "sha256": str},
    }
    for section, want in fields.items():
        for name, info in data[section].items():
            if not isinstance(info, dict):
                return f"'{section}.{name}' must be a mapping, got {type(info).__name__}"
            for key, kind in want.items():
                if not isinstance(info.get(key), kind) or isinstance(info.get(key), bool):
                    return f"'{section}.{name}.{key}' must be {kind.__name__}, got {info.get(key)!r}"[:300]
    return None


def check_ownership(out: Path) -> None:
    """Refuse (without touching anything) a path that is not a directory this tool may write."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise OutputDirError(f"--out {out}: is {what}; give a new or empty folder")
    if not out.is_dir():
        return
    if read_run_json(out) is not None:
        return
    foreign = sorted(p.name for p in out.iterdir() if p.name not in _BOOTSTRAP or not p.is_file())
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputDirError(
            f"--out {out}: holds {shown} but no run.json, so rpg-eval run did not write it (or its "
            "run.json was deleted); nothing was changed. Use a new or empty --out"
        )


@contextlib.contextmanager
def lock(od: OutputDir) -> Iterator[None]:
    """Exclusive use of the directory ``od`` for this process (released on exit, also on SIGKILL)."""
    with hold_lock(od.path, "rpg-eval"):
        yield


def write_run_json(out: OutputDir, data: dict[str, Any]) -> None:
    """run.json atomically (tmp + fsync + rename)."""
    with atomic_write(out.shown(RUN_JSON), tmp=RUN_JSON + ".tmp") as f:  # the temp name _BOOTSTRAP tolerates
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- fingerprints


def data_fingerprint(problems: list[Any]) -> str:
    """sha256 of a benchmark's problems (id, text, answer, source prompt), in source order."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.id, p.problem, p.answer, p.prompt], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def checkpoint_fingerprint(path: Path) -> str:
    """Content fingerprint of a model directory: name, size and bytes of every file in it
    (files over 3 MiB: their first, middle and last MiB), so a moved or hard-linked copy
    matches and another model with the same directory name does not."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file() and not p.name.startswith(".")):
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= 3 * _SAMPLE:
                h.update(fh.read())
            else:
                for offset in (0, size // 2, size - _SAMPLE):
                    fh.seek(offset)
                    h.update(fh.read(_SAMPLE))
    return h.hexdigest()


# How a run.json setting is named to the user (the flag that sets it).
FLAGS = {
    "run": "--run", "n": "--n", "max_tokens": "--max-tokens", "temperature": "--temperature",
    "top_p": "--top-p", "seed": "--seed", "prompt_style": "--prompt-style", "backend": "--backend",
    "model_args": "--model-arg", "allow_fallback": "--allow-fallback", "grader_version": "grader version",
    "timeout": "grading timeout (s)", "max_answer_chars": "answer length cap",
}  # fmt: skip


def _flag_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{FLAGS.get(k, k)} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def reconcile(
    out: Path,
    old: dict[str, Any] | None,
    new: dict[str, Any],
    recorded: dict[str, set[str]],
) -> dict[str, Any]:
    """run.json for this run: ``new`` merged into ``old``; OutputDirError where they disagree on
    something records already depend on.  ``recorded``: {"checkpoints": names, "benchmarks":
    names} that have records in samples.jsonl."""
    if old is None:
        return new
    meta = out / RUN_JSON
    has_records = bool(recorded["checkpoints"])
    problems = []
    if has_records:
        for section in ("settings", "grading"):
            problems += _flag_diff(old.get(section, {}), new[section])
    merged = {**new, "data": dict(old.get("data", {})), "checkpoints": dict(old.get("checkpoints", {}))}
    for bench, info in new["data"].items():
        was = merged["data"].get(bench)
        if was and was["sha256"] != info["sha256"] and bench in recorded["benchmarks"]:
            problems.append(
                f"data of {bench}: {info['source']} has other problems (sha256 {info['sha256'][:12]}) than "
                f"the records were made from ({was['source']}, sha256 {was['sha256'][:12]})"
            )
        merged["data"][bench] = info
    for name, info in new["checkpoints"].items():
        was = merged["checkpoints"].get(name)
        if was and name in recorded["checkpoints"]:
            if was["sha256"] != info["sha256"]:
                problems.append(
                    f"checkpoint {name}: {info['path']} is not the model the records were made with "
                    f"({was['path']}; content fingerprints differ)"
                )
            elif was["step"] != info["step"]:
                problems.append(f"checkpoint {name}: step {info['step']} now, {was['step']} in the records")
        merged["checkpoints"][name] = info
    if problems:
        raise OutputDirError(
            f"{meta}: the records here were made differently: {'; '.join(problems)} (recorded -> now). "
            "Resume with what made them, or use another --out"
        )
    return merged
