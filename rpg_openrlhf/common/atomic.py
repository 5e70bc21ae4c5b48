"""One way to replace a file atomically: write a temp file beside it, fsync, rename over it.

Readers see the old file or the new one, never half of one; on any failure (an exception, a
full disk) the temp file is removed and the old file is left as it was. A SIGKILL can leave the
temp file behind, never a torn target.

Nothing is written through a symbolic link: the temp file is created exclusively (``O_EXCL |
O_NOFOLLOW``), so a link planted at a fixed temp name (``run.json.tmp -> /elsewhere``) is refused
instead of followed, and the rename replaces a link at the target instead of writing where it
points. New files get the mode ``open()`` gives (0666 less the umask: 0644 as a rule), not the
0600 of ``tempfile``."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class UnsafePathError(ValueError):
    """A path the tools will not write through (a symbolic link, a device, a FIFO)."""


def file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 without the process umask (read, not changed,
    where /proc says it; else set and restored at once)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def create_exclusive(name: str | Path) -> int:
    """A new file at ``name``, opened for writing without following links: a leftover regular
    file (a temp file a killed writer left) is removed first; a symbolic link or anything that is
    not a regular file is refused (UnsafePathError), and left as it is."""
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{name}: is a symbolic link; refusing to write through it (remove the link)"
            )
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{name}: exists and is not a regular file; remove it or write elsewhere")
        os.unlink(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, 0o666)  # the umask applies, as for open()


@contextlib.contextmanager
def atomic_write(
    path: str | Path, mode: str = "w", *, tmp: str | None = None, **open_kwargs: Any
) -> Iterator[IO]:
    """Open a temp file in path's folder for writing (`mode` "w" or "wb"; text defaults to UTF-8);
    on a clean exit flush, fsync and rename it over path. `tmp`: the temp file's name (a fixed
    name that a reader knows, e.g. rpg-eval's run.json.tmp); default a unique NAME.XXXX.tmp."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: atomic_write writes whole files ('w' or 'wb'), got {mode!r}")
    path = Path(path)
    if "b" not in mode:
        open_kwargs.setdefault("encoding", "utf-8")
    if tmp is None:
        fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, file_mode())
    else:
        name = str(path.with_name(tmp))
        fd = create_exclusive(name)  # refuses a link before anything is written or removed
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


__all__ = ["UnsafePathError", "atomic_write", "create_exclusive", "file_mode"]
