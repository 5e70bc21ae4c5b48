"""Committed benchmark results read the same in any clone: no absolute path of the machine that ran them."""

from __future__ import annotations

import json
import re
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


# An absolute path in a committed text file: "/word/word" after a quote, space, bracket or '=' (URLs have ':').
ABSOLUTE = re.compile(r"(?:^|[\s\"'=(\[`])/[A-Za-z_][\w.-]*/[\w.-]+", re.M)


def test_no_committed_text_under_results_holds_an_absolute_path() -> None:
    """results/ (the demo's run.json and samples.jsonl above all) reads the same in any clone."""
    assert ABSOLUTE.search('{"path": "/home/me/run/ckpt"}') and not ABSOLUTE.search(
        '{"path": "../../work/x", "u": "https://a/b"}'
    )
    files = subprocess.run(
        ["git", "ls-files", "results", "bench/results"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert any(name.endswith("samples.jsonl") for name in files)
    for name in files:
        data = (REPO / name).read_bytes()
        if b"\0" in data[:4096]:
            continue  # images, TensorBoard event files
        m = ABSOLUTE.search(data.decode("utf-8", "replace"))
        assert m is None, f"{name} holds an absolute path: {m.group(0).strip()!r}"
