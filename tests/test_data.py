"""rpg-prepare-data on the shared DAPO-Math-17k parquet: paper prompt, labels, English filter counts."""

from __future__ import annotations

import json

import pytest

from rpg_openrlhf import data


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_shared_parquet_english_only(shared_data, tmp_path, capsys):
    # --bad-escapes keep: 36 hub problems hold stray form feeds / tabs; the paper trained on them.
    out = tmp_path / "dapo.jsonl"
    rc = data.main(
        [
            *("--input", str(shared_data / "dapo_math_17k.parquet"), "--output", str(out)),
            *("--english-only", "--bad-escapes", "keep", "--conflicting-answers", "first"),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    rows = _read(out)
    print(printed)
    assert "17917 rows" in printed and f"kept {len(rows)}" in printed and "dropped" in printed
    assert "CJK" in printed and "12 problems' copies disagree on the answer: kept the first copy's" in printed
    # The paper kept 13.9k English problems; dropping CJK and duplicates keeps about that many.
    assert 13_500 <= len(rows) <= 14_600
    first = rows[0]
    assert first["prompt"] == data.make_prompt(first["problem"])
    assert first["prompt"].startswith("Solve the following math problem step by step.")
    assert first["prompt"].endswith('Remember to put your answer on its own line after "Answer:".')
    assert first["label"] == "34"
    assert all(data.non_english_reason(r["problem"]) is None for r in rows)
    assert len({r["problem"] for r in rows}) == len(rows)


def test_templated_jsonl_is_unwrapped(tmp_path):
    src = tmp_path / "in.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": data.make_prompt("What is 1+1?")}],
            "reward_model": {"ground_truth": "2"},
        },
        {
            "prompt": [{"role": "user", "content": data.make_prompt("What is 1+1?")}],
            "reward_model": {"ground_truth": "2"},
        },
        {"problem": "求 1+2", "answer": "3"},
        {"question": "What is 2+2？", "answer": 4},
    ]
    src.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    records, report = data.prepare(data.read_rows(str(src)), english_only=True)
    assert [r["problem"] for r in records] == ["What is 1+1?"]
    assert report["dropped"] == {
        "duplicate problem": 1,
        "CJK letters (ideographs, kana or hangul)": 1,
        "CJK / full-width punctuation": 1,
    }
    records, _ = data.prepare(data.read_rows(str(src)))
    assert [r["label"] for r in records] == ["2", "3", "4"]
    out = tmp_path / "small.jsonl"
    assert data.main(["--input", str(src), "--output", str(out), "--max-samples", "2"]) == 0
    assert [r["label"] for r in _read(out)] == ["2", "3"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("a,b\n1,2\n", "unsupported file type"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    src = tmp_path / ("in.csv" if content and content.startswith("a,b") else "in.jsonl")
    if content is not None:
        src.write_text(content, encoding="utf-8")
    rc = data.main(["--input", str(src), "--output", str(tmp_path / "out.jsonl")])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


# --------------------------------------------------------------------------- issue #19 (rpg-prepare-data)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("rpg-prepare-data: error:"), err
    return lines[0]


@pytest.mark.parametrize("ext", [".jsonl", ".json"])
def test_hostile_json_names_file_and_line(tmp_path, capsys, ext):
    """Item 7: a 5,000-digit integer answer (int conversion limit) and 100,000 nested arrays
    (RecursionError) were Python errors without file:line. The long answer is read as its digits and
    refused past the 1,000-character answer cap (issue 50); each is one line naming the row (a .json
    file's nesting: the file)."""
    first = '{"problem": "What is 1+1?", "answer": "2"}'
    big = "1" * 5000
    src = tmp_path / f"in{ext}"
    for line in ('{"problem": "p", "answer": ' + big + "}", "[" * 100_000):
        src.write_text(f"{first}\n{line}\n" if ext == ".jsonl" else f"[{first},\n{line}]\n")
        rc = data.main(["--input", str(src), "--output", str(tmp_path / "out.jsonl")])
        err = capsys.readouterr().err
        if line.startswith("["):
            where = f"{src}:2" if ext == ".jsonl" else f"{src}: JSON nested"  # a .json: the file
            assert rc == 2 and where in _one_line(err) and "nested" in err, err
            continue
        where = f"{src}:2" if ext == ".jsonl" else f"{src}:row 1"
        assert rc == 2 and _one_line(err).startswith(
            f"rpg-prepare-data: error: {where}: answer of 5,000 characters"
        )


def test_usage_errors_are_one_line_without_abbreviations(tmp_path, capsys):
    """Cosmetic: a parse error printed a usage block first; `--max-s 3` meant --max-samples."""
    out = str(tmp_path / "o.jsonl")
    assert data.main(["--output", out, "--max-samples", "0"]) == 2
    assert "--max-samples" in _one_line(capsys.readouterr().err)
    assert data.main(["--input", "x.jsonl", "--output", out, "--max-s", "3"]) == 2
    assert "--max-s" in _one_line(capsys.readouterr().err)
