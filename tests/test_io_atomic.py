"""Guarantee 4 (docs/contracts.md, "Threat model"): every file is written atomically.

``atomic_write`` (rpg_openrlhf/common/atomic.py, used by every command): a temp file in the same
folder, then ``os.replace``. A failure at any point (an exception in the writer, a full disk, a
read-only folder) leaves the old file byte for byte, no temp file behind, and an error naming the
file the user knows; a folder a command made and left without a result is removed. Records:
tests/test_eval_records_sigkill.py; checkpoints: the checkpoint tests.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from rpg_openrlhf.common import atomic
from rpg_openrlhf.common.atomic import UnsafePathError, atomic_write, check_dir, output_dir

OLD = b"the old file\n"


def _full(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _read_only(real_open):
    """The kernel's answer to a temp file in a read-only folder, replayed (root writes chmod 555)."""

    def refuse(path, *args, **kwargs):
        if Path(path).parent.name == "ro":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)

    return refuse


@pytest.mark.parametrize("failure", [None, "exception", "full disk", "read-only"])
def test_the_new_file_replaces_the_old_one_whole_or_not_at_all(tmp_path, monkeypatch, failure) -> None:
    """Readers see the old file until the rename; a failure keeps it byte for byte, leaves no temp file
    and names the file (not the temp file)."""
    path = tmp_path / "ro" / "f.json"
    path.parent.mkdir()
    path.write_bytes(OLD)
    if failure == "full disk":
        monkeypatch.setattr(atomic.os, "fsync", _full)
    if failure == "read-only":
        monkeypatch.setattr("builtins.open", _read_only(open))
    raises = pytest.raises((OSError, RuntimeError)) if failure else contextlib.nullcontext()
    with raises as e, atomic_write(path) as f:
        f.write("new ")
        assert path.read_bytes() == OLD
        f.write("text é")
        if failure == "exception":
            raise RuntimeError("the writer failed")
    assert path.read_bytes() == (OLD if failure else "new text é".encode()) and os.listdir(path.parent) == [
        "f.json"
    ]
    if failure in ("full disk", "read-only"):
        assert e.value.filename == str(path) and e.value.errno in (errno.ENOSPC, errno.EACCES)


def test_a_folder_made_for_a_failed_command_is_not_left_behind(tmp_path) -> None:
    """A full disk at the first result file: the output folder this call made is removed, one it did not make is kept."""
    out = tmp_path / "new" / "out"
    with pytest.raises(OSError), output_dir(out, "rpg-eval table") as d:
        assert (d / ".rpg-owner").read_text() == "rpg-eval table\n"
        raise OSError(errno.ENOSPC, "No space left on device", str(d / "t.md"))
    assert not out.exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(OSError), output_dir(tmp_path / "mine", "rpg-eval table"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (tmp_path / "mine").is_dir()


def test_a_killed_writers_temp_file_and_lock_leave_a_folder_empty(tmp_path) -> None:
    """A run SIGKILLed before its first file leaves its lock and a temp file: the next run takes the folder."""
    (tmp_path / ".lock").write_text("123\n")
    (tmp_path / ".run.json.1a2b3c4d.tmp").write_text("{")
    (tmp_path / "run.json.tmp").write_text("{")  # the fixed temp name of today's rpg-eval run
    check_dir(tmp_path, "rpg-eval run")
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(UnsafePathError, match="notes.txt"):
        check_dir(tmp_path, "rpg-eval run")
