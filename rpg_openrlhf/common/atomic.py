"""One way to replace a file atomically: write a temp file beside it, fsync, rename over it.

Readers see the old file or the new one, never half of one; on any failure (an exception, a
full disk) the temp file is removed and the old file is left as it was. A SIGKILL can leave the
temp file behind, never a torn target."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


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
        f = os.fdopen(fd, mode, **open_kwargs)
    else:
        name = str(path.with_name(tmp))
        f = open(name, mode, **open_kwargs)  # noqa: SIM115 - closed below, before the rename
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


__all__ = ["atomic_write"]
