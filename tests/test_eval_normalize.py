"""Answer normalization in linear time, and no gold past the cap (issue 50 item 4).

``normalize_final_answer`` must give verl's ``math_dapo.normalize_final_answer`` exactly: that
function is written out here (its regexes as verl has them) and both are run on random strings
built from the pieces the regexes look for (``$``, ``\\text{``, ``\\boxed{``, ``}``, newlines, ``=``,
``frac``...). Then the time: 100,000 digits normalize in well under a second (verl's took ~56 s),
and such a gold is refused at load, naming FILE:LINE, by ``rpg-eval run``'s loader and
``rpg-prepare-data``."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest
from rpg_eval.data import DataError, load_benchmark
from rpg_eval.graders import MAX_ANSWER_CHARS, grade, normalize_final_answer
from rpg_eval.graders.answers import REMOVED_EXPRESSIONS, SUBSTITUTIONS


def verl_normalize(final_answer: str) -> str:
    """verl's math_dapo.normalize_final_answer (the tables are the module's: what changed is the
    regex part, written here as verl has it)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


PIECES = ["$", "$", "\\text{", "\\textbf{", "\\overline{", "\\boxed{", "}", "}", "{", "\n", "\r", "=", ",",
          "frac", "sqrt", "1", "23", "x", " ", "\\", "\\text{ s}", "\\dots", "^\\circ"]  # fmt: skip


def test_normalization_is_verls_on_random_strings() -> None:
    rng = random.Random(0)
    for _ in range(20000):
        s = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        assert normalize_final_answer(s) == verl_normalize(s), repr(s)


@pytest.mark.parametrize(
    "text,expected",
    [("$5$", "5"), ("a $x$ b $y$ c", "x"), ("$a$\n$b$", "a\nb"), ("\\text{ab}\\text{c", "ab\\text{c"),
     ("\\boxed{1}+\\boxed{2}", "1}+\\boxed{2"), ("\\boxed{1\n}", "\\boxed{1\n}"), ("1,000", "1000")]
)  # fmt: skip
def test_normalization_by_hand(text: str, expected: str) -> None:
    assert normalize_final_answer(text) == expected == verl_normalize(text)


@pytest.mark.parametrize(
    "text", ["1" * 100_000, "$" + "1" * 100_000, "\\text{" * 20_000, "\\boxed{" * 15_000 + "x"]
)
def test_normalization_is_linear(text: str) -> None:
    start = time.perf_counter()
    normalize_final_answer(text)
    grade("Answer: " + text, "5", "paper")
    assert time.perf_counter() - start < 0.5


def test_a_gold_past_the_cap_is_refused_at_load(tmp_path: Path) -> None:
    f = tmp_path / "b.jsonl"
    rows = [
        {"id": "a", "problem": "1+1?", "answer": "2"},
        {"id": "b", "problem": "big?", "answer": "1" * 100_000},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = time.perf_counter()
    with pytest.raises(DataError) as e:
        load_benchmark(f, "demo")
    assert time.perf_counter() - start < 1.0
    assert str(e.value).startswith(f"{f}:2: answer of 100,000 characters") and f"{MAX_ANSWER_CHARS:,}" in str(
        e.value
    )
    f.write_text(
        json.dumps({"id": "c", "problem": "x", "answer": "7" * MAX_ANSWER_CHARS}) + "\n"
    )  # at the cap: kept
    assert load_benchmark(f, "demo")[0].answer == "7" * MAX_ANSWER_CHARS
