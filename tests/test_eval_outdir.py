"""The output directory of ``rpg-eval run`` (rpg_eval.outdir): a damaged run.json of the right format
is one line naming the field (issue #19 item 7). No model is needed: the run is refused before one
loads. (Links planted inside --out are out of scope: docs/contracts.md, "Threat model".)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary", "--data-dir", str(DATA)]  # fmt: skip
VICTIM = b"precious bytes outside --out\n"


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), err
    return lines[0]


def _fake_ckpt(root: Path) -> Path:
    """A directory find_checkpoints accepts but no model loads from (the run must stop before)."""
    d = root / "global_step10_hf"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return root


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(VICTIM)
    return v


def _run_dir(tmp_path: Path) -> Path:
    """A directory a run wrote: run.json of this format (no records yet)."""
    out = tmp_path / "run"
    out.mkdir()
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}
    (out / "run.json").write_text(json.dumps(meta))
    return out


# --------------------------------------------------------------------------- item 7: damaged run.json


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"settings": []}, "'settings'"),
        ({"checkpoints": {"global_step10_hf": 5}}, "'checkpoints.global_step10_hf'"),
        ({"data": {"aime24": "aime24.jsonl"}}, "'data.aime24'"),
        ({"checkpoints": {"global_step10_hf": {"path": "x", "step": "10", "sha256": "0"}}}, "step"),
    ],
)
def test_run_json_with_wrong_types_is_one_line(tmp_path: Path, capsys, change: dict, named: str) -> None:
    out = _run_dir(tmp_path)
    meta = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**meta, **change}))
    before = (out / "run.json").read_bytes()
    rc = cli_main(["run", "--checkpoints", str(_fake_ckpt(tmp_path / "c")), "--out", str(out), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and str(out / "run.json") in line and named in line
    assert (out / "run.json").read_bytes() == before
