"""Problems as data says them, or a refusal (issue 50 item 3): a problem given twice with two
answers is refused naming both rows (``rpg-eval``'s loader and ``rpg-prepare-data``, whose
``--conflicting-answers first|drop`` keep the first copy's answer or drop every copy); a NUL or
another control character no broken escape explains is refused naming FILE:LINE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rpg_eval.data import DataError, load_benchmark

from rpg_openrlhf import data


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _one_error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-prepare-data: error: "), lines
    return lines[0]


ROWS = [{"problem": "What is 2+2?", "answer": "4"}, {"problem": "What is 3+3?", "answer": "6"},
        {"problem": "What is 2+2?", "answer": "5"}, {"problem": "What is 2+2?", "answer": "4"}]  # fmt: skip


def test_prepare_data_refuses_two_answers_to_one_problem(tmp_path: Path, capsys) -> None:
    src = _jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    assert data.main(["--input", str(src), "--output", str(out)]) == 2
    line = _one_error(capsys)
    assert f"{src}:3: the problem of {src}:1 with another answer ('5' here, '4' there)" in line
    assert not out.exists()


@pytest.mark.parametrize("mode,labels", [("first", ["4", "6"]), ("drop", ["6"])])
def test_prepare_data_conflicting_answers_first_or_drop(
    tmp_path: Path, capsys, mode: str, labels: list
) -> None:
    src, out = _jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert data.main(["--input", str(src), "--output", str(out), "--conflicting-answers", mode]) == 0
    printed = capsys.readouterr().out
    assert [json.loads(x)["label"] for x in out.read_text().splitlines()] == labels
    if mode == "first":
        assert "1 problems' copies disagree on the answer: kept the first copy's" in printed
    else:
        assert "dropped 1: problem whose copies disagree on the answer (every copy)" in printed


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\x7f", "\x01"])
def test_prepare_data_refuses_a_control_character(tmp_path: Path, capsys, char: str) -> None:
    src = _jsonl(tmp_path / "in.jsonl", [ROWS[1], {"problem": f"What is{char} 1+1?", "answer": "2"}])
    assert data.main(["--input", str(src), "--output", str(tmp_path / "out.jsonl")]) == 2
    line = _one_error(capsys)
    assert f"{src}:2: control character {char!r} at offset 7" in line and "--bad-escapes" in line


def test_eval_loader_refuses_a_control_character_naming_the_line(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "b.jsonl", [{"id": "a", "problem": "ok", "answer": "1"},
                                      {"id": "b", "problem": "a\x00b", "answer": "2"}])  # fmt: skip
    with pytest.raises(DataError, match=r"b\.jsonl:2: control character '\\x00' at offset 1"):
        load_benchmark(f, "demo")
    _jsonl(f, [{"id": "a", "problem": "ok", "answer": "1\x00"}])
    with pytest.raises(DataError, match=r"b\.jsonl:1: control character '\\x00'"):
        load_benchmark(f, "demo")


def test_eval_loader_refuses_one_problem_with_two_answers(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "b.jsonl", [{"id": "a", "problem": "2+2?", "answer": "4"}, {"id": "b", "problem": "x", "answer": "1"},
                                      {"id": "c", "problem": "2+2?", "answer": "5"}])  # fmt: skip
    with pytest.raises(DataError) as e:
        load_benchmark(f, "demo")
    assert str(e.value).startswith(f"{f}:3: the problem of {f}:1 with another answer ('5' here, '4' there)")
    _jsonl(f, [{"id": "a", "problem": "2+2?", "answer": "4"}, {"id": "c", "problem": "2+2?", "answer": "4"}])
    assert [p.id for p in load_benchmark(f, "demo")] == ["a", "c"]  # the same answer twice: two ids kept
