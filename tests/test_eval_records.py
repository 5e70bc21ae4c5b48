"""Guarantee 6 for rpg-eval's own files (docs/contracts.md, "Threat model"): a damaged record, input line
or run.json is one line ``rpg-eval: error: FILE[:LINE]: ...`` naming the field, exit 2, nothing
written; never a Python error without the place (``int('abc')``, a list as a problem id, a NaN
verdict, a 5,000-digit number, 100,000 nested arrays). No model loads: ``run`` is refused before one
would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary", "--data-dir", str(REPO.parent / "shared" / "data")]  # fmt: skip
BIG = "1" * 5000  # beyond Python's 4,300-digit limit for int(str)


def _error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-eval: error:") and "Traceback" not in err, err
    return lines[0]


def _record(j: int) -> dict:
    return {"run": "r", "checkpoint": "global_step1_hf", "step": 1, "benchmark": "aime24", "problem_id": "p",
            "problem_index": 0, "sample_index": j, "prompt_style": "boxed", "gold": "1", "response": "\\boxed{1}",
            "extracted": {"math_verify": "1", "paper": None}, "correct": {"math_verify": True, "paper": False},
            "seed": 0, "sampling": {"n": 2}}  # fmt: skip


def _with(**fields: object) -> str:
    return json.dumps({**_record(1), **fields})  # json.dumps writes NaN


# the second line of a samples.jsonl -> what the refusal names
DAMAGE = {
    "step is text": (_with(step="abc"), "'step'"),
    "problem id a list": (_with(problem_id=[1]), "'problem_id'"),
    "NaN verdict": (_with(correct={"math_verify": float("nan"), "paper": False}), "'correct'"),
    "sample index negative": (_with(sample_index=-1), "'sample_index'"),
    "5,000 digits": (_with(sample_index=0).replace('"sample_index": 0', f'"sample_index": {BIG}'), "'sample_index'"),
    "100,000 nested arrays": ("[" * 100_000 + "]" * 100_000, "nested"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_record_names_file_line_and_field(tmp_path: Path, capsys, case: str) -> None:
    line, field = DAMAGE[case]
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(_record(0)) + "\n" + line + "\n")
    assert cli_main(["summarize", str(path), "--iters", "10"]) == 2
    msg = _error_line(capsys.readouterr().err)
    assert f"{path}:2" in msg and field in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]


def test_a_5000_digit_gold_is_graded_as_its_digits(tmp_path: Path, capsys) -> None:
    """rpg-eval score keeps it as text (100,000 nested arrays there: the table above, read alike)."""
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"response": "\\boxed{1}", "gold": "1"}) + '\n{"response": "x", "gold": ' + BIG + "}\n"
    )
    out = tmp_path / "scored.jsonl"
    assert cli_main(["score", str(path), "--out", str(out)]) == 0
    assert [json.loads(x)["gold"] for x in out.read_text().splitlines()] == ["1", BIG]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"settings": []}, "'settings'"),
        ({"checkpoints": {"global_step10_hf": 5}}, "'checkpoints.global_step10_hf'"),
        ({"checkpoints": {"global_step10_hf": {"path": "x", "step": "10", "sha256": "0"}}}, "step"),
        ("{not json", "invalid JSON"),
    ],
)
def test_run_json_with_wrong_types_is_one_line(tmp_path: Path, capsys, change, named: str) -> None:
    out, ckpt = tmp_path / "run", tmp_path / "c" / "global_step10_hf"  # no model loads from ckpt
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    out.mkdir()
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}
    (out / "run.json").write_text(change if isinstance(change, str) else json.dumps({**meta, **change}))
    before = (out / "run.json").read_bytes()
    rc = cli_main(["run", "--checkpoints", str(ckpt.parent), "--out", str(out), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and str(out / "run.json") in line and named in line
    assert os.listdir(out) == ["run.json"] and (out / "run.json").read_bytes() == before
