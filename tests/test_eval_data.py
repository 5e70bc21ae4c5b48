"""Benchmark loaders: local jsonl, the paper's verl parquet (problems x 32), validation and
escape repair, prompts, task yamls."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rpg_eval.data import DataError, find_local_file, load_benchmark, repair_escapes, select
from rpg_eval.run.prompts import render_prompt
from rpg_eval.run.taskgen import TASKS_DIR, task_yaml, write_tasks

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PAPER = DATA / "rpg_paper_eval"


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(("bench", "count"), [("aime24", 30), ("aime25", 30), ("amc23", 40)])
def test_local_jsonl(bench: str, count: int) -> None:
    probs = load_benchmark(DATA, bench)
    assert len(probs) == count
    assert len({p.id for p in probs}) == count
    assert all(p.answer and p.problem and p.repeats == 1 for p in probs)
    assert probs[0].where.endswith(f"{bench}.jsonl:1")


@pytest.mark.parametrize(
    ("file", "bench", "count", "flat"),
    [
        ("aime-2024.parquet", "aime24", 30, "aime24"),
        ("aime25.parquet", "aime25", 30, "aime25"),
        ("amc-23.parquet", "amc23", 40, "amc23"),
    ],
)
def test_paper_parquet_collapses_to_problems_x_32(file: str, bench: str, count: int, flat: str) -> None:
    probs = load_benchmark(PAPER / file, bench)
    assert len(probs) == count
    assert {p.repeats for p in probs} == {32}
    # The paper's prompt is our DAPO prompt, verbatim.
    assert all(p.prompt == render_prompt(p.problem, "dapo") for p in probs)
    # Same answers as the normalized jsonl (up to the known 336^\circ ground truth).
    ours = sorted(p.answer for p in load_benchmark(DATA, flat))
    theirs = sorted(p.answer.replace("^\\circ", "") for p in probs)
    assert ours == theirs
    # A directory of paper files resolves by the paper's file names.
    assert find_local_file(bench, PAPER).name == file


def test_paper_parquet_with_disagreeing_copy_is_rejected(tmp_path: Path) -> None:
    df = pd.read_parquet(PAPER / "aime25.parquet")
    df.at[5, "reward_model"] = {"ground_truth": "999", "style": "rule"}
    bad = tmp_path / "aime25.parquet"
    df.to_parquet(bad)
    with pytest.raises(DataError, match=r"aime25\.parquet:row \d+: .*disagrees"):
        load_benchmark(bad, "aime25")


def test_unequal_repeats_rejected(tmp_path: Path) -> None:
    df = pd.read_parquet(PAPER / "aime25.parquet").iloc[:-1]
    bad = tmp_path / "x.parquet"
    df.to_parquet(bad)
    with pytest.raises(DataError, match="repeated unequally"):
        load_benchmark(bad, "aime25")


def test_damaged_escapes_repaired(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "problem": "Find \x0crac{1}{2} of the \triangle ABC.", "answer": "\x0crac{3}{4}"},
        {"id": "b", "problem": "Compute \x08inom{5}{2} and x \times y.", "answer": 10},
        {"id": "c", "problem": "Line one.\r\nLine two:\t3 apples.", "answer": "7"},
    ]
    probs = load_benchmark(_write_jsonl(tmp_path / "d.jsonl", rows), "aime25")
    assert probs[0].problem == "Find \\frac{1}{2} of the \\triangle ABC."
    assert probs[0].answer == "\\frac{3}{4}"
    assert probs[1].problem == "Compute \\binom{5}{2} and x \\times y." and probs[1].answer == "10"
    assert probs[2].problem == "Line one.\r\nLine two:\t3 apples."  # real whitespace kept


def test_uncertain_escape_rejected_with_file_and_line(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "problem": "ok", "answer": "1"},
        {"id": "b", "problem": "weird \x0cxyz here", "answer": "2"},
    ]
    path = _write_jsonl(tmp_path / "e.jsonl", rows)
    with pytest.raises(DataError, match=r"e\.jsonl:2: .*cannot be repaired"):
        load_benchmark(path, "aime24")
    with pytest.raises(DataError, match="w:"):
        repair_escapes("\x0c", "w")


def test_duplicate_ids_rejected(tmp_path: Path) -> None:
    rows = [
        {"id": "x", "problem": "p1", "answer": "1"},
        {"id": "y", "problem": "p2", "answer": "2"},
        {"id": "x", "problem": "p3", "answer": "3"},
    ]
    with pytest.raises(DataError, match=r"dup\.jsonl:3: duplicate id 'x' \(first at .*dup\.jsonl:1\)"):
        load_benchmark(_write_jsonl(tmp_path / "dup.jsonl", rows), "aime24")


def test_an_empty_answer_is_rejected(tmp_path: Path) -> None:
    """(Malformed rows, the eval loader and rpg-prepare-data: tests/test_eval_data_malformed.py.)"""
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"id": "ok", "problem": "p", "answer": "1"},
                                                  {"id": "a", "problem": "p", "answer": "  "}])  # fmt: skip
    with pytest.raises(DataError, match=r"bad\.jsonl:2: .*empty answer"):
        load_benchmark(path, "aime24")


def test_missing_source_and_select() -> None:
    with pytest.raises(DataError, match="no such file"):
        load_benchmark("/nonexistent/aime24.jsonl", "aime24")
    probs = load_benchmark(DATA, "amc23")
    assert [p.id for p in select(probs, limit=3)] == [p.id for p in probs[:3]]
    assert [p.id for p in select(probs, limit=5, ids=[probs[4].id, probs[1].id])] == [
        probs[1].id,
        probs[4].id,
    ]


def test_prompts() -> None:
    assert render_prompt("What is 1+1?").endswith("within \\boxed{}.")
    assert "Answer: $Answer" in render_prompt("What is 1+1?", "dapo")
    with pytest.raises(ValueError, match="prompt style"):
        render_prompt("x", "nope")


def test_shipped_yamls_are_generated(tmp_path: Path) -> None:
    """The static yamls are exactly what taskgen writes (they cannot drift)."""
    write_tasks(tmp_path, shim=False)
    shipped = sorted(p.name for p in TASKS_DIR.glob("*.yaml"))
    assert shipped == sorted(p.name for p in tmp_path.glob("*.yaml")) and len(shipped) == 6
    for name in shipped:
        assert (TASKS_DIR / name).read_text() == (tmp_path / name).read_text(), name
    y = task_yaml("aime24", "boxed", n=8)
    assert "function: take_first_k" in y and "k: 8" in y and "pass_at_8" in y and "pass_at_16" not in y


# --------------------------------------------------------------------------- paths


def _run_line(capsys, argv: list[str]) -> str:
    from rpg_eval.cli import main as cli_main

    assert cli_main(argv) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-eval: error:"), lines
    return lines[0]


@pytest.mark.parametrize("kind", ["--data-dir", "--data"])
def test_mistyped_local_path_is_not_taken_for_a_hub_dataset(tmp_path: Path, capsys, kind: str) -> None:
    """`--data-dir nodir` and `--data demo=missing.json` said "Couldn't reach 'nodir' on the Hub"."""
    ckpt = tmp_path / "c" / "global_step1_hf"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    data = (
        ["--data-dir", "nodir"]
        if kind == "--data-dir"
        else ["--benchmarks", "demo", "--data", "demo=missing.json"]
    )
    line = _run_line(capsys, ["run", "--checkpoints", str(ckpt.parent), "--out", str(tmp_path / "o"),
                              "--backend", "hf", "--n", "1", *data])  # fmt: skip
    named = "nodir" if kind == "--data-dir" else "missing.json"
    assert named in line and "no such file or directory" in line and "Hub" not in line, line
    assert not (tmp_path / "o").exists()
