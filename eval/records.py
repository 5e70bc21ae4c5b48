"""Append-only jsonl of sample records (docs/contracts.md, "Threat model").

Each append writes whole lines with one ``os.write`` on an O_APPEND descriptor, then fsyncs, and
starts on a fresh line when the file does not end with one. A kill can only leave a torn line: the
trailing one or, once another writer appended after it, an invalid complete line; ``repair`` removes
both before a run resumes, so nothing acknowledged is lost and nothing is duplicated.
"""

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

from .outputs import OutputDir

# Fields every record of `rpg-eval run` has (docs/eval.md); a line without them is not ours.
RECORD_KEYS = ("run", "checkpoint", "step", "benchmark", "problem_id", "sample_index", "prompt_style", "correct")  # fmt: skip


class RecordError(ValueError):
    """A corrupt record file (a bad line that is not the trailing one)."""


def _at(path: str | Path, where: OutputDir | None) -> Path:
    """The record file: ``path`` below ``where`` (the run's output directory), or ``path`` itself."""
    return where.shown(path) if where is not None else Path(path)


def _lines(p: Path) -> list[bytes]:
    """The lines of ``p`` (no newlines; the last one is what follows the last newline)."""
    with open_input(p) as f:  # a FIFO or a device at the name is refused, not read forever
        return f.read().split(b"\n")


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # also bytes that are not UTF-8, huge numbers, deep nesting
        return False
    return True


def repair(path: str | Path, where: OutputDir | None = None) -> int:
    """:func:`repair_counts`; returns the number of bytes removed (0 if clean)."""
    torn, _dropped, dropped_bytes = repair_counts(path, where)
    return torn + dropped_bytes


def repair_counts(path: str | Path, where: OutputDir | None = None) -> tuple[int, int, int]:
    """Cut the torn trailing line and drop complete lines that are not JSON, replacing the file
    atomically: (bytes of the trailing line, invalid lines dropped, their bytes)."""
    p = _at(path, where)
    if not p.exists():
        return 0, 0, 0
    *lines, tail = _lines(p)
    bad = {i for i, raw in enumerate(lines) if raw.strip() and not _is_json(raw)}
    if tail or bad:
        with atomic_write(p, "wb", tmp=p.name + ".repair.tmp") as f:
            f.writelines(raw + b"\n" for i, raw in enumerate(lines) if i not in bad)
    return len(tail), len(bad), sum(len(lines[i]) + 1 for i in bad)


def _torn(raw: bytes) -> bool:
    """Could ``raw`` (a line that is not valid JSON) be what a killed writer left of a record?
    Records are written whole by one write() from their first byte, so a torn one is a prefix of
    a JSON object (``{"...``); a crash of the machine can also leave NUL bytes."""
    return not raw.strip(b"\x00") or raw == b"{" or raw.startswith(b'{"')


def check_owned(path: str | Path, where: OutputDir | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every record of a samples.jsonl this tool wrote, without modifying it.

    Lines that are not valid JSON are allowed only where a killed writer could have left them
    (``_torn``; ``repair`` removes them afterwards); any other line (valid JSON that is not a record,
    or text) means the file is not (only) ours: RecordError naming file and line."""
    p = _at(path, where)
    out: list[tuple[int, dict[str, Any]]] = []
    if not p.exists():
        return out
    for lineno, raw in enumerate(_lines(p), 1):
        if not raw.strip():
            continue
        try:
            r = json.loads(raw)
        except (ValueError, RecursionError):
            if _torn(raw):
                continue
            why = repr(raw[:40])
        else:
            missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
            if not missing:
                out.append((lineno, r))
                continue
            why = f"no field {missing[0]!r}"
        raise RecordError(
            f"{p}:{lineno}: not a record written by rpg-eval run ({why}); refusing to modify this file: "
            "use another --out"
        )
    return out


def append(path: str | Path, records: Iterable[dict[str, Any]], where: OutputDir | None = None) -> int:
    """Append records as json lines atomically (one write + fsync); returns the count. ``where``: the
    run's open output directory, ``path`` a name in it."""
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records]
    if not lines:
        return 0
    data = "".join(lines).encode("utf-8")
    fd = os.open(_at(path, where), os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
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


def read_records_numbered(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a samples.jsonl for summaries: ``read`` plus a check that every line
    is a record with the types rpg-eval writes (``record_damage``), naming file and line."""
    p = Path(path)
    for lineno, r in read_numbered(p):
        damage = record_damage(r)
        if damage:
            raise RecordError(f"{p}:{lineno}: not a sample record ({damage})")
        yield lineno, r


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Field -> (test, what it must be) for the fields summaries read.
_FIELD_TYPES = {
    "run": (lambda v: isinstance(v, str), "a string"),
    "checkpoint": (lambda v: isinstance(v, str), "a string"),
    "step": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "benchmark": (lambda v: isinstance(v, str), "a string"),
    "problem_id": (lambda v: isinstance(v, str) or _int(v), "a string"),
    "sample_index": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "prompt_style": (lambda v: isinstance(v, str), "a string"),
}
_OPTIONAL_TYPES = {
    "response": (lambda v: isinstance(v, str), "a string"),
    "seed": (lambda v: _int(v), "an integer"),
    "sampling": (lambda v: isinstance(v, dict), "a mapping"),
    "gold": (lambda v: isinstance(v, str), "a string"),
    "response_tokens": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
}


def record_damage(r: Any) -> str | None:
    """What makes ``r`` not a sample record as rpg-eval writes it (None: nothing): the fields
    RECORD_KEYS with their types, both graders' verdicts as true/false, extracted answers as
    strings or null."""
    if not isinstance(r, dict):
        return f"expected a JSON object, got {type(r).__name__}"
    for k in RECORD_KEYS:
        if k not in r:
            return f"no field {k!r}"
    for table, required in ((_FIELD_TYPES, True), (_OPTIONAL_TYPES, False)):
        for k, (ok, what) in table.items():
            if (required or k in r) and not ok(r[k]):
                return f"field {k!r} must be {what}, got {_short(r[k])}"
    for k, v in (r.get("sampling") or {}).items():
        if isinstance(v, float) and not math.isfinite(v):  # json reads NaN; no sampler ran with it
            return f"field 'sampling.{k}' must be a finite number, got {v!r}"
    correct = r["correct"]
    if not isinstance(correct, dict) or not {"math_verify", "paper"} <= set(correct):
        return "no field 'correct.math_verify/paper'"
    for g in ("math_verify", "paper"):
        if not isinstance(correct[g], bool):
            return f"field 'correct.{g}' must be true or false, got {_short(correct[g])}"
    extracted = r.get("extracted", {})
    if not isinstance(extracted, dict):
        return f"field 'extracted' must be a mapping, got {_short(extracted)}"
    for g, v in extracted.items():
        if v is not None and not isinstance(v, str):
            return f"field 'extracted.{g}' must be a string or null, got {_short(v)}"
    return None


def _short(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    text = json.dumps(value, ensure_ascii=False)[:60] if not isinstance(value, str) else repr(value[:60])
    return text


def read(path: str | Path, where: OutputDir | None = None) -> Iterator[dict[str, Any]]:
    """Records of a jsonl file; a bad line is an error naming file and line (a torn
    trailing line is skipped: ``repair`` removes it)."""
    for _, r in read_numbered(path, where):
        yield r


def read_numbered(path: str | Path, where: OutputDir | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed line) of a jsonl file, as ``read`` (``where``: the run's output
    directory, ``path`` a name in it)."""
    p = _at(path, where)
    lines = _lines(p)
    torn = lines[-1] != b""
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = load_json(raw, f"{p}:{lineno}", RecordError)
        except RecordError:
            if torn and lineno == len(lines):
                return
            raise
        # a lone surrogate ("\ud800" escaped: raw UTF-8 cannot hold one) is read as U+FFFD, so no
        # output that shows or writes the text fails to encode it later
        yield lineno, _without_lone_surrogates(obj) if _SURROGATE_ESCAPE.search(raw) else obj


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a JSON escape of a surrogate (maybe of a pair)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins pairs: any left is alone


def _without_lone_surrogates(obj: Any) -> Any:
    """``obj`` with each lone surrogate of its strings (keys too) replaced by U+FFFD."""
    if isinstance(obj, str):
        return _LONE_SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, list):
        return [_without_lone_surrogates(x) for x in obj]
    if isinstance(obj, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in obj.items()}
    return obj
