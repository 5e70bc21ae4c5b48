"""Benchmark loaders: AIME24/AIME25/AMC23 from ../shared/data (jsonl, and the paper's verl parquet:
problems x 32), escape repair, prompts, task yamls; and bad data, one case per kind, refused in one
line naming FILE:LINE (or row) by the eval loader (``rpg-eval run`` then writes nothing:
test_eval_hostile_input.py::test_run_failures_are_one_line) and by
rpg-prepare-data (exit 2, nothing written), whose ``--conflicting-answers`` and ``--bad-escapes``
keep or drop instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from rpg_eval.data import DataError, find_local_file, load_benchmark, select
from rpg_eval.graders import MAX_ANSWER_CHARS
from rpg_eval.run.prompts import render_prompt
from rpg_eval.run.taskgen import TASKS_DIR, task_yaml, write_tasks

from rpg_openrlhf.data import main as prepare_main

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


# --------------------------------------------------------------------------- bad data, one case per kind

GOOD = {"id": "ok", "problem": "What is 1+1?", "answer": "2"}
# kind -> (the second line of a jsonl after GOOD, what the eval loader says, what rpg-prepare-data says)
BAD_ROWS = {
    "truncated json": (b'{"id": "b", "problem": "p', "invalid JSON", "invalid JSON"),
    "invalid utf-8": (b'{"id": "b", "problem": "p\xff", "answer": "1"}', "not valid UTF-8", "not valid UTF-8"),
    "missing answer": ({"id": "b", "problem": "p"}, "missing field 'answer'", "no answer"),
    "answer of a wrong type": ({"id": "b", "problem": "p", "answer": [1, 2]}, "must be a string or an integer",
                               "must be a string or an integer"),
    "chat list holding a non-dict": ({"prompt": [{"role": "user", "content": "x"}, 5], "answer": "1"},
                                     "missing or empty field 'problem'", "'prompt'[1] must be"),
    "duplicate id": ({"id": "ok", "problem": "p", "answer": "3"}, "duplicate id 'ok' (first at {path}:1)", None),
    "uncertain escape": ({"id": "b", "problem": "x \x0cyz", "answer": "1"}, "cannot be repaired", "cannot be repaired"),
    "control character": ({"id": "b", "problem": "a\x00b", "answer": "1"}, "control character '\\x00' at offset 1",
                          "not text (--bad-escapes"),
    "two answers to one problem": ({"id": "b", "problem": "What is 1+1?", "answer": "3"},
                                   "the problem of {path}:1 with another answer ('3' here, '2' there)",
                                   "the problem of {path}:1 with another answer ('3' here, '2' there)"),
    "empty answer": ({"id": "b", "problem": "p", "answer": " "}, "empty answer", "no answer"),
    "gold empty after normalization": ({"id": "b", "problem": "p", "answer": "\\boxed{}"},
                                       "is empty after normalization", "is empty after normalization"),
    "gold past the cap": ({"id": "b", "problem": "p", "answer": "1" * 100_000}, "answer of 100,000 characters",
                          f"is longer than {MAX_ANSWER_CHARS:,}"),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path: Path, capsys, kind: str) -> None:
    row, eval_says, prepare_says = BAD_ROWS[kind]
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        json.dumps(GOOD).encode()
        + b"\n"
        + (row if isinstance(row, bytes) else json.dumps(row).encode())
        + b"\n"
    )
    with pytest.raises(DataError) as e:
        load_benchmark(path, "demo")
    said = str(e.value)
    assert said.startswith(f"{path}:2: ") and eval_says.format(path=path) in said and "\n" not in said, said
    out = tmp_path / "out.jsonl"
    rc = prepare_main(["--input", str(path), "--output", str(out)])
    if prepare_says is None:  # rpg-prepare-data drops a repeated problem (tests/test_data.py counts it)
        return
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"rpg-prepare-data: error: {path}:2: "), err
    assert prepare_says.format(path=path) in err[0] and not out.exists(), err


def test_a_gold_at_the_cap_and_one_answer_given_twice_are_kept(tmp_path: Path) -> None:
    f = _write_jsonl(tmp_path / "b.jsonl", [{"id": "a", "problem": "x", "answer": "7" * MAX_ANSWER_CHARS},
                                            {"id": "c", "problem": "x", "answer": "7" * MAX_ANSWER_CHARS}])  # fmt: skip
    assert [p.id for p in load_benchmark(f, "demo")] == ["a", "c"]


def test_bad_files_name_the_file_or_row(tmp_path: Path, capsys) -> None:
    """An empty file (both loaders), and parquet: a missing column (row 0), a copy of a verl problem
    that disagrees (its row), copies repeated unequally (the file)."""
    empty = _write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(DataError, match=f"{empty}: no rows"):
        load_benchmark(empty, "aime24")
    assert prepare_main(["--input", str(empty), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert str(empty) in capsys.readouterr().err and not (tmp_path / "o.jsonl").exists()
    flat = tmp_path / "flat.parquet"
    pd.DataFrame({"id": ["a", "b"], "problem": ["p", "q"]}).to_parquet(flat)
    with pytest.raises(DataError, match=f"{flat}:row 0: missing field 'answer'"):
        load_benchmark(flat, "aime24")
    df = pd.read_parquet(PAPER / "aime25.parquet")
    df.at[5, "reward_model"] = {"ground_truth": "999", "style": "rule"}
    df.to_parquet(tmp_path / "aime25.parquet")
    with pytest.raises(DataError, match=r"aime25\.parquet:row \d+: .*disagrees"):
        load_benchmark(tmp_path / "aime25.parquet", "aime25")
    pd.read_parquet(PAPER / "aime25.parquet").iloc[:-1].to_parquet(tmp_path / "x.parquet")
    with pytest.raises(DataError, match="repeated unequally"):
        load_benchmark(tmp_path / "x.parquet", "aime25")


@pytest.mark.parametrize("kind,given", [("fifo", "path"), ("directory", "dir")])
def test_a_fifo_or_folder_as_data_says_what_it_is(tmp_path: Path, kind: str, given: str) -> None:
    """A benchmark file that is a FIFO or a directory says what it is, not 'no such file' (a folder
    given as the path is a --data-dir, looked into, so it is planted under one)."""
    planted = tmp_path / "aime24.jsonl"
    os.mkfifo(planted) if kind == "fifo" else planted.mkdir()
    with pytest.raises(DataError) as e:
        load_benchmark(planted if given == "path" else tmp_path, "aime24")
    message = str(e.value)
    assert "aime24.jsonl" in message and {"fifo": "FIFO", "directory": "directory"}[kind] in message, message
    assert "no file for benchmark" not in message and "no such file" not in message and "\n" not in message


# --------------------------------------------------------------------------- rpg-prepare-data's choices

CONFLICTING = [{"problem": "What is 2+2?", "answer": "4"}, {"problem": "What is 3+3?", "answer": "6"},
               {"problem": "What is 2+2?", "answer": "5"}, {"problem": "What is 2+2?", "answer": "4"}]  # fmt: skip


@pytest.mark.parametrize("mode,labels", [("first", ["4", "6"]), ("drop", ["6"])])
def test_prepare_data_conflicting_answers_first_or_drop(
    tmp_path: Path, capsys, mode: str, labels: list
) -> None:
    src, out = _write_jsonl(tmp_path / "in.jsonl", CONFLICTING), tmp_path / "out.jsonl"
    assert prepare_main(["--input", str(src), "--output", str(out), "--conflicting-answers", mode]) == 0
    printed = capsys.readouterr().out
    assert [json.loads(x)["label"] for x in out.read_text().splitlines()] == labels
    if mode == "first":
        assert "1 problems' copies disagree on the answer: kept the first copy's" in printed
    else:
        assert "dropped 1: problem whose copies disagree on the answer (every copy)" in printed


def test_prepare_data_bad_escapes_keep_or_drop(tmp_path: Path, capsys) -> None:
    """--bad-escapes keep writes the text as it is; drop drops and counts it; repairs always apply."""
    path = _write_jsonl(tmp_path / "in.jsonl", [{"problem": "x \x0cyz", "answer": "1"},
                                                {"problem": "Find \x0crac{1}{2}.", "answer": 2.0}])  # fmt: skip
    out = tmp_path / "prompts.jsonl"
    assert prepare_main(["--input", str(path), "--output", str(out), "--bad-escapes", "keep"]) == 0
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["problem"], r["label"]) for r in written] == [("x \x0cyz", "1"), ("Find \\frac{1}{2}.", "2")]
    capsys.readouterr()
    assert prepare_main(["--input", str(path), "--output", str(out), "--bad-escapes", "drop"]) == 0
    assert [json.loads(x)["problem"] for x in out.read_text().splitlines()] == ["Find \\frac{1}{2}."]
    assert "dropped 1: control character" in capsys.readouterr().out


def test_prepare_data_output_is_a_valid_input(tmp_path: Path, capsys) -> None:
    """What rpg-prepare-data writes, it reads back to the same records (``label`` is an answer field,
    the template is unwrapped): preparing twice changes nothing."""
    from rpg_openrlhf.data import PROMPT_PREFIX

    src = _write_jsonl(tmp_path / "in.jsonl", [{"problem": "What is $1+1$?", "answer": "2"},
                                               {"question": "Find $x$ if $2x = 6$.", "answer": 3}])  # fmt: skip
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    assert prepare_main(["--input", str(src), "--output", str(once)]) == 0
    assert prepare_main(["--input", str(once), "--output", str(twice)]) == 0
    assert once.read_bytes() == twice.read_bytes()
    first = json.loads(once.read_text().splitlines()[0])
    assert (first["problem"], first["label"]) == ("What is $1+1$?", "2")
    assert first["prompt"].startswith(PROMPT_PREFIX) and first["prompt"].count(PROMPT_PREFIX) == 1
