"""Every command's writes (docs/contracts.md, "Threat model"): :func:`atomic_write` (temp file in the same
folder, then ``os.replace``), :func:`output_dir` (a folder refused unless new, empty or marked, then
locked with ``filelock`` and marked :data:`OWNER_FILE`), :func:`write_file` (one output file)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout

from rpg_openrlhf.common import inputs

OWNER_FILE, LOCK_FILE = ".rpg-owner", ".lock"  # the ownership mark (its text: the command that made it)
Paths = Iterable[str | os.PathLike]


class UnsafePathError(ValueError):
    """A path a command will not write (the message is one line naming it)."""


def kind(path: Path) -> str | None:  # what is at ``path`` in words (links not followed), or None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "under a file"
    return "a symbolic link" if stat.S_ISLNK(mode) else inputs.kind_of(mode)


def _refuse(path: Path, flag: str, want: tuple[str | None, ...], inputs: Paths = ()) -> str | None:
    """Refuse, naming it, a ``path`` not of a kind in ``want`` (under a file too), or one of ``inputs``."""
    if (what := kind(path)) not in want:
        raise UnsafePathError(
            f"{flag} {path}: is {what}; give {'a new or empty folder' if 'a directory' in want else 'the path of a file to write'}"
        )
    for p in map(Path, inputs):
        if path.resolve() == p.resolve() or (p.exists() and path.exists() and p.samefile(path)):
            raise UnsafePathError(f"{flag} {path}: is an input of this command ({p}); write elsewhere")
    return what


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, tmp: str | None = None, **kw: Any) -> Iterator[IO]:  # fmt: skip
    """Write ``path`` whole ("w": UTF-8, or "wb") via a temp file in its folder (``tmp``: a fixed name)."""
    path = Path(path)
    temp = path.with_name(tmp or f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temp, mode, **{"encoding": None if "b" in mode else "utf-8", **kw}) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(e, OSError) and e.filename in (None, str(temp)):  # full disk, read-only: the file
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def check_output_path(path: str | os.PathLike, flag: str = "--out", inputs: Paths = ()) -> None:
    """Before the work: ``path`` may become the output file (absent or a regular file, not an input)."""
    _refuse(Path(path), flag, (None, "a regular file"), inputs)


def write_file(path: str | os.PathLike, data: bytes | str, flag: str = "--out", inputs: Paths = ()) -> None:
    """Replace the output file ``path`` atomically (its folder made when missing)."""
    check_output_path(path, flag, inputs)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def check_dir(path: str | os.PathLike, prog: str, flag: str = "--out", marks: Iterable[str] = (),
              inputs: Paths = (), allowed: Paths = ()) -> None:  # fmt: skip
    """Before the work, changing nothing: ``path`` may be ``prog``'s output folder: absent, empty (but
    for ``allowed`` inputs, our lock and temp files), marked by ``prog``, or holding one of ``marks``."""
    path = Path(path)
    if _refuse(path, flag, (None, "a directory"), inputs) is None:
        return
    keep = {q for p in allowed for q in (Path(p).resolve(), Path(p).resolve().parent)}
    names = sorted(n for n in os.listdir(path) if n != LOCK_FILE and not n.endswith(".tmp")  # a killed run's
                   and (path / n).resolve() not in keep)  # fmt: skip
    owner = (path / OWNER_FILE).read_text().strip() if (path / OWNER_FILE).is_file() else None
    if names and owner is not None and owner != prog:
        raise UnsafePathError(f"{flag} {path}: made by {owner} ({OWNER_FILE}), not {prog}; give a new or empty folder")  # fmt: skip
    if names and owner is None and not any((path / m).exists() for m in marks):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise UnsafePathError(f"{flag} {path}: holds {shown} and no {' or '.join((*marks[:1], OWNER_FILE))}, so {prog} did not make it; "
                              "nothing was changed: give a new or empty folder")  # fmt: skip


def take_lock(lock_file: str | os.PathLike, prog: str, folder: str | os.PathLike, flag: str = "") -> FileLock:
    """``filelock`` on ``lock_file`` until released (the kernel drops it when the process dies); while
    another process holds it: "[FLAG FOLDER: ]another PROG run (pid N) holds FOLDER"."""
    lock = FileLock(lock_file, timeout=0, thread_local=False)  # released by any thread (a signal's)
    try:
        lock.acquire()
    except Timeout:  # the holder's pid: the first number (rpg-train's lock files: JSON with "pid")
        pid = (re.findall(r"\d+", Path(lock_file).read_text(errors="replace")[:200]) or ["?"])[0]
        raise UnsafePathError(
            f"{f'{flag} {folder}: ' if flag else ''}another {prog} run (pid {pid}) holds {folder}; "
            f"wait for it or use another {flag or 'output'}"
        ) from None
    return lock


@contextlib.contextmanager
def hold_lock(folder: str | os.PathLike, prog: str) -> Iterator[FileLock]:
    """One run per folder: :func:`take_lock` on ``folder/.lock`` for the block."""
    lock = take_lock(Path(folder) / LOCK_FILE, prog, folder)
    try:
        Path(lock.lock_file).write_text(f"{os.getpid()}\n")  # truncates; the lock is on the inode
        yield lock
    finally:
        lock.release()


def mark(path: str | os.PathLike, prog: str) -> None:
    if not (Path(path) / OWNER_FILE).is_file():
        write_file(Path(path) / OWNER_FILE, prog + "\n")


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, prog: str, flag: str = "--out", marks: Iterable[str] = (),
               inputs: Paths = (), allowed: Paths = ()) -> Iterator[Path]:  # fmt: skip
    """``prog``'s output folder (:func:`check_dir`) made, locked and marked for the block; one made here
    and left with nothing but the mark (a failure, a full disk) is removed."""
    path = Path(path)
    check_dir(path, prog, flag, marks, inputs, allowed)
    created = kind(path) is None
    path.mkdir(parents=True, exist_ok=True)
    try:
        with hold_lock(path, prog):
            mark(path, prog)
            yield path
    except BaseException:
        if created and set(os.listdir(path)) <= {OWNER_FILE, LOCK_FILE}:
            shutil.rmtree(path, ignore_errors=True)
        raise
