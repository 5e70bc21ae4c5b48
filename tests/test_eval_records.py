"""rpg_eval.records read by summaries and ``rpg-eval score``: a damaged record or input line is one
line ``rpg-eval: error: FILE:LINE: ...`` naming the field (issue #19 item 7), never a Python error
without the place (``int('abc')``, ``None`` as a run name, a list as a problem id, a NaN verdict,
a 5,000-digit number, 100,000 nested arrays)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main


def _error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-eval: error:") and "Traceback" not in err, err
    return lines[0]


def _record(j: int) -> dict:
    return {"run": "r", "checkpoint": "global_step1_hf", "step": 1, "benchmark": "aime24", "problem_id": "p",
            "problem_index": 0, "sample_index": j, "prompt_style": "boxed", "gold": "1", "response": "\\boxed{1}",
            "extracted": {"math_verify": "1", "paper": None}, "correct": {"math_verify": True, "paper": False},
            "seed": 0, "sampling": {"n": 2}}  # fmt: skip


DAMAGE = {
    "step is text": (lambda r: r.update(step="abc"), "'step'"),
    "paper verdict null": (lambda r: r["correct"].update(paper=None), "'correct.paper'"),
    "run null": (lambda r: r.update(run=None), "'run'"),
    "problem id a list": (lambda r: r.update(problem_id=[1]), "'problem_id'"),
    "NaN verdict": (lambda r: r["correct"].update(math_verify=float("nan")), "'correct.math_verify'"),
    "sample index negative": (lambda r: r.update(sample_index=-1), "'sample_index'"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_record_names_file_line_and_field(tmp_path: Path, capsys, case: str) -> None:
    damage, field = DAMAGE[case]
    bad = _record(1)
    damage(bad)
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(_record(0)) + "\n" + json.dumps(bad) + "\n")  # json.dumps writes NaN
    assert cli_main(["summarize", str(path), "--iters", "10"]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"{path}:2" in line and field in line, line
    assert not (tmp_path / "summary.csv").exists()


BIG = "1" * 5000  # beyond Python's 4,300-digit limit for int(str)


def test_hostile_json_in_records_names_file_and_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "samples.jsonl"
    big = json.dumps(_record(1)).replace('"sample_index": 1', f'"sample_index": {BIG}')
    for line, words in ((big, ("'sample_index'",)), ("[" * 100_000 + "]" * 100_000, ("nested",))):
        path.write_text(json.dumps(_record(0)) + "\n" + line + "\n")
        assert cli_main(["summarize", str(path)]) == 2
        msg = _error_line(capsys.readouterr().err)
        assert f"{path}:2" in msg and all(w in msg for w in words), msg


def test_hostile_json_in_score_input(tmp_path: Path, capsys) -> None:
    """A 5,000-digit integer gold is graded like any gold (kept as its digits); 100,000 nested
    arrays are one line naming the file and line."""
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps({"response": "\\boxed{1}", "gold": "1"})
        + "\n"
        + '{"response": "x", "gold": '
        + BIG
        + "}\n"
    )
    out = tmp_path / "scored.jsonl"
    assert cli_main(["score", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    assert [json.loads(x)["gold"] for x in out.read_text().splitlines()] == ["1", BIG]
    path.write_text(json.dumps({"response": "\\boxed{1}", "gold": "1"}) + "\n" + "[" * 100_000 + "\n")
    assert cli_main(["score", str(path)]) == 2
    msg = _error_line(capsys.readouterr().err)
    assert f"{path}:2" in msg and "nested" in msg, msg
