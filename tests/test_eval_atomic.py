"""rpg_openrlhf.common.atomic.atomic_write, the one tmp + fsync + rename of the project: the target is the
old file or the new one, never half; a failure removes the temp file and keeps the old one."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpg_openrlhf.common.atomic import atomic_write


def test_writes_text_and_bytes_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "t.csv"
    with atomic_write(target, newline="") as f:
        f.write("a,é\r\n")
    assert target.read_bytes() == "a,é\r\n".encode()
    with atomic_write(target, "wb", tmp="t.csv.tmp") as f:
        f.write(b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


@pytest.mark.parametrize("tmp", [None, "fixed.tmp"])
def test_a_failure_keeps_the_old_file_and_removes_the_temp_file(tmp_path: Path, tmp: str | None) -> None:
    target = tmp_path / "run.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="disk"), atomic_write(target, tmp=tmp) as f:
        f.write("half of the new")
        assert target.read_text() == "old\n"  # nothing visible before the rename
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_only_whole_file_modes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^mode: .*'a'"), atomic_write(tmp_path / "x", "a"):
        pass
