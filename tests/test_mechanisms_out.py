"""``rpg-mechanisms --out`` (issue 38, item 4 and the one-line errors): a directory it did not write
(``--out .`` with a project's README.md) is refused before anything runs; a file or a path under a
file is one line. The experiments are
replaced by a stand-in writing two files through the path it is given (test_mechanisms runs the real
ones through the same staging)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rpg_openrlhf.common.atomic import LOCK_FILE, OWNER_FILE
from rpg_openrlhf.mechanisms import run


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "README.md").write_text("the user's own\n")
    return outside


@pytest.fixture
def stand_in(monkeypatch):
    """run._run_all writes README.md and a CSV where it is told; ``during`` runs in the middle."""
    calls = {"during": lambda out: None, "ran": 0}

    def fake(out: Path, quick: bool, seeds: int | None) -> dict:
        calls["ran"] += 1
        (out / "exp1.csv").write_text("a,b\n1,2\n")
        calls["during"](out)
        (out / "README.md").write_text("mechanisms\n")
        return {"timings": pd.DataFrame([{"cpu": 0.0}])}

    monkeypatch.setattr(run, "_run_all", fake)
    return calls


def test_a_directory_it_did_not_write_is_refused_untouched(tmp_path: Path, stand_in, capsys) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("the project's\n")
    with pytest.raises(SystemExit) as info:
        run.main(["--out", str(project), "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "holds README.md and no .rpg-owner" in err[0], err
    assert sorted(p.name for p in project.iterdir()) == ["README.md"] and stand_in["ran"] == 0
    assert (project / "README.md").read_text() == "the project's\n"


def test_a_new_directory_then_the_same_again(tmp_path: Path, stand_in) -> None:
    out = tmp_path / "new" / "mech"
    for _ in range(2):
        run.run_all(out, quick=True)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, OWNER_FILE, "README.md", "exp1.csv"]
    assert (out / "README.md").read_text() == "mechanisms\n" and stand_in["ran"] == 2


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_out_a_file_or_under_a_file_is_one_line(tmp_path: Path, where: str, stand_in, capsys) -> None:
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "mech"
    with pytest.raises(SystemExit) as info:
        run.main(["--out", str(out), "--quick"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        info.value.code == 2 and len(err) == 1 and err[0].startswith(f"rpg-mechanisms: error: --out {out}: ")
    ), err
    assert (
        "is a regular file, not a directory" if where == "file" else "nothing can be written under it"
    ) in err[0]
    assert (tmp_path / "f").read_text() == "x" and stand_in["ran"] == 0


def test_argument_errors_are_one_line() -> None:
    """No pynvml warning (torch is imported after the filter), no usage block."""
    proc = subprocess.run([sys.executable, "-m", "rpg_openrlhf.mechanisms.run", "--seeds", "0"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "rpg-mechanisms: error: argument --seeds: must be >= 1, got 0"
    ], proc.stderr
