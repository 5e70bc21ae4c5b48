"""One run per checkpoint directory: ``rpg-train`` holds ``<ckpt.path>/rpg_run.lock`` (``filelock``) for its
whole life; the kernel drops it when the driver dies (SIGKILL included), so a killed run blocks nothing.

The lock is also the fence of the run's trainer: the driver writes a token into the lock file and hands
it to the trainer in the args (:data:`TOKEN_KEY`); before it begins or commits a checkpoint the trainer
checks that the lock is still held with that token (:func:`fence`). A driver that stops (SIGTERM,
Ctrl-C: :func:`release_all` first) or dies leaves its Ray workers running for a moment; they commit no
further step.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import set_value
from rpg_openrlhf.common.atomic import UnsafePathError

LOCK_FILE = "rpg_run.lock"
#: In the args the trainer gets: the token the driver wrote into the lock file.
TOKEN_KEY = "ckpt.rpg_run_lock"
FLAG = "--ckpt.path"
#: The locks this process holds (lock file -> (lock, token)): a second prepare of the same run in one
#: process (tests) keeps the lock it has.
_HELD: dict[str, tuple[FileLock, str]] = {}


class RunStopped(RuntimeError):
    """The driver that started this trainer no longer holds the run's lock: nothing more is written."""


def acquire(args: Any, run_dir: str | Path) -> None:
    """Hold the run's lock for the life of this process (UnsafePathError naming the holder's pid when
    another process holds it); the trainer's token goes into ``args``."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    path = str((Path(run_dir) / LOCK_FILE).resolve())
    if path not in _HELD or not _HELD[path][0].is_locked:
        lock = FileLock(path, timeout=0, thread_local=False)  # released by any thread (a signal's)
        try:
            lock.acquire()
        except Timeout:  # the holder's pid (the first number: today's JSON and older locks alike)
            pid = (re.findall(r"\d+", Path(path).read_text(errors="replace")[:200]) or ["?"])[0]
            raise UnsafePathError(f"{FLAG} {run_dir}: another rpg-train run (pid {pid}) holds {run_dir}; wait for it or use another {FLAG}") from None  # fmt: skip
        token = secrets.token_hex(8)
        Path(path).write_text(json.dumps({"pid": os.getpid(), "token": token}))  # the lock is on the inode
        _HELD[path] = (lock, token)
    set_value(args, TOKEN_KEY, _HELD[path][1])


def release_all() -> None:
    """The driver stops: release every run lock (its trainer then commits nothing more)."""
    for lock, _ in _HELD.values():
        lock.release(force=True)
    _HELD.clear()


def _holder_token(path: Path) -> str | None:
    """The token in the lock file at ``path`` while a process holds it; None when none does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it exclusively
    except BlockingIOError:
        try:
            return json.loads(os.pread(fd, 4096, 0).decode("utf-8")).get("token")
        except (ValueError, AttributeError):
            return None
    finally:
        os.close(fd)


def fence(args: Any) -> None:
    """In the trainer, before a checkpoint is begun or committed: RunStopped when the run's driver no
    longer holds the lock with the token it handed over (no token: a run that took no lock)."""
    token = _get(args, TOKEN_KEY)
    if token is None:
        return
    path = Path(_get(args, "ckpt.path")) / LOCK_FILE
    if _holder_token(path) != token:
        raise RunStopped(
            f"{FLAG} {path.parent}: the rpg-train run that started this trainer no longer holds {LOCK_FILE} "
            "(it stopped or died); no further checkpoint is written"
        )
