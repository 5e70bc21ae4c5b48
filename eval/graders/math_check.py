"""math-verify's check of one extracted answer against a gold answer, bounded in time and memoized.

math-verify's own timeouts use ``signal.alarm`` (main thread only, whole seconds), and its
``TimeoutException`` derives from ``BaseException``.  We therefore disable them and bound the
whole parse+verify with our own ``setitimer`` deadline (main thread only; other threads and
batches go through ``rpg_eval.graders.pool``). Integer answers and small exact values take fast
paths that never reach sympy. The public API is ``rpg_eval.graders``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import signal
import threading
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from ..limits import MAX_TIMEOUT
from .answers import (
    EXTRACTED_PREVIEW_CHARS,
    MAX_ANSWER_CHARS,
    TAIL_KINDS,
    Verdict,
    answer_parts,
    extract_final_answer,
)

DEFAULT_TIMEOUT = 5.0  # seconds of math-verify work per (gold, answer) pair
# Fallback parsing only looks at the end of a response: the answer is there, and parsing a
# megabyte of text with math-verify's regexes is slow.
FALLBACK_TAIL_CHARS = 2000
_CACHE_MAX = 200_000


_mv = None  # lazily imported math_verify pieces (keeps `import rpg_eval.graders` cheap)
_gold_cache: dict[str, list] = {}
# A check's result: (correct, extracted, error), or for a timeout (False, extracted, "timeout",
# blame) where blame says the answer's own work ran out of time (see _timed_out).
Result = tuple
_verdict_cache: dict[tuple[str, str, str], Result] = {}
# Answers (pred, kind) whose check ran out of time once: math-verify's cost on a pathological
# answer (a power tower, a huge factorial) is its evaluation, whatever the gold, so a model that
# repeats one such answer across problems pays the time limit once, not once per problem.
_timeout_answers: set[tuple[str, str]] = set()


def _math_verify():
    global _mv
    if _mv is None:
        import logging

        import math_verify.parser as mvp
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
        from math_verify.errors import TimeoutException

        mvp.TIMEOUT_WARNING_SHOWN = True  # we disable its alarms on purpose (own deadline)
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        anchored = [
            LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=0),
            ExprExtractionConfig(try_extract_without_anchor=False),
        ]
        free = [LatexExtractionConfig(), ExprExtractionConfig()]
        # Warm up outside any deadline (both configs): the first parse builds the LaTeX grammar and
        # imports sympy's parts (seconds on a busy machine), which would otherwise count against the
        # first item -- in a pool worker too, which says ready only after this.
        g = parse("\\boxed{\\frac{1}{2}}", free, parsing_timeout=None)
        verify(g, parse("\\boxed{\\sqrt{2}/2}", anchored, parsing_timeout=None), timeout_seconds=None)
        _mv = (parse, verify, anchored, free, TimeoutException)
    return _mv


_fired = [False]
_RE_RAISE_S = 0.1  # after the deadline, the timeout is raised again this often until grading stops
_phase = ["answer"]  # what _mv_check_unbounded is doing: "gold" (parsing it) or "answer"


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise math_verify's TimeoutException after ``seconds`` (main thread only)."""
    timeout_exc = _math_verify()[4]
    _fired[0] = False
    closing = [False]

    def handler(signum, frame):
        # math-verify swallows TimeoutException in places (verify returns False), so the
        # flag tells the caller that the verdict is a timeout, not a real False.
        _fired[0] = True
        if not closing[0]:
            raise timeout_exc("grading timed out")

    old = signal.signal(signal.SIGALRM, handler)
    # The timer repeats: an exception raised where Python drops it (a weakref callback during
    # sympy's parse prints "Exception ignored" and parsing goes on) is raised again 0.1 s later.
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01), _RE_RAISE_S)
    try:
        yield
    finally:
        closing[0] = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def wrap_prediction(pred: str, kind: str) -> str:
    """The string math-verify parses for an extracted answer of ``kind`` (a tail kind: as it is)."""
    if kind == "boxed":
        return "\\boxed{" + pred + "}"
    if kind == "answer":
        delimited = "$" in pred.replace("\\$", "") or "\\(" in pred or "\\[" in pred
        if delimited or not any(c in pred for c in "\\{^"):
            return "Answer: " + pred  # delimited math or plain text: math-verify's anchor handles it
        # Bare LaTeX ("\frac12", "2\sqrt3") only parses inside math delimiters.
        return "Answer: $" + pred.rstrip(" .") + "$"
    return pred  # a tail kind: the response tail, parsed with math-verify's anchors (or without, fallback)


def wrap_gold(gold: str) -> str:
    """Gold answers need a delimiter to parse; strip any $...$ the data carries."""
    g = gold.strip()
    if len(g) >= 2 and g[0] == "$" and g[-1] == "$":
        g = g[1:-1]
    return "\\boxed{" + g + "}"


# Integers (<= 15 digits: math-verify compares at 15 digits precision; an answer's also in degrees,
# "25^\circ", which math-verify reads as 25: a gold's not always), rationals and single square roots
# with small integers, in the forms models write: "\frac{9}{32}", "\dfrac{-7}{4}", "9/32", "2\sqrt{5}",
# "\sqrt8", "\frac{5\sqrt{2}}{3}", "\frac{5}{3}\sqrt{2}"; in "$...$", "\(...\)" or with a final period
# (_EXACT_WRAP).  Their exact values decide math-verify's verdict (equal values simplify to 0; unequal
# ones with integers below 10^4 differ far above its 15-digit comparison): tests/test_eval_graders.py
# checks the grammar against math-verify itself.  Decimals are left to math-verify (it rounds them).
_N = r"[0-9]{1,4}"  # ASCII digits only: int() also reads full-width ones
_SQRT = rf"\\sqrt[ \t]*(?:\{{[ \t]*({_N})[ \t]*\}}|([0-9]))"
_FRAC = r"\\[dt]?frac"
_EXACT_FORMS = [
    (re.compile(r"([0-9]{1,15})(?:[ \t]*\^[ \t]*(?:\\circ|\{\\circ\}))?"), lambda m: (Fraction(int(m[1])), 1)),
    (re.compile(rf"({_N})[ \t]*/[ \t]*({_N})"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*(-?{_N})[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"{_FRAC}([0-9])([0-9])"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"(?:({_N})[ \t]*)?{_SQRT}"), lambda m: (_q(m[1] or "1", "1"), int(m[2] or m[3]))),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*(?:({_N})[ \t]*)?{_SQRT}[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}"),
     lambda m: (_q(m[1] or "1", m[4]), int(m[2] or m[3]))),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*({_N})[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}[ \t]*{_SQRT}"),
     lambda m: (_q(m[1], m[2]), int(m[3] or m[4])))
]  # fmt: skip
_EXACT_WRAP = {
    "answer": re.compile(r"\$[ \t]*(.+?)[ \t]*\$\.?|\\\([ \t]*(.+?)[ \t]*\\\)\.?|(.+?)\.?"),
    "boxed": re.compile(r"\$[ \t]*(.+?)[ \t]*\$|(.+)"),
}


def _q(num: str, den: str) -> Fraction:
    if int(den) == 0:
        raise ZeroDivisionError
    return Fraction(int(num), int(den))


@functools.lru_cache(maxsize=4096)
def _squarefree(n: int) -> tuple[int, int]:
    """n = k^2 * m with m squarefree: (k, m)."""
    k, m, f = 1, n, 2
    while f * f <= m:
        while m % (f * f) == 0:
            m //= f * f
            k *= f
        f += 1
    return k, m


def exact_answer(text: str, kind: str) -> tuple[Fraction, int] | None:
    """(q, m) with value q * sqrt(m), m squarefree, when ``text`` is in the exact grammar above
    (``kind``: "answer", "boxed", or "gold": boxed, not in degrees)."""
    wrap = _EXACT_WRAP.get("boxed" if kind == "gold" else kind)
    w = wrap.fullmatch(text.strip(" \t")) if wrap else None
    if w is None:
        return None
    body = next(g for g in w.groups() if g is not None)
    sign = 1
    if body.startswith("-"):
        sign, body = -1, body[1:].lstrip()
    if kind == "gold" and "^" in body:
        return None
    for form, value in _EXACT_FORMS:
        m = form.fullmatch(body)
        if m is None:
            continue
        try:
            q, radicand = value(m)
        except ZeroDivisionError:
            return None
        k, rest = _squarefree(radicand)
        q = sign * q * k
        return (q, rest) if q and rest else (Fraction(0), 1)
    return None


def _fast_path(gold: str, pred: str, kind: str) -> Result | None:
    """A verdict without sympy where math-verify's is known: the gold and the answer both in the
    exact grammar above (integers, rationals, single square roots)."""
    g = exact_answer(gold, "gold") if kind not in TAIL_KINDS else None
    p = exact_answer(pred, kind) if g is not None else None
    return None if p is None else (p == g, pred, None)


def _mv_check_unbounded(gold: str, pred: str, kind: str) -> Result:
    """parse(gold) + parse(pred) + verify, without any timeout.  Returns (correct, extracted, error).

    ``_phase[0]`` says what is running ("gold" while the gold is parsed), so a timeout can be
    blamed on the answer only when the answer's own work ran out of time."""
    fast = _fast_path(gold, pred, kind)
    if fast is not None:
        return fast
    parse, verify, anchored, free, _ = _math_verify()
    g = _gold_cache.get(gold)
    if g is None:
        _phase[0] = "gold"
        g = parse(wrap_gold(gold), free, parsing_timeout=None)
        if _fired[0]:
            # math-verify swallowed our deadline and returned []: not a verdict on the gold.
            return _timed_out(pred, kind, blame=False)
        if len(_gold_cache) > 10_000:
            _gold_cache.clear()
        _gold_cache[gold] = g
    _phase[0] = "answer"
    if not g:
        return False, _pred_or_none((gold, pred, kind)), "gold unparsable"
    p = parse(wrap_prediction(pred, kind), free if kind == "fallback" else anchored, parsing_timeout=None)
    if not p:
        return (False, _pred_or_none((gold, pred, kind)), "no answer" if kind in TAIL_KINDS else "unparsable")
    extracted = pred if kind not in TAIL_KINDS else (p[-1] if isinstance(p[-1], str) else str(p[0]))
    return bool(verify(g, p, timeout_seconds=None)), preview(extracted), None


def _pred_or_none(job: tuple[str, str, str]) -> str | None:
    return None if job[2] in TAIL_KINDS else job[1]


def preview(text: str | None) -> str | None:
    """``text`` bounded to MAX_ANSWER_CHARS (what a Verdict stores as ``extracted``)."""
    if text is None or len(text) <= MAX_ANSWER_CHARS:
        return text
    return text[:EXTRACTED_PREVIEW_CHARS] + "..."


def _timed_out(pred: str, kind: str, blame: bool = True) -> Result:
    """A timeout result; ``blame``: the answer's own work ran out of time (see _timeout_answers)."""
    return False, _pred_or_none((pred, pred, kind)), "timeout", blame


def _mv_check(gold: str, pred: str, kind: str, timeout: float) -> Result:
    """_mv_check_unbounded under a signal deadline (caller must be the main thread).

    An answer that ran out of time once is a timeout for every gold (see _timeout_answers)."""
    if (pred, kind) in _timeout_answers:
        return _timed_out(pred, kind)
    timeout_exc = _math_verify()[4]
    _phase[0] = "answer"
    try:
        with _deadline(timeout):
            res = _mv_check_unbounded(gold, pred, kind)
        if _fired[0] and res[2] != "timeout":
            res = _timed_out(pred, kind, blame=_phase[0] == "answer")
    except timeout_exc:
        res = _timed_out(pred, kind, blame=_phase[0] == "answer")
    except Exception as e:  # noqa: BLE001 - sympy raises anything; a crash is a wrong answer
        res = (False, _pred_or_none((gold, pred, kind)), type(e).__name__)
    _note_timeout(pred, kind, res)
    return res


def _note_timeout(pred: str, kind: str, res: Result) -> None:
    """Remember an answer whose own check ran out of time."""
    if res[2] == "timeout" and len(res) > 3 and res[3]:
        if len(_timeout_answers) >= _CACHE_MAX:
            _timeout_answers.clear()
        _timeout_answers.add((pred, kind))


def _mv_job(response: str, gold: str, allow_fallback: bool) -> tuple[str, str, str] | Verdict:
    """Extraction step: either a finished Verdict or a (gold, pred, kind) job to check."""
    pred, kind = extract_final_answer(response, answer_parts(gold))
    if pred is None:
        tail = response[-FALLBACK_TAIL_CHARS:]
        if allow_fallback:
            return gold, tail, "fallback"
        if "answer" in tail.lower():  # math-verify's own anchors: "the answer is 42", "Answer \[ 9 \]"
            return gold, tail, "anchored"
        return Verdict(False, None, "math_verify", "no answer")
    if not pred:
        return Verdict(False, "", "math_verify", "empty answer")
    if len(pred) > MAX_ANSWER_CHARS:
        return Verdict(False, preview(pred), "math_verify", "answer too long")
    return gold, pred, kind


def _cache_put(key: tuple[str, str, str], value: Result) -> None:
    """Memoize a verdict; timeouts too (a repeated pathological pair must not pay again)."""
    _note_timeout(key[1], key[2], value)
    if len(_verdict_cache) >= _CACHE_MAX:
        _verdict_cache.clear()
    _verdict_cache[key] = value


def _cached(job: tuple[str, str, str]) -> Result | None:
    hit = _verdict_cache.get(job)
    if hit is None and (job[1], job[2]) in _timeout_answers:
        hit = _timed_out(job[1], job[2])
    return hit


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- public API


def check_timeout(timeout: Any) -> float:
    """``timeout`` as seconds, or ValueError: a finite number in (0, MAX_TIMEOUT] (a NaN, an
    infinity or 1e10 would reach setitimer, which overflows, and be recorded as the verdict)."""
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout)
    if not (ok and 0 < timeout <= MAX_TIMEOUT):
        raise ValueError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {timeout!r}")
    return float(timeout)


def clear_caches() -> None:
    """Forget memoized verdicts and timeouts in this process (benchmarks and tests that time
    cold grading); a running worker pool keeps its own until shutdown_pool()."""
    _verdict_cache.clear()
    _gold_cache.clear()
    _timeout_answers.clear()
    if _mv is not None:  # math-verify's and sympy's own memos, for cold timings
        import math_verify.parser as mvp
        from sympy.core.cache import clear_cache

        for fn in (mvp.parse_latex_cached, mvp.parse_expr_cached, mvp.extract_latex):
            fn.cache_clear()
        clear_cache()
