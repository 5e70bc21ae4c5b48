"""Graders: a labeled set of outputs with the expected verdict of each grader, timeouts,
the process pool, the integer fast path and throughput."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from pathlib import Path

import pytest
from math_verify import parse, verify
from rpg_eval import graders
from rpg_eval.graders import Verdict, clear_caches, grade, grade_many, normalize_final_answer

CASES_FILE = Path(__file__).resolve().parent / "data" / "grader_cases.jsonl"


def _build(resp: str | dict) -> str:
    """Responses are stored literally, or as a repeat spec for the 1 MB cases."""
    if isinstance(resp, str):
        return resp
    return resp.get("prefix", "") + resp["repeat"] * resp["times"] + resp.get("suffix", "")


def _load_cases() -> list[dict]:
    cases = [json.loads(line) for line in CASES_FILE.read_text().splitlines() if line.strip()]
    for c in cases:
        c["text"] = _build(c["response"])
    return cases


CASES = _load_cases()


#: How long a grade may run past its deadline before the deadline counts as broken. Unwinding sympy
#: after the raise is instant on an idle core, but took 1 s with the two cores shared four ways (a
#: fresh-clone run beside two busy loops: c097 2.0 s at a 1 s deadline). The timeout cases run for
#: over 20 s without it (c094-c096; c097 ends by itself after 3 s, so it is proven by its verdict).
OVERRUN_S = 10


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_labeled_case(case: dict) -> None:
    timeout = case.get("timeout", 5)
    clear_caches()  # time the cold path
    t0 = time.monotonic()
    v = grade(case["text"], case["gold"], "math_verify", timeout=timeout)
    elapsed = time.monotonic() - t0
    assert v.correct is case["math_verify"], (case["note"], v)
    assert elapsed <= timeout + OVERRUN_S, f"{case['id']} took {elapsed:.1f}s"
    if case["note"].endswith("timeout"):  # the deadline ended it, not the work
        assert v.error == "timeout", (case["note"], v)
    if "extracted" in case:  # the answer as a reader would write it down (labelled by hand)
        assert v.extracted == case["extracted"], (case["note"], v)
    if "error" in case:
        assert v.error == case["error"], (case["note"], v)
    p = grade(case["text"], case["gold"], "paper")
    assert p.correct is case["paper"], (case["note"], p)
    if "math_verify_fallback" in case:
        t0 = time.monotonic()
        fb = grade(case["text"], case["gold"], allow_fallback=True, timeout=timeout)
        assert fb.correct is case["math_verify_fallback"], (case["note"], fb)
        assert time.monotonic() - t0 <= timeout + OVERRUN_S


def test_grade_many_pool_matches_grade() -> None:
    """The process pool gives the same verdicts as grade(); every item stays bounded."""
    cases = [c for c in CASES if c.get("timeout", 5) <= 1 or "timeout" not in c]
    texts = [c["text"] for c in cases]
    golds = [c["gold"] for c in cases]
    # 1 s was too short for an ordinary item with the machine's two cores busy (a suite run beside
    # Ray tests: c062 "timeout"); the pathological items never end, so they time out at any bound
    timeout = 3
    clear_caches()
    t0 = time.monotonic()
    pooled = grade_many(texts, golds, processes=2, timeout=timeout)
    elapsed = time.monotonic() - t0
    n_timeouts = sum(v.error == "timeout" for v in pooled)
    assert n_timeouts >= 3  # the pathological items
    # ~1 s pool start-up, plus at most (timeout + 1) per timed-out item spread over 2 workers.
    assert elapsed < 15 + n_timeouts * (timeout + 1)
    for c, v in zip(cases, pooled):  # a timeout case's verdict is its deadline's (1 s), not this 3 s one
        assert c["note"].endswith("timeout") or v.correct is c["math_verify"], (c["id"], c["note"], v)
    in_proc = grade_many(texts, golds, processes=0, timeout=timeout)
    assert [v.correct for v in in_proc] == [v.correct for v in pooled]
    paper = grade_many(texts, golds, "paper")
    assert [v.correct for v in paper] == [c["paper"] for c in cases]


def test_pool_survives_a_killed_worker() -> None:
    """A worker that dies mid-item yields an error verdict for that item; the rest finish."""
    slow = "\\boxed{8^{8^{8^{8^{8}}}}}"  # not graded before: no worker has it memoized as a timeout
    texts = [slow] * 2 + [f"\\boxed{{\\frac{{{i}\\pi}}{{7}}}}" for i in range(1, 30)]  # pi: no fast path
    golds = ["1", "1"] + ["\\frac{3\\pi}{7}"] * 29
    clear_caches()
    pool = graders._get_pool(2)

    def killer() -> None:
        time.sleep(1.0)
        pool.workers[0].proc.kill()

    th = threading.Thread(target=killer)
    th.start()
    out = grade_many(texts, golds, processes=2, timeout=3)
    th.join()
    assert len(out) == len(texts)
    assert all(v is not None for v in out)
    assert [v.correct for v in out[2:]] == [i == 3 for i in range(1, 30)]
    assert {out[0].error, out[1].error} <= {"timeout", "worker died"}


def test_grade_from_a_thread_uses_the_pool() -> None:
    """Signals only work in the main thread: grade() from a thread must still honour timeouts."""
    result: list[Verdict] = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: result.append(grade("\\boxed{(10^{100000})!}", "5", timeout=1)))
    th.start()
    th.join(timeout=20)
    assert result and result[0].correct is False and result[0].error == "timeout"
    assert time.monotonic() - t0 < 10  # includes pool start-up
    ok: list[Verdict] = []
    th = threading.Thread(target=lambda: ok.append(grade("\\boxed{\\frac{2}{4}}", "\\frac12")))
    th.start()
    th.join(timeout=20)
    assert ok[0].correct is True


_SIMPLE_FINAL_BOX = re.compile(r"\\boxed\{([^{}]*)\}[\s$.]*$")


def test_verdicts_equal_plain_math_verify_on_simple_final_boxes() -> None:
    """Where the answer is unambiguous -- one box, no nested braces, at the very end -- the grader's
    verdict equals plain math-verify (default configs) on that box, extracted here by a regex."""
    checked = 0
    for c in CASES:
        text = c["text"]
        m = _SIMPLE_FINAL_BOX.search(text)
        if c.get("timeout") or len(text) > 10_000 or not m or text.count("\\boxed") != 1 or "nswer" in text:
            continue
        expected = verify(parse("\\boxed{" + c["gold"] + "}"), parse("\\boxed{" + m.group(1) + "}"))
        assert grade(text, c["gold"]).correct is bool(expected), c["id"]
        checked += 1
    assert checked >= 20


# Integer answers in the wrappers models write: the grader takes its integer fast path for them, and
# must give the verdict plain math-verify gives on the same one-line response.
INT_ANSWER_FORMS = ["{n}", "${n}$", "{n}.", "${n}$.", "{n}^\\circ", "{n}^{\\circ}", "${n}^\\circ$", "${n}^{\\circ}$",
                    "\\({n}\\)", "{n} ^\\circ", "$ {n} $", "{n}^\\circ."]  # fmt: skip
INT_BOX_FORMS = ["{n}", "{n}^\\circ", "{n}^{\\circ}", "${n}$"]


def test_integer_wrappers_agree_with_math_verify() -> None:
    ints = ["25", "025", "0", "-3", "3", "100", "0100", "-07", "999999999999999", "7"]
    golds = ["25", "3", "-3", "0", "100", "7"]
    responses = [f"Answer: {f.replace('{n}', n)}" for f in INT_ANSWER_FORMS for n in ints]
    responses += [f"The answer is $\\boxed{{{f.replace('{n}', n)}}}$" for f in INT_BOX_FORMS for n in ints]
    for r in responses:
        pred, kind = graders.extract_final_answer(r)
        assert graders.int_answer(pred, kind) is not None, r  # the fast path is taken
        for g in golds:
            expected = bool(verify(parse("\\boxed{" + g + "}"), parse(r)))
            assert grade(r, g).correct is expected, (r, g)
    assert graders._int_fast_path("1" * 16, "1" * 16, "boxed") is None  # beyond 15 digits: sympy


def _exact_form(rng: random.Random) -> str:
    """A random rational or single square root, written as models write them."""
    a, c = rng.randint(0, 30), rng.randint(1, 40)
    b = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 18, 20, 27, 45, 50])
    forms = [f"{a}", f"{a}/{c}", f"\\frac{{{a}}}{{{c}}}", f"\\dfrac{{{a}}}{{{c}}}", f"\\tfrac{{{a}}}{{{c}}}",
             f"\\frac{{-{a}}}{{{c}}}", f"\\frac{a % 10}{max(c % 10, 1)}", f"{a}\\sqrt{{{b}}}", f"{a} \\sqrt{{{b}}}",
             f"\\sqrt{{{b}}}", f"\\sqrt{b % 10}", f"{a}\\sqrt{b % 10}", f"\\frac{{{a}\\sqrt{{{b}}}}}{{{c}}}",
             f"\\frac{{\\sqrt{{{b}}}}}{{{c}}}", f"\\frac{{{a}}}{{{c}}}\\sqrt{{{b}}}"]  # fmt: skip
    return ("-" if rng.random() < 0.2 else "") + rng.choice(forms)


def test_exact_fast_path_agrees_with_math_verify() -> None:
    """Rationals and single square roots take the exact fast path; its verdict is plain math-verify's
    on the same answer (a bare Answer line is read as math: the reference writes its $...$)."""
    rng = random.Random(0)
    pairs = [(_exact_form(rng), _exact_form(rng)) for _ in range(100)]
    for _ in range(25):  # equal values written differently
        a, c, k, b = rng.randint(1, 9), rng.randint(2, 9), rng.randint(2, 4), rng.choice([2, 3, 5, 6, 7])
        pairs += [(f"\\frac{{{a}}}{{{c}}}", f"\\frac{{{a * k}}}{{{c * k}}}"), (f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}"),
                  (f"\\frac{{{a}\\sqrt{{{b}}}}}{{{c}}}", f"\\frac{{{a}}}{{{c}}}\\sqrt{{{b}}}")]  # fmt: skip
    fast = agree = 0
    for gold, ans in pairs:
        for response, reference in ((f"Answer: {ans}", f"Answer: ${ans}$"), (f"Answer: ${ans}$", f"Answer: ${ans}$"),
                                    (f"So $\\boxed{{{ans}}}$.", f"So $\\boxed{{{ans}}}$.")):  # fmt: skip
            pred, kind = graders.extract_final_answer(response)
            fast += graders._fast_path(gold, pred, kind) is not None
            expected = bool(verify(parse("\\boxed{" + gold + "}"), parse(reference)))
            assert grade(response, gold).correct is expected, (gold, response)
            agree += expected
    assert fast == 3 * len(pairs) and agree >= len(pairs)  # every form on the fast path; many equal


def test_aime_style_responses_never_reach_math_verify(monkeypatch) -> None:
    """What makes AIME-style grading fast (>= 2,000 responses/s: bench/grader_throughput.py measures
    it side by side): 4k-character chains of thought ending in an integer box are graded by the
    integer fast path, never by math-verify. Verdicts: integer equality, written here."""
    import rpg_eval.graders as graders_mod

    def no_math_verify(*_args, **_kwargs):
        raise AssertionError("math-verify was called on an integer answer")

    monkeypatch.setattr(graders_mod, "_mv_check", no_math_verify)
    monkeypatch.setattr(graders_mod, "_mv_check_unbounded", no_math_verify)
    rng = random.Random(1)
    body = "We compute the quantity step by step and simplify. " * 80
    golds = [str(rng.randint(0, 999)) for _ in range(30)]
    texts, gs, answers = [], [], []
    for i in range(4000):
        g = golds[i % 30]
        ans = g if rng.random() < 0.3 else str(rng.randint(0, 999))
        texts.append(body + f"Thus the answer is $\\boxed{{{ans}}}$.")
        gs.append(g)
        answers.append(ans)
    clear_caches()
    out = grade_many(texts, gs, processes=1)
    assert [v.correct for v in out] == [int(a) == int(g) for a, g in zip(answers, gs)]
    assert sum(v.correct for v in out) > 1000


def test_rewards_and_bad_grader() -> None:
    assert grade("\\boxed{5}", "5").reward == 1.0
    assert grade("\\boxed{4}", "5").reward == 0.0
    assert grade("Answer: 5", "5", "paper").reward == 1.0
    assert grade("\\boxed{5}", "5", "paper").reward == -1.0
    with pytest.raises(ValueError, match="grader"):
        grade("x", "5", "nope")
    with pytest.raises(ValueError, match="length"):
        grade_many(["a"], ["1", "2"])


@pytest.mark.parametrize(
    ("raw", "norm"),
    [("025", "025"), ("1,000", "1000"), ("336^\\circ", "336"), ("x = \\frac12", "\\frac{1}{2}"),
     ("\\text{(C)}", "(C)"), ("20 minutes", "20")]
)  # fmt: skip
def test_minerva_normalization(raw: str, norm: str) -> None:
    assert normalize_final_answer(raw) == norm


# --------------------------------------------------------------------------- issue #19: items 6 and 13


@pytest.mark.parametrize("timeout", [1e10, float("nan"), 0.0])
def test_timeout_is_checked_where_it_enters(timeout: float) -> None:
    """`timeout=1e10` made setitimer raise OverflowError, recorded as the verdict (x^2+1 graded
    wrong); NaN and inf were accepted."""
    with pytest.raises(ValueError, match="timeout"):
        grade("\\boxed{x^2+1}", "x^2+1", timeout=timeout)
    with pytest.raises(ValueError, match="timeout"):
        grade_many(["\\boxed{x^2+1}"], ["x^2+1"], timeout=timeout, processes=0)
    assert grade("\\boxed{x^2+1}", "x^2+1", timeout=graders.MAX_TIMEOUT).correct


def test_a_final_box_repeated_many_times_is_one_answer() -> None:
    """Degenerate RL outputs repeat their final box: `\\boxed{7}` 400 times was "answer too long"
    and graded wrong (plain math-verify: right)."""
    for text, gold in (
        ("\\boxed{7} " * 400, "7"),
        ("\\boxed{\\frac{7}{2}}, " * 100, "7/2"),
        ("$\\boxed{7}$ " * 30, "7"),
    ):
        v = grade(text, gold)
        assert v.correct and v.error is None and len(v.extracted) < 20, (text[:30], v)
    assert not grade("\\boxed{7} " * 400, "8").correct


@pytest.mark.parametrize(
    "text",
    ["(a) \\boxed{(3,3)} (b) \\boxed{(1,1)}",
     "The answer to part (a) is \\boxed{(3, 3)}, and the answer to part (b) is \\boxed{(1, 1)}."]
)  # fmt: skip
def test_boxes_of_labelled_parts_are_one_answer(text: str) -> None:
    """A multi-part answer in separate boxes joined by prose that labels the parts was graded by
    its last box only (plain math-verify joins every box: right)."""
    assert grade(text, "(3, 3), (1, 1)").correct, grade(text, "(3, 3), (1, 1)")
    assert grade(text, "(1, 1), (3, 3)").correct  # a set, as math-verify reads it
    assert not grade(text, "(3, 3), (2, 2)").correct


def test_labels_before_a_one_part_gold_leave_the_last_box() -> None:
    """Against a gold of one part, labelled boxes are the response's own sub-steps: the last box
    is the answer (the joining above needs a gold of several parts)."""
    text = "Part (a) is \\boxed{5} and the final answer to the question is \\boxed{7}"
    assert grade(text, "7").correct and not grade(text, "5").correct
    assert grade("First part: \\boxed{1}\n\nSecond part: \\boxed{2}", "2").correct


@pytest.mark.parametrize(
    "text",
    ["\\boxed{12}. Wait, recheck: \\boxed{13}", "\\boxed{12} for part (a)... no, actually \\boxed{13}",
     "(a) \\boxed{12}\n\nWait, that is wrong. (a) \\boxed{13}"]
)  # fmt: skip
def test_a_corrected_box_is_still_the_last_one(text: str) -> None:
    assert grade(text, "13").correct and not grade(text, "12").correct


# Issue 31 item 9: written for this project, truths reasoned by hand (not from the grader's output).
RESTATED = [
    # (response, gold, correct): an intermediate value restated many times, then the final answer
    ("$\\boxed{12}$ " * 60 + "$\\boxed{15}$", "15", True),
    ("\\boxed{\\frac{3}{4}}\n" * 200 + "\\boxed{\\frac{4}{5}}", "3/4", False),  # 3/4 was not the answer
    ("\\boxed{9}, " * 40 + "\\boxed{11}", "9, 11", False),  # nor a list of both
    ("\\boxed{2}, \\boxed{8}\n" * 30, "2, 8", True),  # a list repeated: the list
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "1, 2, 3", True),  # no value restated: a list, as before
]


@pytest.mark.parametrize("text,gold,truth", RESTATED)
def test_a_value_restated_before_the_final_box_is_intermediate(text: str, gold: str, truth: bool) -> None:
    """`\\boxed{5}` x 50 then `\\boxed{7}` was graded as the list "5, 7": a list states each part once,
    so a restated value among joined boxes was an intermediate one and the answer follows it."""
    v = grade(text, gold)
    assert v.correct is truth, (text[-60:], gold, v)


MULTI_PART = [
    # (response, gold, correct): two parts in boxes, only the first one labelled, golds of two parts
    # written as a set or joined by words (their commas are inside braces, or there are none)
    ("So \\boxed{(2,5)} for part (a) and \\boxed{(5,2)}.", "\\{(2,5), (5,2)\\}", True),
    ("So \\boxed{(2,5)} for part (a) and \\boxed{(5,3)}.", "\\{(2,5), (5,2)\\}", False),
    ("We get \\boxed{12} for part (a) and \\boxed{20}", "12 \\text{ and } 20", True),
    ("We get $\\boxed{12}$ for part (a) and $\\boxed{21}$", "\\left\\{ 12, 20 \\right\\}", False),
    ("Part (a) is \\boxed{12} and the final answer to the question is \\boxed{20}", "20", True),  # one part
]


@pytest.mark.parametrize("text,gold,truth", MULTI_PART)
def test_labelled_boxes_against_a_gold_of_several_parts_in_any_notation(
    text: str, gold: str, truth: bool
) -> None:
    """Labelled boxes were joined only when the gold had top-level commas: against "\\{(2,5), (5,2)\\}"
    or "12 \\text{ and } 20" the last box alone was graded. A gold's parts are what math-verify reads
    as several values: a set's elements, items joined by commas, ";" or and/or."""
    v = grade(text, gold)
    assert v.correct is truth, (text, gold, v)


@pytest.mark.parametrize(
    "gold,parts",
    [("(3, 3), (1, 1)", 2), ("[0, 1)", 1), ("1{,}000", 1), ("\\{1, 2, 3\\}", 3), ("\\{1\\} \\cup \\{2\\}", 1),
     ("x = 3 \\text{ or } x = -3", 2), ("\\text{Tom and Jerry}", 1)]
)  # fmt: skip
def test_answer_parts_counts_what_math_verify_reads_as_several_values(gold: str, parts: int) -> None:
    assert graders.answer_parts(gold) == parts
