"""Committed benchmark results read the same in any clone: no absolute path of the machine that ran them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from benchlib import portable, write_json  # noqa: E402


def test_paths_are_written_relative_to_the_repository(tmp_path: Path) -> None:
    payload = {
        "args": {"data_dir": str(REPO.parent / "shared" / "data"), "json": "/elsewhere/out/x.json", "n": 3},
        "rows": [{"model": str(REPO / "runs" / "m"), "note": "a/b"}],
    }
    write_json(str(tmp_path / "r.json"), payload)
    assert json.loads((tmp_path / "r.json").read_text()) == {
        "args": {"data_dir": "../shared/data", "json": "x.json", "n": 3},
        "rows": [{"model": "runs/m", "note": "a/b"}],
    }
    assert portable(Path("/elsewhere/y.csv")) == "y.csv"


def test_no_committed_result_holds_an_absolute_path() -> None:
    files = subprocess.run(
        ["git", "ls-files", "bench/results"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        data = json.loads((REPO / name).read_text())
        assert portable(data) == json.loads(json.dumps(data)), f"{name} holds an absolute path"
