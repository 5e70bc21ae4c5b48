"""The node check's ``--report DIR`` on a hostile directory: a planted pickle in ``sync/`` is refused,
never run (issue 31, item 1); a malformed ``run.json``, no ``log.txt``, an ``--out`` that is a file and
bad arguments are one line each, exit 2. Reads a fake run directory only: no Ray, no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_nodecheck import REPO, fake_run


class Planted:
    """Unpickling this calls ``open(path, "w")``: the file appears if the loader runs pickled code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def nodecheck(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rpg_openrlhf.nodecheck", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("rpg-nodecheck: error: "), proc.stderr
    return lines[0]


def test_planted_pickle_in_sync_is_not_run(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    created = tmp_path / "created-by-the-pickle"
    torch.save({"sync": 9, "actor": [Planted(created)], "engines": []}, run / "sync" / "sync_00009.pt")
    line = one_error_line(nodecheck("--report", str(run)))
    assert not created.exists(), "the planted pickle ran"
    assert "sync_00009.pt" in line and "Traceback" not in line
    assert "still be loaded" not in line and "weights_only" not in line, (
        line
    )  # not torch's advice to load it anyway


@pytest.mark.parametrize("name", ["sync/sync_00009.pt", "log.txt", "memory.json"])
def test_a_fifo_in_the_report_directory_is_one_line_not_a_hang(tmp_path: Path, name: str) -> None:
    """Issue 38: a FIFO named like a sync record (or the log) was opened for reading and waited forever."""
    run = fake_run(tmp_path / "run")
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    line = one_error_line(nodecheck("--report", str(run)))  # nodecheck()'s timeout fails a hang
    assert f"{run / name}: is a FIFO" in line, line


def test_malformed_run_json_and_missing_log(tmp_path: Path) -> None:
    for body in ("{not json", "[1, 2]"):
        run = fake_run(tmp_path / f"run{len(body)}")
        (run / "run.json").write_text(body)
        assert "run.json" in one_error_line(nodecheck("--report", str(run)))
    run = fake_run(tmp_path / "nolog")
    (run / "log.txt").unlink()
    assert "no log.txt" in one_error_line(nodecheck("--report", str(run)))


def test_out_is_a_file_and_argument_errors_are_one_line(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    assert "is a regular file" in one_error_line(nodecheck("--out", str(file)))
    assert "--gpus" in one_error_line(nodecheck("--gpus", "0"))
    assert "--steps" in one_error_line(nodecheck("--steps", "0"))
    assert "unrecognized arguments" in one_error_line(nodecheck("--nope"))
