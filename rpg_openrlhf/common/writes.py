"""The write policy: every file a command of this project writes goes through this module.

Four rules, each held by how a file is opened, not by a check made before the write (a link
planted between a check and the write would otherwise win):

1. **No link is followed inside an output directory.** The output directory is opened once, at
   the path the user named (links in that path are the user's choice); everything below it is
   reached one component at a time relative to that directory's descriptor, each opened with
   ``O_NOFOLLOW`` (``openat``). A link planted anywhere below it, before or during the write,
   makes the write fail with a line naming it; the write never lands elsewhere.
2. **Only regular files are replaced.** A device, FIFO, socket, directory or link at a file's
   name is refused, named (``--out /dev/null`` never replaces /dev/null, even as root).
3. **A command writes only into a directory it created or marked.** :meth:`OutputDir.claim`
   takes a directory this call creates, an empty one, or one whose :data:`OWNER_FILE` names the
   same command, and marks it; any other (``--out .`` holding a project's README.md) is refused
   before anything in it changes. Commands whose directories carry a mark of their own
   (rpg-train's ``rpg_checkpoints.json``, rpg-eval's ``run.json``) check it themselves and open
   the directory with :meth:`OutputDir.open`.
4. **Every file is replaced atomically.** A temp file is created exclusively beside it
   (``O_EXCL | O_NOFOLLOW``), written, fsynced and renamed over the name within the same
   directory descriptor (``renameat``); then the directory is fsynced. Readers see the old file
   or the new one. On a failure the temp file is removed and the old file kept; a full disk is
   reported with the file's name (``OSError.filename``).

Beside them: one writer per directory (:class:`RunLock`, an ``flock`` held for the process's life
and released by the kernel when it dies, SIGKILL included), and reads that never block or follow a
planted device (:func:`open_regular`).

API (a refusal is :class:`UnsafePathError`, a ValueError whose message is one line naming the
path; other I/O failures are OSError with the file's name):

* ``OutputDir.claim(path, command, flag="--out")``: the output directory of ``command`` (rule 3);
  ``OutputDir.open(path, create=False, flag=...)``: one whose ownership the caller checks.
  Both are context managers (``with ... as out:``) holding a directory descriptor.
* ``out.write_bytes(rel, data)``, ``out.write_text(rel, text)``, ``with out.replace(rel, "w") as
  f:``: a file at ``rel`` below ``out`` (missing directories created, none followed).
* ``out.subdir(rel, create=False)``: an :class:`OutputDir` below ``out``; ``out.mkdir_fresh(name,
  mode)``: a new directory that did not exist (``mkdir`` fails on anything at the name).
* ``out.kind(rel)``: what is at ``rel`` (None: nothing), links not followed; ``out.check_files(
  names)``: each name absent or a regular file (a start check naming the first that is not).
* ``out.move(name, dest, dest_name)``: ``renameat`` of an entry into another OutputDir, never
  over an existing entry; ``out.remove(rel)`` (a file or a whole tree, links removed, not followed).
* ``with out.staged_files() as path:``: for writers that take a path (pandas, matplotlib): they write
  under a fresh directory reached through an open descriptor; the files are moved into ``out`` at the end.
* ``out.lock(name, what)``: a :class:`RunLock`; :func:`lock_holder` reads who holds one.
* ``check_output_path(path, flag)`` before a command's work, then ``write_file(path, data, flag)``:
  one output file the user named (``--out FILE``).
* ``atomic_write(path, mode, tmp=)``: rules 2 and 4 for one file whose directory the caller trusts
  (``rpg_openrlhf.common.atomic`` re-exports it: the signature every module uses); a link at ``path``
  is replaced by the file, never written through (rpg-eval's task files rely on it).
* ``open_regular(path, flag)``: a regular file opened for reading (a FIFO, device or directory is
  refused without blocking).
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

#: Marks an output directory as a command's (rule 3): its text is the command's name.
OWNER_FILE = ".rpg-owner"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of a write itself (not of opening): reported with the file's name.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)


class UnsafePathError(ValueError):
    """A path the project will not write through or over (a link, a device, a FIFO, a socket, a
    directory it did not create or mark); the message is one line naming it."""


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

    @classmethod
    def claim(cls, path: str | os.PathLike, command: str, flag: str = "--out") -> OutputDir:
        """``command``'s output directory at ``path`` (rule 3): created now, empty, or marked by
        ``command`` before; marked for the next run. Anything else is refused, untouched."""
        path = Path(path)
        created = cls._make(path, flag)
        out = cls.open(path, flag=flag)
        try:
            owner = out.owner()
            if not created and owner != command:
                names = sorted(os.listdir(out.fd))
                if owner is not None:
                    raise UnsafePathError(
                        f"{flag} {path}: written by {owner} ({OWNER_FILE}), not by {command}; "
                        "nothing was changed: give a new or empty directory"
                    )
                if names:
                    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                    raise UnsafePathError(
                        f"{flag} {path}: holds {shown} and no {OWNER_FILE} naming {command}, so {command} "
                        "did not write it; nothing was changed: give a new or empty directory"
                    )
            if owner != command:
                out.write_text(OWNER_FILE, command + "\n")
        except BaseException:
            out.close()
            raise
        return out

    def owner(self) -> str | None:
        """The command :data:`OWNER_FILE` names (None: no regular owner file)."""
        if self.kind(OWNER_FILE) != "a regular file":
            return None
        with self.open_file(OWNER_FILE) as f:
            return f.read(256).decode("utf-8", "replace").strip() or None

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

    def write_bytes(self, rel: str | os.PathLike, data: bytes) -> None:
        with self.replace(rel, "wb") as f:
            f.write(data)

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

    @contextlib.contextmanager
    def staged_files(self, prefix: str = ".staging") -> Iterator[Path]:
        """A fresh directory inside this one for writers that take a path (pandas, matplotlib, torch):
        they write under the yielded ``/proc/self/fd/N``, which resolves from the open directory
        whatever is renamed or planted meanwhile. On a clean exit every file written there is moved
        over its name here (each name absent or a regular file: rule 2); on a failure nothing here
        changes. Either way the staging directory is removed; an error names the output's path.

        For a directory of files only (a claimed one): what a killed run left (``PREFIX.*``) is
        removed first, and every other entry must be a regular file, checked before the work starts
        (a link planted since the last run is named then, not after the work)."""
        for entry in self.names():
            if entry.startswith(f"{prefix}."):
                self.remove(entry)
        self.check_files(self.names())
        name = f"{prefix}.{secrets.token_hex(4)}"
        with self.mkdir_fresh(name) as staged:
            proc = f"/proc/self/fd/{staged.fd}"
            try:
                try:
                    yield Path(proc)
                except OSError as e:
                    shown = str(e.filename or "").replace(proc, str(self.path), 1) or str(self.path)
                    raise (
                        _named(OSError(e.errno, e.strerror), shown)
                        if e.filename is None
                        else OSError(e.errno, e.strerror, shown)
                    ) from None
                for entry in staged.names():
                    what = staged.kind(entry)
                    if what != "a regular file":
                        raise UnsafePathError(
                            f"{self.shown(entry)}: the command wrote {what} there, not a file; nothing was published"
                        )
                    staged.replace_entry(entry, self, entry)
            finally:
                self.remove(name)

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


def open_regular(path: str | os.PathLike, flag: str = "") -> BinaryIO:
    """``path`` opened for reading if it is a regular file (links followed: the user named it); a
    FIFO, device, socket or directory is refused (UnsafePathError) without blocking on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise UnsafePathError(
            f"{flag + ' ' if flag else ''}{path}: is a directory, not a regular file"
        ) from None
    return _regular(fd, path, flag)


# ---------------------------------------------------------------------------- one output file
def check_output_path(path: str | os.PathLike, flag: str = "--out") -> None:
    """Before a command works: ``path`` can become the output file (absent or a regular file, not a
    link; not under a file). One line naming what is wrong otherwise."""
    path = Path(path)
    if _blocker(path.parent) is not None:
        raise OutputDir._not_a_dir(path.parent, flag, named=path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        what = kind_of(st.st_mode)
        advice = "remove the link" if stat.S_ISLNK(st.st_mode) else "give the path of a file to write"
        raise UnsafePathError(f"{flag} {path}: is {what}; only a regular file is ever replaced: {advice}")


def write_file(path: str | os.PathLike, data: bytes | str, flag: str = "--out") -> None:
    """Replace the output file ``path`` atomically (its directory created when missing), by the rules."""
    path = Path(path)
    check_output_path(path, flag)
    with OutputDir.open(path.parent, create=True, flag=flag) as out:
        if isinstance(data, str):
            out.write_text(path.name, data)
        else:
            out.write_bytes(path.name, data)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "w", *, tmp: str | None = None, **open_kwargs: Any
) -> Iterator[IO]:
    """Open a temp file in ``path``'s folder for writing (``mode`` "w" or "wb"; text defaults to
    UTF-8); on a clean exit flush, fsync and rename it over ``path``. ``tmp``: the temp file's name
    (a fixed name that a reader knows, e.g. rpg-eval's run.json.tmp); default a unique
    ``NAME.XXXXXXXX.tmp``. The folder is the caller's (opened as named); at ``path`` a link is
    replaced by the file (the link itself, never written through), a device, FIFO, socket or
    directory is refused."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode: atomic_write writes whole files ('w' or 'wb'), got {mode!r}")
    path = Path(path)
    with OutputDir.open(path.parent, flag="") as out:
        out.path = path.parent
        with out.replace(path.name, mode, tmp=tmp, replace_link=True, **open_kwargs) as f:
            yield f


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


__all__ = [
    "OWNER_FILE", "LockedError", "OutputDir", "RunLock", "UnsafePathError", "atomic_write", "check_output_path",
    "kind_of", "lock_holder", "open_regular", "write_file",
]  # fmt: skip
