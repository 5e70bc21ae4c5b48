"""Answer normalization in linear time (issue 50 item 4; a gold past the cap is refused at load:
tests/test_eval_data.py).

``normalize_final_answer`` must give verl's ``math_dapo.normalize_final_answer`` exactly: that
function is written out here (its regexes as verl has them) and both are run on random strings
built from the pieces the regexes look for (``$``, ``\\text{``, ``\\boxed{``, ``}``, newlines, ``=``,
``frac``...). Then the time: 100,000 digits normalize in well under a second (verl's took ~56 s)."""

from __future__ import annotations

import random
import re
import time

import pytest
from rpg_eval.graders import grade, normalize_final_answer
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
    "text", ["1" * 100_000, "$" + "1" * 100_000, "\\text{" * 20_000, "\\boxed{" * 15_000 + "x"]
)
def test_normalization_is_linear(text: str) -> None:
    start = time.perf_counter()
    normalize_final_answer(text)
    grade("Answer: " + text, "5", "paper")
    assert time.perf_counter() - start < 0.5
