"""The checkpoint layer's directory access (``extras/checkpoints``, ``common/checkpoints.py``,
``extras/run_settings.py``): an output directory opened once, every entry below it reached through
its descriptor (``openat``, ``O_NOFOLLOW``), ``RunLock`` (an ``flock`` held for the process's life).
Every other command writes through :mod:`rpg_openrlhf.common.atomic` (docs/contracts.md, "Threat
model"); this module goes with the staging of checkpoint saves it serves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any, BinaryIO

from rpg_openrlhf.common.atomic import (  # one error type and one mark for every writer
    OWNER_FILE,
    UnsafePathError,
)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of a write itself (not of opening): reported with the file's name.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _parts(rel: str | os.PathLike) -> list[str]:
    """The components of a path below an output directory (never absolute, never ``..``)."""
    path = PurePosixPath(os.fspath(rel))
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or ".." in parts or not parts:
        raise ValueError(f"{rel}: not a path below the output directory")
    return parts


def _fsync_dir(fd: int) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        os.fsync(fd)


def _blocker(path: Path) -> Path | None:
    """The first component of ``path`` that exists and is not a directory (``--out file/x``)."""
    for prefix in [*reversed(path.parents), path]:
        try:
            st = os.stat(prefix)
        except FileNotFoundError:
            return None
        except OSError:
            return prefix
        if not stat.S_ISDIR(st.st_mode):
            return prefix
    return None


def _named(exc: OSError, shown: str | os.PathLike) -> OSError:
    """``exc`` with the file's name, when the error is a write's own (a full disk)."""
    if exc.filename is None and exc.errno in _WRITE_ERRNOS:
        return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(shown))
    return exc


class OutputDir:
    """An open output directory: every write below it follows the module's rules."""

    def __init__(self, fd: int, path: Path, flag: str = "--out") -> None:
        self.fd, self.path, self.flag = fd, path, flag

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | os.PathLike, create: bool = False, flag: str = "--out") -> OutputDir:
        """The directory at ``path`` (created with its parents when ``create``); UnsafePathError when
        it is, or lies under, something that is not a directory."""
        path = Path(path)
        if create:
            cls._make(path, flag)
        try:
            return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path, flag)
        except NotADirectoryError:
            raise cls._not_a_dir(path, flag) from None

    @staticmethod
    def _make(path: Path, flag: str) -> bool:
        """mkdir -p; whether ``path`` itself was created now."""
        try:
            os.makedirs(path)
            return True
        except FileExistsError:
            return False
        except NotADirectoryError:
            raise OutputDir._not_a_dir(path, flag) from None

    @staticmethod
    def _not_a_dir(path: Path, flag: str, named: Path | None = None) -> UnsafePathError:
        """``path`` is, or lies under, something that is not a directory; the message names ``named``
        (what the user gave: ``path`` or a file in it)."""
        named = named or path
        where = _blocker(path) or path
        with contextlib.suppress(OSError):
            what = kind_of(os.stat(where).st_mode)
            if where == named:
                return UnsafePathError(f"{flag} {named}: is {what}, not a directory")
            return UnsafePathError(f"{flag} {named}: {where} is {what}, so nothing can be written under it")
        return UnsafePathError(f"{flag} {named}: not a directory")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ names and refusals
    def shown(self, rel: str | os.PathLike = "") -> Path:
        """``rel`` as the user would name it (the output directory's path joined)."""
        return self.path / rel if rel else self.path

    def _refuse(
        self, rel: str | os.PathLike, what: str, dir_fd: int | None = None, name: str = ""
    ) -> UnsafePathError:
        link = ""
        if what == "a symbolic link" and dir_fd is not None:
            with contextlib.suppress(OSError):
                link = f" (to {os.readlink(name, dir_fd=dir_fd)})"
        advice = (
            "nothing is written through a link: remove it"
            if what == "a symbolic link"
            else "only a regular file is ever replaced: remove it or write elsewhere"
        )
        return UnsafePathError(f"{self.shown(rel)}: is {what}{link}; {advice}")

    def _open_sub(self, parent: int, name: str, create: bool, rel: str, mode: int = 0o777) -> int:
        try:
            return os.open(name, _DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(
                    errno.ENOENT, os.strerror(errno.ENOENT), str(self.shown(rel))
                ) from None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=parent)
            return self._open_sub(parent, name, False, rel)  # a link planted meanwhile: refused below
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise self._refuse(rel, self._kind_at(parent, name) or "not a directory", parent, name) from None

    @contextlib.contextmanager
    def _at(self, rel: str | os.PathLike, create: bool) -> Iterator[tuple[int, str]]:
        """(descriptor of ``rel``'s directory, its last component); intermediate directories opened
        with O_NOFOLLOW (created when ``create``) and closed afterwards."""
        parts = _parts(rel)
        opened: list[int] = []
        fd = self.fd
        try:
            for i, name in enumerate(parts[:-1]):
                fd = self._open_sub(fd, name, create, "/".join(parts[: i + 1]))
                opened.append(fd)
            yield fd, parts[-1]
        finally:
            for d in opened:
                os.close(d)

    @staticmethod
    def _kind_at(dir_fd: int, name: str) -> str | None:
        try:
            return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None

    def kind(self, rel: str | os.PathLike) -> str | None:
        """What is at ``rel`` (``"a regular file"``, ``"a directory"``, ``"a symbolic link"``, ...), or
        None when nothing is; a link on the way there is refused."""
        try:
            with self._at(rel, create=False) as (fd, name):
                return self._kind_at(fd, name)
        except FileNotFoundError:
            return None

    def check_files(self, names: Iterable[str]) -> None:
        """Each of ``names`` absent or a regular file (the files a run rewrites: refused at its start,
        not at its first save)."""
        for name in names:
            what = self.kind(name)
            if what not in (None, "a regular file"):
                raise self._refuse(name, what, self.fd, name)

    def _check_replaceable(
        self, dir_fd: int, name: str, rel: str | os.PathLike, link_ok: bool = False
    ) -> None:
        what = self._kind_at(dir_fd, name)
        if what not in (None, "a regular file") and not (link_ok and what == "a symbolic link"):
            raise self._refuse(rel, what, dir_fd, name)

    # ------------------------------------------------------------------ writing
    @contextlib.contextmanager
    def replace(
        self,
        rel: str | os.PathLike,
        mode: str = "w",
        *,
        tmp: str | None = None,
        replace_link: bool = False,
        **open_kwargs: Any,
    ) -> Iterator[IO]:
        """Open a temp file beside ``rel`` for writing (``mode`` "w" or "wb"; text defaults to UTF-8);
        on a clean exit flush, fsync and rename it over ``rel`` (rule 4). ``tmp``: a fixed temp name
        that a reader knows (a leftover regular file there is removed first; anything else refused);
        default a unique ``NAME.XXXXXXXX.tmp``. A link at ``rel`` is refused, or with
        ``replace_link`` replaced by the file (the link itself, never what it points to)."""
        if mode not in ("w", "wb"):
            raise ValueError(f"mode: whole files only ('w' or 'wb'), got {mode!r}")
        if "b" not in mode:
            open_kwargs.setdefault("encoding", "utf-8")
        with self._at(rel, create=True) as (dir_fd, name):
            self._check_replaceable(dir_fd, name, rel, replace_link)
            tmp_name = tmp or f"{name}.{secrets.token_hex(4)}.tmp"
            if tmp is not None:
                self._check_replaceable(dir_fd, tmp_name, Path(rel).with_name(tmp_name))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name, dir_fd=dir_fd)  # a temp file a killed writer left
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp_name, flags, 0o666, dir_fd=dir_fd)  # the umask applies, as for open()
            try:
                with os.fdopen(fd, mode, **open_kwargs) as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
                self._check_replaceable(dir_fd, name, rel, replace_link)  # planted while it was written
                os.replace(tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                _fsync_dir(dir_fd)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_name, dir_fd=dir_fd)
                if isinstance(exc, OSError):
                    named = _named(exc, self.shown(rel))
                    if named is not exc:
                        raise named from None
                raise

    def write_text(self, rel: str | os.PathLike, text: str) -> None:
        with self.replace(rel, "w") as f:
            f.write(text)

    def write_json(self, rel: str | os.PathLike, value: Any, **dump_kwargs: Any) -> None:
        with self.replace(rel, "w") as f:
            json.dump(value, f, **dump_kwargs)

    # ------------------------------------------------------------------ directories
    def subdir(self, rel: str | os.PathLike, create: bool = False) -> OutputDir:
        """The directory at ``rel`` below this one, reached without following a link (created with
        its parents when ``create``)."""
        parts = _parts(rel)
        fd = os.dup(self.fd)
        try:
            for i, name in enumerate(parts):
                sub = self._open_sub(fd, name, create, "/".join(parts[: i + 1]))
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return OutputDir(fd, self.shown(rel), self.flag)

    def mkdir_fresh(self, name: str, mode: int = 0o700) -> OutputDir:
        """A directory ``name`` created now (FileExistsError when anything is at the name, a link
        included): nothing but this process put what is in it."""
        _parts(name)
        os.mkdir(name, mode, dir_fd=self.fd)
        return self.subdir(name)

    def stat(self, rel: str | os.PathLike) -> os.stat_result:
        """``lstat`` of ``rel`` (links not followed on the way either)."""
        with self._at(rel, create=False) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def walk(self) -> Iterator[tuple[str, os.stat_result]]:
        """Every entry below this directory: (relative path, its ``lstat``); links are listed, never
        followed or entered."""
        for root, dirs, files, fd in os.fwalk(dir_fd=self.fd):
            for name in (*dirs, *files):
                yield (
                    os.path.normpath(os.path.join(root, name)),
                    os.stat(name, dir_fd=fd, follow_symlinks=False),
                )

    def move(self, name: str, dest: OutputDir, dest_name: str) -> None:
        """Rename the entry ``name`` of this directory to ``dest_name`` in ``dest`` (same filesystem),
        never over an existing entry (FileExistsError, naming it)."""
        if self._kind_at(dest.fd, dest_name) is not None:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest.shown(dest_name)))
        try:
            # a directory renamed onto a link fails (ENOTDIR), onto a non-empty one too (ENOTEMPTY)
            os.rename(name, dest_name, src_dir_fd=self.fd, dst_dir_fd=dest.fd)
        except OSError as e:
            raise OSError(
                e.errno, e.strerror, str(self.shown(name)), None, str(dest.shown(dest_name))
            ) from None
        _fsync_dir(dest.fd)

    def replace_entry(self, name: str, dest: OutputDir, dest_name: str) -> None:
        """Rename the regular file ``name`` over ``dest_name`` in ``dest`` (a link there is replaced,
        not followed; anything but a regular file refused)."""
        dest._check_replaceable(dest.fd, dest_name, dest_name)
        os.replace(name, dest_name, src_dir_fd=self.fd, dst_dir_fd=dest.fd)
        _fsync_dir(dest.fd)

    def remove(self, rel: str | os.PathLike) -> None:
        """Remove ``rel``: a file or link (the link itself), or a directory tree (``shutil.rmtree``
        through descriptors: a link inside is removed, never followed). Nothing there: nothing done."""
        with self._at(rel, create=False) as (fd, name):
            what = self._kind_at(fd, name)
            if what is None:
                return
            if what == "a directory":
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)

    @contextlib.contextmanager
    def open_file(self, rel: str | os.PathLike) -> Iterator[BinaryIO]:
        """A regular file below this directory, opened for reading without following a link and
        without blocking on a FIFO (anything but a regular file is refused)."""
        with self._at(rel, create=False) as (dir_fd, name):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise self._refuse(rel, "a symbolic link", dir_fd, name) from None
                raise OSError(e.errno, e.strerror, str(self.shown(rel))) from None
        yield _regular(fd, self.shown(rel))

    def lock(self, name: str, what: str) -> RunLock:
        """:class:`RunLock` on ``name`` in this directory, acquired now."""
        return RunLock(self, name, what)


def _regular(fd: int, shown: str | os.PathLike, flag: str = "") -> BinaryIO:
    """The file object of ``fd`` if it is a regular file (blocking mode restored); else refused."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        prefix = f"{flag} " if flag else ""
        raise UnsafePathError(
            f"{prefix}{shown}: is {kind_of(st.st_mode)}, not a regular file; nothing was read"
        )
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, "rb")


# ---------------------------------------------------------------------------- one writer per directory
class LockedError(UnsafePathError):
    """Another live process holds the directory's lock (the message names it)."""


def _describe_holder(info: dict[str, Any] | None) -> str:
    if not info:
        return "a process that did not say who it is"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, since {when}"


def _holder(fd: int) -> dict[str, Any] | None:
    raw = os.pread(fd, 4096, 0)
    try:
        info = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {"pid": raw.decode("ascii", "replace").strip() or "?"}  # an older lock: the pid alone
    return info if isinstance(info, dict) else None


class RunLock:
    """Exclusive use of a directory by this process: ``flock`` on its lock file, held until
    :meth:`release` or the process ends (the kernel releases it on any death). The file says who
    holds it (pid, host, start time, a token for :func:`lock_holder`)."""

    def __init__(self, out: OutputDir, name: str, what: str) -> None:
        self.path = out.shown(name)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=out.fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise OSError(e.errno, e.strerror, str(self.path)) from None
            raise out._refuse(name, "a symbolic link", out.fd, name) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            raise UnsafePathError(f"{self.path}: not a lock file this project wrote (not a regular file, or "
                                  "linked elsewhere); remove it")  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise LockedError(
                f"{out.flag + ' ' if out.flag else ''}{out.path}: in use by another {what} "
                f"({_describe_holder(holder)}; {self.path}): one {what} per directory; wait for it to end "
                f"or use another{' ' + out.flag if out.flag else ' directory'}"
            ) from None
        self.fd = fd
        self.token = secrets.token_hex(8)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "token": self.token}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def lock_holder(path: str | os.PathLike) -> dict[str, Any] | None:
    """What the live holder of the lock at ``path`` wrote (``pid``, ``host``, ``started``, ``token``),
    or None when no process holds it (it died, released it, or there is no lock file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd) or {}
        return None  # nobody holds it exclusively
    finally:
        os.close(fd)


__all__ = ["OWNER_FILE", "LockedError", "OutputDir", "RunLock", "UnsafePathError", "kind_of", "lock_holder"]
