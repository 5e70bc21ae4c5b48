"""A lone surrogate in a record is read as U+FFFD instead of failing every later write; summarize
writes nothing when it fails. (Model output in the report stays text, "<!--<script>" included: the
page opened in a browser, tests/test_eval_report.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from test_eval_report import _records


def _runs(root: Path) -> tuple[list[Path], list[dict]]:
    """Two runs of test_eval_report's records; in each, responses "<!--<script>" and a lone
    surrogate (written as its JSON escape, the only way a record can hold one)."""
    dirs, records = [], []
    for run, shift in (("rpg", 0), ("grpo", 1)):
        made = _records(run, shift)
        made[0]["response"] = "Answer: 5 <!--<script>"
        made[1]["response"] = "Answer: 6 \ud800 end"
        (root / run).mkdir()
        (root / run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in made))
        dirs.append(root / run)
        records += made
    return dirs, records


def test_summarize_reads_a_lone_surrogate_as_a_replacement_character(tmp_path: Path) -> None:
    dirs, _ = _runs(tmp_path)
    assert cli_main(["summarize", str(dirs[0]), "--out", str(tmp_path / "sum")]) == 0
    dis = json.loads((tmp_path / "sum" / "disagreements.json").read_text(encoding="utf-8"))
    tails = [e["response_tail"] for k in ("examples_math_verify_only", "examples_paper_only") for e in dis[k]]
    assert "Answer: 6 \ufffd end" in tails, tails


def test_a_failing_summarize_leaves_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The third output cannot be made (here: a value JSON cannot write): before, summary.csv and
    last_best.csv were already in place behind the exit 2."""
    from rpg_eval.stats import summary

    dirs, _ = _runs(tmp_path)
    monkeypatch.setattr(summary, "disagreements", lambda records: {"n": {1, 2}})
    assert cli_main(["summarize", str(dirs[0]), "--out", str(tmp_path / "sum")]) == 2
    assert "rpg-eval" in capsys.readouterr().err
    assert not any(p.name.endswith((".csv", ".json")) for p in (tmp_path / "sum").glob("*"))
