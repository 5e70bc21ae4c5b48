"""The output folder of ``rpg-eval run``: whose it is, who writes it now, what made its records.

``run.json`` (``"format": "rpg-eval run/2"``) is the ownership mark, written before any record; a
non-empty folder without one, or with one of another shape, is refused before anything in it is
touched. run.json fingerprints the settings, each benchmark's problems and each checkpoint; a resume
that differs where records exist is refused, naming what changed (:func:`reconcile`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import check_dir, write_file
from rpg_openrlhf.common.cliutil import load_json
from rpg_openrlhf.common.inputs import open_input

from .outputs import RUN_FORMAT, RUN_JSON, is_run_dir

_SAMPLE = 1 << 20  # bytes of a large checkpoint file that enter its fingerprint: head, middle, tail
# run.json's sections and the fields (with their types) rpg-eval reads in each entry
_FIELDS: dict[str, dict[str, type]] = {"settings": {}, "grading": {}, "data": {"source": str, "sha256": str},
                                       "checkpoints": {"path": str, "step": int, "sha256": str}}  # fmt: skip


class OutputDirError(ValueError):
    """The output directory cannot be used for this run (the message says why and what to do)."""


def read_run_json(out: Path) -> dict[str, Any] | None:
    """run.json of ``out`` (None if absent); OutputDirError if it is not this tool's."""
    meta = out / RUN_JSON
    if not meta.exists():
        return None
    with open_input(meta) as f:  # a FIFO at the name is refused, not waited on
        data = load_json(f.read(), str(meta), OutputDirError)
    if isinstance(data, dict) and data.get("format") == RUN_FORMAT:
        if damage := run_json_damage(data):
            raise OutputDirError(
                f"{meta}: damaged run.json ({damage}); restore the run.json rpg-eval wrote, or use another --out"
            )
        return data
    raise OutputDirError(f"{meta}: not a run.json written by rpg-eval run; use another --out")


def run_dir_of(path: Path) -> Path | None:
    """The run folder (a run.json of this tool) that is or holds ``path``, or None."""
    return next((d for d in (path, *path.parents) if is_run_dir(d)), None)


def run_json_damage(data: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a run.json of this format (None: nothing)."""
    for section, want in _FIELDS.items():
        if not isinstance(entries := data.get(section), dict):
            return f"'{section}' must be a mapping, got {type(entries).__name__}"
        for name, info in entries.items() if want else ():
            if not isinstance(info, dict):
                return f"'{section}.{name}' must be a mapping, got {type(info).__name__}"
            for key, kind in want.items():
                if not isinstance(info.get(key), kind) or isinstance(info.get(key), bool):
                    return f"'{section}.{name}.{key}' must be {kind.__name__}, got {info.get(key)!r}"[:300]
    return None


def check_ownership(out: Path) -> None:
    """Refuse, changing nothing, an ``--out`` this run may not write (run.json is the mark)."""
    check_dir(out, "rpg-eval run", "--out", marks=(RUN_JSON,))
    read_run_json(out)


def write_run_json(out: Path, data: dict[str, Any]) -> None:
    write_file(out / RUN_JSON, json.dumps(data, indent=1, sort_keys=True) + "\n")


def data_fingerprint(problems: list[Any]) -> str:
    """sha256 of a benchmark's problems (id, text, answer, source prompt), in source order."""
    h = hashlib.sha256()
    for p in problems:
        h.update(
            json.dumps([p.id, p.problem, p.answer, p.prompt], ensure_ascii=False).encode("utf-8") + b"\n"
        )
    return h.hexdigest()


def checkpoint_fingerprint(path: Path) -> str:
    """Content fingerprint of a model directory: name, size and bytes of every file in it (files over
    3 MiB: their first, middle and last MiB), so a moved copy matches and another model does not."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file() and not p.name.startswith(".")):
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            for offset in (0,) if size <= 3 * _SAMPLE else (0, size // 2, size - _SAMPLE):
                fh.seek(offset)
                h.update(fh.read() if size <= 3 * _SAMPLE else fh.read(_SAMPLE))
    return h.hexdigest()


# How a run.json setting is named to the user (the flag that sets it).
FLAGS = {
    "run": "--run", "n": "--n", "max_tokens": "--max-tokens", "temperature": "--temperature",
    "top_p": "--top-p", "seed": "--seed", "prompt_style": "--prompt-style", "backend": "--backend",
    "model_args": "--model-arg", "allow_fallback": "--allow-fallback", "grader_version": "grader version",
    "timeout": "grading timeout (s)", "max_answer_chars": "answer length cap",
}  # fmt: skip


def reconcile(
    out: Path, old: dict[str, Any] | None, new: dict[str, Any], recorded: dict[str, set[str]]
) -> dict[str, Any]:
    """``new`` merged into ``old``; OutputDirError where they disagree on what the records (``recorded``:
    {"checkpoints": names, "benchmarks": names} in samples.jsonl) depend on."""
    if old is None:
        return new
    problems = []
    if recorded["checkpoints"]:
        for section in ("settings", "grading"):
            was, now = old.get(section, {}), new[section]
            problems += [f"{FLAGS.get(k, k)} {was.get(k)!r} -> {now.get(k)!r}"
                         for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]  # fmt: skip
    merged = {**new, "data": dict(old.get("data", {})), "checkpoints": dict(old.get("checkpoints", {}))}
    for bench, info in new["data"].items():
        was = merged["data"].get(bench)
        if was and was["sha256"] != info["sha256"] and bench in recorded["benchmarks"]:
            problems.append(
                f"data of {bench}: {info['source']} has other problems (sha256 {info['sha256'][:12]}) "
                f"than the records were made from ({was['source']}, sha256 {was['sha256'][:12]})"
            )
        merged["data"][bench] = info
    for name, info in new["checkpoints"].items():
        was = merged["checkpoints"].get(name)
        if was and name in recorded["checkpoints"] and was["sha256"] != info["sha256"]:
            problems.append(f"checkpoint {name}: {info['path']} is not the model the records were made with "
                            f"({was['path']}; content fingerprints differ)")  # fmt: skip
        elif was and name in recorded["checkpoints"] and was["step"] != info["step"]:
            problems.append(f"checkpoint {name}: step {info['step']} now, {was['step']} in the records")
        merged["checkpoints"][name] = info
    if problems:
        raise OutputDirError(
            f"{out / RUN_JSON}: the records here were made differently: {'; '.join(problems)} "
            "(recorded -> now). Resume with what made them, or use another --out"
        )
    return merged
