"""Every file a command writes goes through here (docs/contracts.md, "Threat model").

* :func:`atomic_write`: a temp file in the same folder, fsynced, then ``os.replace``: readers see
  the old file or the new one; on a failure the old file stays and the error names the file.
* :func:`output_dir`: a command's output folder: refused (one line naming it) when it is a file, a
  link, a device or FIFO, a non-empty folder without this tool's mark, or one of the inputs; marked
  (:data:`OWNER_FILE`) and locked (``filelock``, one run per folder) before the first write.
* :func:`check_output_path` / :func:`write_file`: one output file the user named.
Another process racing these writes (links planted mid-write) is out of scope.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from filelock import FileLock, Timeout

from rpg_openrlhf.common import inputs

#: The ownership mark: its text is the command that made the folder.
OWNER_FILE = ".rpg-owner"
LOCK_FILE = ".lock"


class UnsafePathError(ValueError):
    """A path a command will not write (the message is one line naming it)."""


class LockedError(UnsafePathError):
    """Another live run holds the output's lock."""


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words (links not followed)."""
    return "a symbolic link" if stat.S_ISLNK(mode) else inputs.kind_of(mode)


def _kind(path: Path) -> str | None:
    try:
        return kind_of(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return "under a file"


def _same(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        return a.resolve() == b.resolve() or os.path.samefile(a, b)
    return False


def refuse_inputs(out: str | os.PathLike, inputs: Iterable[str | os.PathLike], flag: str = "--out") -> None:
    """An output that is one of the command's inputs (the files and folders it reads) is refused."""
    for p in map(Path, inputs):
        if _same(Path(out), p):
            raise UnsafePathError(
                f"{flag} {out}: is an input of this command ({p}); write the output elsewhere"
            )


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "w", *, tmp: str | None = None, **kw: Any
) -> Iterator[IO]:
    """Write ``path`` whole (``mode`` "w" or "wb"; text defaults to UTF-8) through a temp file in its
    folder (``tmp``: a fixed name a reader knows); a link at ``path`` is replaced, not written through."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: atomic_write writes whole files ('w' or 'wb'), got {mode!r}")
    path = Path(path)
    what = _kind(path)
    if what not in (None, "a regular file", "a symbolic link"):
        raise UnsafePathError(f"{path}: is {what}; only a regular file is replaced")
    if "b" not in mode:
        kw.setdefault("encoding", "utf-8")
    temp = path.with_name(tmp or f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        f = open(temp, mode, **kw)  # noqa: SIM115 (closed below, before the rename)
    except OSError as e:  # a read-only or missing folder: name the file, not the temp file
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(e, OSError) and e.filename in (None, str(temp)):
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def _check_parents(path: Path, flag: str) -> None:
    """``--out file/x``: one line naming the file in the way."""
    blocker = next((p for p in reversed(path.parents) if _kind(p) not in (None, "a directory")), None)
    if blocker is not None and not blocker.is_dir():
        raise UnsafePathError(
            f"{flag} {path}: {blocker} is {_kind(blocker)}, so nothing can be written under it"
        )


def check_output_path(
    path: str | os.PathLike, flag: str = "--out", inputs: Iterable[str | os.PathLike] = ()
) -> None:
    """Before the work: ``path`` may become the output file (absent or a regular file, not an input)."""
    path = Path(path)
    _check_parents(path, flag)
    what = _kind(path)
    if what not in (None, "a regular file"):
        raise UnsafePathError(f"{flag} {path}: is {what}; give the path of a file to write")
    refuse_inputs(path, inputs, flag)


def write_file(
    path: str | os.PathLike, data: bytes | str, flag: str = "--out", inputs: Iterable[str | os.PathLike] = ()
) -> None:
    """Replace the output file ``path`` atomically (its folder made when missing)."""
    check_output_path(path, flag, inputs)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def check_dir(path: str | os.PathLike, prog: str, flag: str = "--out", marks: Iterable[str] = (),
              inputs: Iterable[str | os.PathLike] = (), allowed: Iterable[str | os.PathLike] = ()) -> None:  # fmt: skip
    """Before the work, changing nothing: ``path`` may become ``prog``'s output folder: absent, empty
    (but for ``allowed``: inputs it may hold), or holding ``prog``'s :data:`OWNER_FILE` (or one of
    ``marks``, today's marks of run folders)."""
    path = Path(path)
    _check_parents(path, flag)
    what = _kind(path)
    if what not in (None, "a directory"):
        raise UnsafePathError(f"{flag} {path}: is {what}, not a directory; nothing was changed")
    refuse_inputs(path, inputs, flag)
    if what is None:
        return
    keep = {q for p in allowed for q in (Path(p).resolve(), Path(p).resolve().parent)}
    names = sorted(n for n in os.listdir(path) if n != LOCK_FILE and (path / n).resolve() not in keep)
    if not names:
        return  # a folder holding only a lock: a run killed before it marked it
    owner = (path / OWNER_FILE).read_text().strip() if (path / OWNER_FILE).is_file() else None
    if owner is not None and owner != prog:
        raise UnsafePathError(
            f"{flag} {path}: made by {owner} ({OWNER_FILE}), not {prog}; give a new or empty folder"
        )
    if owner is None and not any((path / m).exists() for m in marks):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise UnsafePathError(f"{flag} {path}: holds {shown} and no {OWNER_FILE}, so {prog} did not make it; "
                              "nothing was changed: give a new or empty folder")  # fmt: skip


def lock_holder(lock: str | os.PathLike) -> int | None:
    """The pid the lock file names (None: none or unreadable)."""
    with contextlib.suppress(OSError):  # today's text: the pid; older rpg-train locks: JSON with "pid"
        found = re.search(r"\d+", Path(lock).read_text()[:200])
        return int(found.group()) if found else None
    return None


@contextlib.contextmanager
def hold_lock(folder: str | os.PathLike, prog: str, name: str = LOCK_FILE) -> Iterator[FileLock]:
    """One run per folder: ``filelock`` on ``folder/name``, held for the block; the kernel drops it
    when the process dies. A second run is refused: "another PROG run (pid N) holds FOLDER"."""
    lock = FileLock(Path(folder) / name, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        pid = lock_holder(lock.lock_file) or "?"
        raise LockedError(
            f"another {prog} run (pid {pid}) holds {folder}; wait for it or use another output"
        ) from None
    try:
        Path(lock.lock_file).write_text(f"{os.getpid()}\n")  # truncates; the lock is on the inode
        yield lock
    finally:
        lock.release()


def mark(path: str | os.PathLike, prog: str) -> None:
    """Make the folder ``path`` (with its parents) and write ``prog``'s :data:`OWNER_FILE` into it."""
    Path(path).mkdir(parents=True, exist_ok=True)
    if not (Path(path) / OWNER_FILE).is_file():
        with atomic_write(Path(path) / OWNER_FILE) as f:
            f.write(prog + "\n")


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, prog: str, flag: str = "--out", marks: Iterable[str] = (),
               inputs: Iterable[str | os.PathLike] = (), allowed: Iterable[str | os.PathLike] = (),
               lock: bool = True) -> Iterator[Path]:  # fmt: skip
    """``prog``'s output folder (:func:`check_dir`), made, locked and marked for the block; a folder
    made here and left holding nothing but the mark (a failure, a full disk) is removed."""
    path, marks, allowed = Path(path), tuple(marks), tuple(allowed)
    check_dir(path, prog, flag, marks, inputs, allowed)
    created = _kind(path) is None
    path.mkdir(parents=True, exist_ok=True)
    try:
        with hold_lock(path, prog) if lock else contextlib.nullcontext():
            check_dir(path, prog, flag, marks, (), allowed)  # again, now that no other run can be making it
            mark(path, prog)
            yield path
    except BaseException:
        if created and set(os.listdir(path)) <= {OWNER_FILE, LOCK_FILE}:
            for name in (OWNER_FILE, LOCK_FILE):
                with contextlib.suppress(OSError):
                    os.unlink(path / name)
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
