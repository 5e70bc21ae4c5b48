"""Append-only, crash-safe jsonl of sample records.

Each append writes whole lines with one ``os.write`` on an O_APPEND descriptor, then
fsyncs.  A crash can only leave a torn *trailing* line (or, once another writer appended after
it, an invalid complete line: appends always start on a fresh line); ``repair`` removes both
(and reports them) before a run resumes, so nothing is lost that was acknowledged and nothing
is duplicated.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.cliutil import load_json
from rpg_openrlhf.common.inputs import open_input

from .outputs import OutputDir


class RecordError(ValueError):
    """A corrupt record file (a bad line that is not the trailing one)."""


def _at(path: str | Path, where: OutputDir | None) -> Path:
    """The record file: ``path`` below ``where`` (the run's output directory), or ``path`` itself."""
    return where.shown(path) if where is not None else Path(path)


def check_own_file(fd: int, path: str | Path) -> None:
    """Refuse (RecordError naming ``path``) a record file opened as ``fd`` that is not a regular
    file of its own: a hard link's other names see every append and truncation made here, so a
    ``samples.jsonl`` linked from elsewhere would have rpg-eval write into that file too."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RecordError(f"{path}: is not a regular file; rpg-eval writes records only to its own file")
    if st.st_nlink > 1:
        raise RecordError(
            f"{path}: has {st.st_nlink} hard links; rpg-eval never writes records through a link (the "
            "other names would change too): copy it (cp) over itself or use another --out"
        )


def open_own(path: str | Path, flags: int, mode: int = 0o644, where: OutputDir | None = None) -> int:
    """``os.open`` plus ``check_own_file`` (the descriptor is closed on refusal)."""
    p = _at(path, where)
    fd = os.open(p, flags | os.O_CLOEXEC, mode)
    try:
        check_own_file(fd, p)
    except BaseException:
        os.close(fd)
        raise
    return fd


def repair(path: str | Path, where: OutputDir | None = None) -> int:
    """Truncate a torn trailing line and drop complete lines that are not valid JSON (see
    ``repair_counts``); returns the number of bytes removed (0 if clean)."""
    torn, _dropped, dropped_bytes = repair_counts(path, where)
    return torn + dropped_bytes


def repair_counts(path: str | Path, where: OutputDir | None = None) -> tuple[int, int, int]:
    """Repair a record file: (bytes of the torn trailing line cut, invalid lines dropped, their bytes).

    A writer killed mid-record leaves a fragment; once another writer appended after it (append()
    starts on a fresh line) the fragment is a complete but invalid line, possibly not the last one.
    Such lines are dropped, rewriting the file through a temp file + rename (crash-safe), in the
    same directory (``where``: the run's output directory)."""
    if not _at(path, where).exists():
        return 0, 0, 0
    fd = open_own(path, os.O_RDWR, where=where)
    size = os.fstat(fd).st_size
    if size == 0:
        os.close(fd)
        return 0, 0, 0
    with os.fdopen(fd, "rb+") as f:
        keep = _last_line_end(f, size)
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        f.seek(0)
        bad = {i: len(raw) for i, raw in enumerate(f) if raw.strip() and not _is_json(raw)}
        if bad:
            f.seek(0)  # the file opened above, streamed into its replacement
            p = _at(path, where)
            with atomic_write(p, "wb", tmp=p.name + ".repair.tmp") as dst:
                dst.writelines(raw for i, raw in enumerate(f) if i not in bad)
    return size - keep, len(bad), sum(bad.values())


def _last_line_end(f: BinaryIO, size: int) -> int:
    """The offset just after the last newline of the open file (0: none), read backwards in blocks
    (files can be large)."""
    pos, block = size, 1 << 16
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


# Fields every record of `rpg-eval run` has (docs/eval.md); a line without them is not ours.
RECORD_KEYS = (
    "run",
    "checkpoint",
    "step",
    "benchmark",
    "problem_id",
    "sample_index",
    "prompt_style",
    "correct",
)


def _torn(raw: bytes) -> bool:
    """Could ``raw`` (a line that is not valid JSON) be what a killed writer left of a record?
    Records are written whole by one write() from their first byte, so a torn one is a prefix of
    a JSON object (``{"...``); a crash of the machine can also leave NUL bytes."""
    body = raw.rstrip(b"\n")
    return not body.strip(b"\x00") or body == b"{" or body.startswith(b'{"')


def check_owned(path: str | Path, where: OutputDir | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every record of a samples.jsonl this tool wrote, without modifying it.

    Lines that are not valid JSON are allowed only where a killed writer could have left them
    (see ``_torn``; ``repair`` removes them afterwards); any other line -- valid JSON that is not
    a record, or text -- means the file is not (only) ours: RecordError naming file and line."""
    p = _at(path, where)
    out: list[tuple[int, dict[str, Any]]] = []
    if not p.exists():
        return out
    with os.fdopen(open_own(path, os.O_RDONLY | os.O_NONBLOCK, where=where), "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                r = json.loads(raw)
            except (ValueError, RecursionError):
                if _torn(raw):
                    continue
                raise RecordError(
                    f"{p}:{lineno}: not a record written by rpg-eval run ({raw[:40]!r}); refusing to "
                    "modify this file: use another --out"
                ) from None
            missing = [k for k in RECORD_KEYS if not isinstance(r, dict) or k not in r]
            if missing:
                raise RecordError(
                    f"{p}:{lineno}: not a record written by rpg-eval run (no field {missing[0]!r}); "
                    "refusing to modify this file: use another --out"
                )
            out.append((lineno, r))
    return out


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # also bytes that are not UTF-8, huge numbers, deep nesting
        return False
    return True


def append(path: str | Path, records: Iterable[dict[str, Any]], where: OutputDir | None = None) -> int:
    """Append records as json lines atomically (one write + fsync); returns the count. ``where``: the
    run's open output directory, ``path`` a name in it."""
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records]
    if not lines:
        return 0
    data = "".join(lines).encode("utf-8")
    fd = open_own(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, where=where)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # Ray workers append to the same file
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # A writer killed mid-record left a fragment: start on a fresh line so the first record
            # is not glued onto it (repair() then drops the fragment as an invalid line).
            data = b"\n" + data
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(lines)


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a samples.jsonl for summaries: ``read`` plus a check that every line is a
    record with the types rpg-eval writes (see ``record_damage``), naming file and line where one
    is not."""
    for _, r in read_records_numbered(path):
        yield r


def read_records_numbered(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of ``read_records``."""
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
    with open_input(p) as f:  # a link to /dev/zero or a FIFO is refused, not read forever
        data = f.read()
    lines = data.split(b"\n")
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
