"""The write policy (rpg_openrlhf/common/writes.py, issue 38): every hazard planted where a command writes
(a link below the output directory, before and while a file is written; a link, FIFO, socket, device or
directory at a file's name; a directory the command neither created nor marked; a second writer; a full
disk) is refused or survived, and nothing lands outside the output directory. The commands' own tests
(checkpoints, rpg-mechanisms, the probe, the node check) plant the same hazards through their writers."""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpg_openrlhf.common import writes
from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.writes import LockedError, OutputDir, UnsafePathError


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep\n")
    return outside


def _untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "keep\n"


def _special(kind: str, path: Path) -> None:
    """A FIFO, a socket or a character device (like /dev/null: 1, 3) at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    else:
        path.mkdir()


# ----------------------------------------------------------------------------- rule 1: no link followed
@pytest.mark.parametrize("where", ["target", "parent", "grandparent"])
def test_a_link_below_the_output_dir_receives_nothing(tmp_path: Path, where: str) -> None:
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    (out / "a" / "b").mkdir(parents=True)
    planted = {"target": out / "a" / "b" / "victim.txt", "parent": out / "a" / "b", "grandparent": out / "a"}[
        where
    ]
    if planted.is_dir():
        planted.rmdir() if where == "parent" else __import__("shutil").rmtree(planted)
    planted.symlink_to(outside / "victim.txt" if where == "target" else outside)
    with OutputDir.open(out) as od, pytest.raises(UnsafePathError, match="is a symbolic link") as info:
        od.write_text("a/b/victim.txt", "overwritten\n")
    assert str(planted) in str(info.value) and "\n" not in str(info.value)
    _untouched(outside)


def test_a_link_planted_while_the_file_is_written_receives_nothing(tmp_path: Path) -> None:
    """The directory is swapped for a link after the write began: the file still lands in the directory
    the write opened (moved aside), never through the link."""
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    with OutputDir.open(out) as od, od.replace("sub/victim.txt") as f:
        f.write("new\n")
        (out / "sub").rename(out / "moved")
        (out / "sub").symlink_to(outside)
    _untouched(outside)
    assert (out / "moved" / "victim.txt").read_text() == "new\n"


def test_subdir_and_kind_never_follow_a_link(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "d").symlink_to(outside)
    with OutputDir.open(out) as od:
        assert od.kind("d") == "a symbolic link"
        with pytest.raises(UnsafePathError, match="d: is a symbolic link"):
            od.subdir("d")
        with pytest.raises(UnsafePathError):
            od.kind("d/victim.txt")
        od.remove("d")  # the link itself, not what it points to
    assert not (out / "d").exists()
    _untouched(outside)


# ----------------------------------------------------------------------------- rule 2: regular files only
@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "directory"])
def test_only_a_regular_file_is_replaced(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = out / "report.json"
    _special(kind, target)
    before = os.lstat(target)
    with OutputDir.open(out) as od, pytest.raises(UnsafePathError, match=r"report\.json: is a"):
        od.write_text("report.json", "{}")
    with pytest.raises(UnsafePathError, match=r"report\.json: is a"), atomic_write(target) as f:
        f.write("{}")
    with pytest.raises(UnsafePathError, match=r"--out .*report\.json: is a"):
        writes.write_file(target, "{}")
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]  # no temp file left


@pytest.mark.timeout(60)  # a read that blocks on the FIFO fails here instead of hanging the suite
def test_a_fifo_is_refused_for_reading_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "sync_00001.pt"
    os.mkfifo(fifo)
    with pytest.raises(UnsafePathError, match="is a FIFO"):
        writes.open_regular(fifo)  # a plain open() would wait for a writer forever
    with (
        OutputDir.open(tmp_path) as od,
        pytest.raises(UnsafePathError, match="is a FIFO"),
        od.open_file(fifo.name),
    ):
        pass


@pytest.mark.parametrize("where", ["under_a_file", "is_a_dir", "is_a_link"])
def test_output_file_checked_before_any_work(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    path = {"under_a_file": tmp_path / "file" / "out.json", "is_a_dir": tmp_path / "dir",
            "is_a_link": tmp_path / "link"}[where]  # fmt: skip
    with pytest.raises(UnsafePathError) as info:
        writes.check_output_path(path, "--out")
    message = str(info.value)
    assert message.startswith(f"--out {path}: ") and "\n" not in message
    assert {"under_a_file": "is a regular file, so nothing", "is_a_dir": "is a directory",
            "is_a_link": "is a symbolic link"}[where] in message  # fmt: skip
    assert (tmp_path / "file").read_text() == "x"


# ----------------------------------------------------------------------------- rule 3: created or marked
def test_claim_takes_only_a_new_empty_or_own_directory(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("the project's\n")
    with pytest.raises(UnsafePathError, match=r"holds README\.md and no \.rpg-owner naming rpg-x"):
        OutputDir.claim(project, "rpg-x")
    assert sorted(p.name for p in project.iterdir()) == ["README.md"]  # nothing was changed
    with OutputDir.claim(tmp_path / "new" / "out", "rpg-x") as od:  # created now
        od.write_text("README.md", "mine\n")
    with OutputDir.claim(tmp_path / "new" / "out", "rpg-x") as od:  # marked by the same command
        assert od.owner() == "rpg-x"
    with pytest.raises(UnsafePathError, match="written by rpg-x"):
        OutputDir.claim(tmp_path / "new" / "out", "rpg-y")
    (tmp_path / "empty").mkdir()
    OutputDir.claim(tmp_path / "empty", "rpg-y").close()
    assert (tmp_path / "empty" / writes.OWNER_FILE).read_text() == "rpg-y\n"


# ----------------------------------------------------------------------------- rule 4: atomic, and names the file
def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the write fail as a full disk does (EFBIG instead of ENOSPC)."""
    target = tmp_path / "out" / "metrics.json"
    target.parent.mkdir()
    target.write_text("old\n")
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        from rpg_openrlhf.common.writes import write_file
        try:
            write_file({str(target)!r}, "x" * 100_000)
        except OSError as e:
            print(e.errno, e.filename)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == [str(errno.EFBIG), str(target)], proc.stdout + proc.stderr
    assert target.read_text() == "old\n" and sorted(p.name for p in target.parent.iterdir()) == [
        "metrics.json"
    ]


# ----------------------------------------------------------------------------- one writer per directory
_HOLD = """
import sys, time
from rpg_openrlhf.common.writes import OutputDir
lock = OutputDir.open(sys.argv[1]).lock(".lock", "test run")
print("held", flush=True)
time.sleep(600)
"""


def test_one_writer_per_directory_released_when_the_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        info = writes.lock_holder(tmp_path / ".lock")
        assert info is not None and info["pid"] == holder.pid
        with OutputDir.open(tmp_path, flag="--dir") as od, pytest.raises(LockedError) as refused:
            od.lock(".lock", "test run")
        message = str(refused.value)
        assert f"pid {holder.pid} on " in message and message.startswith(
            f"--dir {tmp_path}: in use by another test run"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert writes.lock_holder(tmp_path / ".lock") is None  # the kernel released it
    with OutputDir.open(tmp_path) as od:
        lock = od.lock(".lock", "test run")
        assert writes.lock_holder(tmp_path / ".lock")["token"] == lock.token
        lock.release()


def test_a_lock_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(outside / "victim.txt")
    with OutputDir.open(run) as od, pytest.raises(UnsafePathError, match="is a symbolic link"):
        od.lock(".lock", "test run")
    _untouched(outside)
