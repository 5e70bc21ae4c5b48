"""One way to replace a file atomically: ``atomic_write(path, mode="w", *, tmp=None, **open_kwargs)``.

A temp file is created exclusively beside ``path`` (``O_EXCL | O_NOFOLLOW``), written, fsynced and
renamed over it; readers see the old file or the new one, never half of one. On any failure (an
exception, a full disk: the error names the file) the temp file is removed and the old file is left
as it was. A symbolic link at ``path`` is replaced by the file (the link itself: nothing is written
where it points); a device, FIFO, socket or directory there is refused (:class:`UnsafePathError`),
never replaced. New files get the mode ``open()`` gives (0666 less the umask).

The implementation is the project's write policy, :mod:`rpg_openrlhf.common.writes` (output
directories, no link followed below them, one writer per directory); this module keeps the name
every writer imports.
"""

from __future__ import annotations

from rpg_openrlhf.common.writes import UnsafePathError, atomic_write

__all__ = ["UnsafePathError", "atomic_write"]
