"""Guarantee 4 (docs/contracts.md, "Threat model"): every file is written atomically.

``atomic_write`` (rpg_openrlhf/common/atomic.py, used by every command): a temp file in the same
folder, then ``os.replace``. A failure at any point (an exception in the writer, a full disk, a
read-only folder) leaves the old file byte for byte, no temp file behind, and an error naming the
file the user knows, not the temp file. A folder a command made and left without a result (a full
disk at its first file) is removed. Records: append-only, a torn last line repaired on resume
(tests/test_eval_records.py, tests/test_eval_records_sigkill.py); checkpoints: marker after the save
(tests/test_checkpoint_commit.py, tests/test_e2e_preemption.py).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rpg_openrlhf.common import atomic
from rpg_openrlhf.common.atomic import UnsafePathError, atomic_write, output_dir, write_file

OLD = b"the old file\n"


def _names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_the_new_file_replaces_the_old_one_whole(tmp_path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(OLD)
    with atomic_write(path) as f:
        f.write("new ")
        assert path.read_bytes() == OLD  # readers see the old file until the rename
        f.write("text é")
    assert path.read_text(encoding="utf-8") == "new text é" and _names(tmp_path) == ["f.json"]


@pytest.mark.parametrize("failure", ["exception", "full disk"])
def test_a_failure_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch, failure) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(OLD)
    if failure == "full disk":

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises((OSError, RuntimeError)) as e, atomic_write(path, "wb") as f:
        f.write(b"half of the new")
        if failure == "exception":
            raise RuntimeError("the writer failed")
    assert path.read_bytes() == OLD and _names(tmp_path) == ["f.bin"]
    if failure == "full disk":
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)


def test_a_read_only_folder_is_named_by_the_file_not_its_temp_file(tmp_path, monkeypatch) -> None:
    """The temp file's open fails as in a read-only folder (EACCES names the temp file; root would
    write into a chmod 555 folder, so the failure is the kernel's answer replayed)."""
    real_open = open

    def refuse(path, *args, **kwargs):
        if Path(path).parent == tmp_path / "ro":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(PermissionError) as e:
        write_file(tmp_path / "ro" / "out.json", "{}")
    assert e.value.filename == str(tmp_path / "ro" / "out.json") and _names(tmp_path / "ro") == []


def test_a_fixed_temp_name_a_reader_knows(tmp_path) -> None:
    """rpg-eval's run.json.tmp: a leftover of a killed writer is overwritten, not in the way."""
    path = tmp_path / "run.json"
    (tmp_path / "run.json.tmp").write_text("a killed writer's")
    with atomic_write(path, tmp="run.json.tmp") as f:
        f.write("{}")
    assert path.read_text() == "{}" and _names(tmp_path) == ["run.json"]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_only_a_regular_file_or_a_link_is_replaced(tmp_path, kind) -> None:
    path = tmp_path / "x"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(UnsafePathError, match="FIFO" if kind == "fifo" else "directory"), atomic_write(path):
        pass
    assert _names(tmp_path) == ["x"]


def test_a_folder_made_for_a_failed_command_is_not_left_behind(tmp_path) -> None:
    """A full disk at the first result file: the output folder this call made is removed."""
    out = tmp_path / "new" / "out"
    with pytest.raises(OSError), output_dir(out, "rpg-eval table") as d:
        assert (d / ".rpg-owner").read_text() == "rpg-eval table\n"
        raise OSError(errno.ENOSPC, "No space left on device", str(d / "t.md"))
    assert not out.exists()
    existing = tmp_path / "mine"
    existing.mkdir()
    with pytest.raises(OSError), output_dir(existing, "rpg-eval table"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert existing.is_dir()  # not made by this call: kept
