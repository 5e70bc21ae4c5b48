"""rpg_eval.data and rpg-prepare-data on malformed benchmark / training data.

Malformed jsonl or parquet (missing fields, wrong types, empty file, duplicate ids, damaged
escapes, bad UTF-8) must give one clear error that names the file and the line (jsonl) or
row (parquet), and nothing partial may be written: for the eval loaders
(rpg_eval.data.load_benchmark, and `rpg-eval run` on top of them) and for rpg-prepare-data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

GOOD = {"id": "a", "problem": "What is $1+1$?", "answer": "2"}

# name -> (jsonl bytes, line that is wrong)
MALFORMED_JSONL: dict[str, tuple[bytes, int]] = {
    "missing answer": (b'{"id": "a", "problem": "p"}\n', 1),
    "answer is a list": (b'{"id": "a", "problem": "p", "answer": [1, 2]}\n', 1),
    "answer is a non-integral float": (b'{"id": "a", "problem": "p", "answer": 0.5}\n', 1),
    "truncated json": (b'{"id": "a", "problem": "p", "answer": "1"}\n{"id": "b", "problem": "p\n', 2),
    "form feed that is not a latex command": (b'{"id": "a", "problem": "x \\fyz", "answer": "1"}\n', 1),
    "invalid utf-8": (b'{"id": "a", "problem": "ok", "answer": "1"}\n{"id": "b", "problem": "p\xff", "answer": "1"}\n', 2)
}  # fmt: skip


def _where_re(path: Path, line: int) -> str:
    """A message names the file and the line (path:N, or 'line N' near the path)."""
    return rf"{re.escape(str(path))}(:| line | row ){line}\b|{re.escape(path.name)}:{line}\b"


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / (re.sub(r"\W+", "_", name) + ".jsonl")
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- eval loaders


@pytest.mark.parametrize("case", list(MALFORMED_JSONL))
def test_eval_loader_names_file_and_line(tmp_path: Path, case: str) -> None:
    from rpg_eval.data import DataError, load_benchmark

    data, line = MALFORMED_JSONL[case]
    path = _write(tmp_path, case, data)
    with pytest.raises(DataError) as err:
        load_benchmark(str(path), "aime24")
    assert re.search(_where_re(path, line), str(err.value)), str(err.value)
    assert len(str(err.value).splitlines()) == 1  # one clear line, not a dump


def test_eval_loader_empty_and_blank_files(tmp_path: Path) -> None:
    from rpg_eval.data import DataError, load_benchmark

    for name, data in {"empty": b"", "blank": b"\n\n  \n"}.items():
        path = _write(tmp_path, name, data)
        with pytest.raises(DataError, match=re.escape(str(path))):
            load_benchmark(str(path), "aime24")


PARQUET_CASES = {
    "missing answer column": ({"id": ["a", "b"], "problem": ["p", "q"]}, 0),
    "duplicate ids": ({"id": ["a", "b", "a"], "problem": ["p", "q", "r"], "answer": ["1", "2", "3"]}, 2),
}


@pytest.mark.parametrize("case", list(PARQUET_CASES))
def test_eval_loader_parquet_names_file_and_row(tmp_path: Path, case: str) -> None:
    import pandas as pd
    from rpg_eval.data import DataError, load_benchmark

    columns, row = PARQUET_CASES[case]
    path = tmp_path / "bad.parquet"
    pd.DataFrame(columns).to_parquet(path)
    with pytest.raises(DataError) as err:
        load_benchmark(str(path), "aime24")
    assert f"{path}:row {row}" in str(err.value), str(err.value)


def test_eval_run_with_bad_data_writes_nothing(tmp_path: Path) -> None:
    """`rpg-eval run` on malformed data: DataError before anything lands in --out."""
    from rpg_eval.data import DataError
    from rpg_eval.run.runner import RunConfig, run

    ckpt = tmp_path / "ckpt" / "global_step1_hf"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    bad = _write(tmp_path, "bad", MALFORMED_JSONL["missing answer"][0])
    out = tmp_path / "out"
    cfg = RunConfig(checkpoints=str(ckpt), out=str(out), benchmarks=["aime24"], data_files={"aime24": str(bad)},
                    backend="hf", n=1, summarize=False)  # fmt: skip
    with pytest.raises(DataError, match=re.escape(str(bad))):
        run(cfg)
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())


# --------------------------------------------------------------------------- rpg-prepare-data


def _run_prepare(path: Path, out: Path, capsys: pytest.CaptureFixture) -> tuple[int | None, str]:
    """(exit status, stderr) of rpg-prepare-data --input path --output out (in-process)."""
    from rpg_openrlhf.data import main

    try:
        rc = main(["--input", str(path), "--output", str(out)])
    except SystemExit as e:  # argparse-style exits count as a clean error
        rc = e.code if isinstance(e.code, int) else 2
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("case", list(MALFORMED_JSONL))
def test_prepare_data_names_file_and_line_and_writes_nothing(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture
) -> None:
    data, line = MALFORMED_JSONL[case]
    path = _write(tmp_path, case, data)
    out = tmp_path / "out" / "prompts.jsonl"
    rc, err = _run_prepare(path, out, capsys)
    assert rc not in (0, None)
    assert re.search(_where_re(path, line), err), err
    assert len([x for x in err.splitlines() if "error" in x]) == 1, err
    assert not out.exists() and not Path(str(out) + ".tmp").exists()


def test_prepare_data_empty_file_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path, "empty", b"")
    out = tmp_path / "prompts.jsonl"
    rc, err = _run_prepare(path, out, capsys)
    assert rc == 2 and str(path) in _one_error_line(err) and not out.exists()


def _one_error_line(err: str) -> str:
    """The single ``rpg-prepare-data: error:`` line; no traceback."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-prepare-data: error: "), err
    return lines[0]


WRONGLY_TYPED = {
    "chat list holding a non-dict": ({"prompt": [{"role": "user", "content": "x"}, 5], "answer": "1"}, "'prompt'[1]"),
    "reward_model answer is a list": ({"problem": "p", "reward_model": {"ground_truth": [1]}}, "answer")
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRONGLY_TYPED))
def test_prepare_data_wrongly_typed_field_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    row, named = WRONGLY_TYPED[case]
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"problem": "fine", "answer": "2"}) + "\n" + json.dumps(row) + "\n")
    out = tmp_path / "prompts.jsonl"
    rc, err = _run_prepare(path, out, capsys)
    line = _one_error_line(err)
    assert rc == 2 and f"{path}:2" in line and named in line, line
    assert not out.exists()


def test_prepare_data_output_is_a_valid_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What rpg-prepare-data writes, it reads back to the same records (``label`` is an answer field,
    the template is unwrapped): preparing twice changes nothing."""
    from rpg_openrlhf.data import PROMPT_PREFIX

    src = tmp_path / "in.jsonl"
    rows = [{"problem": "What is $1+1$?", "answer": "2"}, {"question": "Find $x$ if $2x = 6$.", "answer": 3}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    assert _run_prepare(src, once, capsys)[0] == 0
    assert _run_prepare(once, twice, capsys)[0] == 0
    assert once.read_bytes() == twice.read_bytes()
    first = json.loads(once.read_text().splitlines()[0])
    assert (first["problem"], first["label"]) == ("What is $1+1$?", "2")
    assert first["prompt"].startswith(PROMPT_PREFIX) and first["prompt"].count(PROMPT_PREFIX) == 1


def test_prepare_data_duplicates_are_dropped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Duplicate problems are the hub copy's normal state: dropped and reported, not an error."""
    path = tmp_path / "dups.jsonl"
    path.write_text("".join(json.dumps({"problem": "p", "answer": "1"}) + "\n" for _ in range(3)))
    out = tmp_path / "prompts.jsonl"
    from rpg_openrlhf.data import main

    assert main(["--input", str(path), "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 1
    assert "dropped 2: duplicate" in capsys.readouterr().out


def test_prepare_data_bad_escapes_keep_or_drop(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--bad-escapes keep writes the text as it is; drop drops and counts it; repairs always apply."""
    from rpg_openrlhf.data import main

    rows = [{"problem": "x \x0cyz", "answer": "1"}, {"problem": "Find \x0crac{1}{2}.", "answer": 2.0}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "prompts.jsonl"
    assert main(["--input", str(path), "--output", str(out), "--bad-escapes", "keep"]) == 0
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["problem"], r["label"]) for r in written] == [("x \x0cyz", "1"), ("Find \\frac{1}{2}.", "2")]
    capsys.readouterr()
    assert main(["--input", str(path), "--output", str(out), "--bad-escapes", "drop"]) == 0
    assert [json.loads(x)["problem"] for x in out.read_text().splitlines()] == ["Find \\frac{1}{2}."]
    assert "dropped 1: control character" in capsys.readouterr().out
