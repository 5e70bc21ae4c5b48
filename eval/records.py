"""Append-only samples.jsonl (docs/contracts.md, "Threat model"): each append is whole lines in one
``os.write`` on an O_APPEND descriptor, then fsync. A kill leaves at most a torn line (the last, or
mid-file once another Ray worker appended); :func:`repair_counts` drops it before a run resumes."""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.cliutil import load_json
from rpg_openrlhf.common.inputs import open_input

# Fields every record of `rpg-eval run` has (docs/eval.md); a line without them is not ours.
RECORD_KEYS = ("run", "checkpoint", "step", "benchmark", "problem_id", "sample_index", "prompt_style", "correct")  # fmt: skip


class RecordError(ValueError):
    """A corrupt record file (a bad line that is not the trailing one)."""


_BAD = object()  # a line that is not JSON


def _lines(path: str | Path, missing_ok: bool = True) -> list[bytes]:
    """The lines of ``path`` (the last: what follows the last newline); a FIFO is refused, not read."""
    if missing_ok and not Path(path).exists():
        return [b""]
    with open_input(path) as f:
        return f.read().split(b"\n")


def _json(raw: bytes) -> Any:
    try:
        return load_json(raw, "")
    except ValueError:
        return _BAD


def repair_counts(path: str | Path) -> tuple[int, int, int]:
    """Cut the torn trailing line and drop complete lines that are not JSON, replacing the file
    atomically: (bytes of the trailing line, invalid lines dropped, their bytes)."""
    *lines, tail = _lines(path)
    bad = {i for i, raw in enumerate(lines) if raw.strip() and _json(raw) is _BAD}
    if tail or bad:
        with atomic_write(path, "wb") as f:
            f.writelines(raw + b"\n" for i, raw in enumerate(lines) if i not in bad)
    return len(tail), len(bad), sum(len(lines[i]) + 1 for i in bad)


def check_owned(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every record of a samples.jsonl this tool wrote, changing nothing.
    A line that is not JSON may only be what a killed writer left (a prefix of ``{"...`` or NUL
    bytes; :func:`repair_counts` drops it); any other line means the file is not ours: RecordError."""
    out: list[tuple[int, dict[str, Any]]] = []
    for lineno, raw in enumerate(_lines(path), 1):
        if not raw.strip():
            continue
        if (r := _json(raw)) is _BAD:
            if not raw.strip(b"\x00") or raw == b"{" or raw.startswith(b'{"'):
                continue
            why = repr(raw[:40])
        elif not (why := record_damage(r)):
            out.append((lineno, r))
            continue
        raise RecordError(
            f"{path}:{lineno}: not a record written by rpg-eval run ({why}); refusing to modify this file: use another --out"
        )
    return out


def append(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Append records as json lines atomically (one write + fsync); returns the count."""
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records]
    if not lines:
        return 0
    data = "".join(lines).encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)  # fmt: skip
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # Ray workers append to the same file
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # after a killed writer's fragment: not glued onto it (repair drops it)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(lines)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_STR, _COUNT = (lambda v: isinstance(v, str), "a string"), (lambda v: _int(v) and v >= 0, "an integer >= 0")
# Field -> (test, what it must be) for the fields summaries read: RECORD_KEYS always, others if there.
_TYPES = {
    "run": _STR, "checkpoint": _STR, "step": _COUNT, "benchmark": _STR,
    "problem_id": (lambda v: isinstance(v, str) or _int(v), "a string"), "sample_index": _COUNT, "prompt_style": _STR,
    "correct": (lambda v: isinstance(v, dict) and all(isinstance(v.get(g), bool) for g in ("math_verify", "paper")),
                "true or false for math_verify and paper"),
    "response": _STR, "seed": (_int, "an integer"), "gold": _STR, "response_tokens": _COUNT,
    "sampling": (lambda v: isinstance(v, dict) and all(math.isfinite(x) for x in v.values() if isinstance(x, float)),
                 "a mapping of finite numbers"),
    "extracted": (lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
                  "a mapping of strings or null"),
}  # fmt: skip


def record_damage(r: Any) -> str | None:
    """What makes ``r`` not a sample record as rpg-eval writes it (None: nothing)."""
    if not isinstance(r, dict):
        return f"expected a JSON object, got {type(r).__name__}"
    if missing := [k for k in RECORD_KEYS if k not in r]:
        return f"no field {missing[0]!r}"
    if bad := next((k for k, (ok, _) in _TYPES.items() if k in r and not ok(r[k])), None):
        return f"field {bad!r} must be {_TYPES[bad][1]}, got {json.dumps(r[bad], ensure_ascii=False)[:60]}"
    return None


def read(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of a jsonl file (:func:`read_records_numbered` without the record check)."""
    return (r for _, r in read_records_numbered(path, check=False))


def read_records_numbered(path: str | Path, check: bool = True) -> Iterator[tuple[int, Any]]:
    """(line number, record) of a jsonl file; a bad line (with ``check``: one that is not a record of the
    types rpg-eval writes) is a RecordError naming file and line; a torn trailing line is skipped."""
    lines = _lines(path, missing_ok=False)
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = load_json(raw, f"{path}:{lineno}", RecordError)
        except RecordError:
            if lineno == len(lines):  # the torn trailing line (no newline after it)
                return
            raise
        if check and (damage := record_damage(obj)):
            raise RecordError(f"{path}:{lineno}: not a sample record ({damage})")
        if _SURROGATE_ESCAPE.search(raw):  # a lone one (json.loads joins pairs) is read as U+FFFD
            obj = json.loads(re.sub("[\ud800-\udfff]", "\ufffd", json.dumps(obj, ensure_ascii=False)))
        yield lineno, obj


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSON escape of a surrogate (maybe of a pair)
