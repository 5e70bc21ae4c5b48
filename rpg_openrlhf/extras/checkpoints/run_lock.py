"""One run per checkpoint directory: ``rpg-train`` holds ``<ckpt.path>/rpg_run.lock`` for its whole life.

Two runs on one ``--ckpt.path`` (a second start with another seed) rewrote each other's ``rpg_run.json``
and adopted each other's checkpoints. The driver takes an ``flock`` on :data:`LOCK_FILE` before Ray starts
(:func:`acquire`, from ``checkpoints.resume.prepare``) and keeps it until it exits; the kernel releases it
when the driver dies (SIGKILL included), so a killed run never leaves a stale lock. A second start is
refused with one line naming the holder (pid, host, start time).

The lock is also the fence of the run's trainer: the driver writes a token into the lock file and
hands it to the trainer in the args (:data:`TOKEN_KEY`); before it begins or commits a checkpoint the
trainer checks that the lock is still held with that token (:func:`fence`). A driver that stops
(SIGTERM, Ctrl-C: :func:`release_all` first) or dies leaves its Ray workers running for a moment; they
commit no further step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.args import get as _get
from rpg_openrlhf.common.args import set_value
from rpg_openrlhf.common.writes import OutputDir, RunLock, lock_holder

LOCK_FILE = "rpg_run.lock"
#: In the args the trainer gets: the token the driver wrote into the lock file.
TOKEN_KEY = "ckpt.rpg_run_lock"
FLAG = "--ckpt.path"
#: The locks this process holds, by the directory's (device, inode): a second prepare of the same
#: run in one process (tests) keeps the lock it has.
_HELD: dict[tuple[int, int], RunLock] = {}


class RunStopped(RuntimeError):
    """The driver that started this trainer no longer holds the run's lock: nothing more is written."""


def acquire(args: Any, run_dir: str | Path) -> None:
    """Hold the run's lock for the life of this process (LockedError naming the holder if another
    process holds it); the trainer's token goes into ``args``."""
    with OutputDir.open(run_dir, create=True, flag=FLAG) as out:
        st = os.fstat(out.fd)
        lock = _HELD.get((st.st_dev, st.st_ino))
        if lock is None or lock.fd < 0:
            lock = _HELD[(st.st_dev, st.st_ino)] = out.lock(LOCK_FILE, "rpg-train run")
    set_value(args, TOKEN_KEY, lock.token)


def release_all() -> None:
    """The driver stops: release every run lock (its trainer then commits nothing more)."""
    for lock in _HELD.values():
        lock.release()
    _HELD.clear()


def fence(args: Any) -> None:
    """In the trainer, before a checkpoint is begun or committed: RunStopped when the run's driver no
    longer holds the lock with the token it handed over (no token: a run that took no lock)."""
    token = _get(args, TOKEN_KEY)
    if token is None:
        return
    path = Path(_get(args, "ckpt.path")) / LOCK_FILE
    holder = lock_holder(path)
    if not holder or holder.get("token") != token:
        raise RunStopped(
            f"{FLAG} {path.parent}: the rpg-train run that started this trainer no longer holds {LOCK_FILE} "
            "(it stopped or died); no further checkpoint is written"
        )
