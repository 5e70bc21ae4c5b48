"""Opening input files without trusting what the path is.

A path given as input may be a link to ``/dev/zero`` (reading never ends: memory runs out), a FIFO
(opening it blocks until a writer comes: the tool hangs) or a directory. :func:`open_input` opens
without blocking, looks at what it opened, and refuses anything but a regular file with one line
naming the path and what it is. Standard library only (``rpg_eval`` imports it).
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """An input path that is missing or not a regular file (the message names it)."""


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in words: "a regular file", "a FIFO (named pipe)", ..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_input(path: str | os.PathLike, what: str = "") -> None:
    """Refuse (InputFileError) a ``path`` that exists and is not a regular file (links followed);
    for readers that open the path themselves (pandas). ``what``: a flag to name, e.g. "--input"."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputFileError(f"{_name(path, what)}: {e.strerror}") from None
    _refuse_unless_regular(st.st_mode, path, what)


def open_input(path: str | os.PathLike, what: str = "") -> BinaryIO:
    """``path`` opened for binary reading, or InputFileError when it is missing or not a regular
    file. Opened with O_NONBLOCK (a FIFO's open returns at once instead of waiting for a writer),
    checked with fstat (what was opened, not what the name pointed to a moment before), then
    switched back to blocking reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputFileError(f"{_name(path, what)}: no such file") from None
    except OSError as e:
        raise InputFileError(f"{_name(path, what)}: {e.strerror}") from None
    try:
        _refuse_unless_regular(os.fstat(fd).st_mode, path, what)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _refuse_unless_regular(mode: int, path: str | os.PathLike, what: str) -> None:
    if not stat.S_ISREG(mode):
        raise InputFileError(f"{_name(path, what)}: is {kind_of(mode)}, not a regular file; give a data file")


def _name(path: str | os.PathLike, what: str) -> str:
    return f"{what} {Path(path)}" if what else str(Path(path))
