"""Answer graders shared by training rewards and evaluation.

Two graders, one API (see docs/contracts.md):

* ``"math_verify"`` -- the final answer is extracted cheaply by string scanning (the last
  complete ``\\boxed{...}`` or the last ``Answer:`` line, whichever comes later), then only that
  short string is parsed by math-verify and compared with the gold answer (parsed as
  ``\\boxed{gold}``).  The anchor-free fallback (parse any number in the response tail) is
  off by default because it invents answers ("3+2=5." -> 3); ``allow_fallback=True`` turns
  it on.  Reward 1/0.
* ``"paper"`` -- the grader of the RPG paper (verl's ``math_dapo.compute_score``): the last
  ``Answer:`` line in the final 300 characters, Minerva normalization, exact string match.
  Reward +1/-1.

math-verify's own timeouts use ``signal.alarm`` (main thread only, whole seconds), and its
``TimeoutException`` derives from ``BaseException``.  We therefore disable them and bound the
whole parse+verify with our own ``setitimer`` deadline in the main thread; other threads and
``grade_many`` run the work in a process pool (rpg_eval.grader_pool) whose workers are killed if
a C-level loop ignores the signal, so every item ends within ``timeout + 1`` seconds.

Imports math_verify only (no lm-eval, no torch), so the training reward can use it anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

GRADERS = ("math_verify", "paper")
# Bumped whenever a verdict can change (run.json records it: a resume never mixes verdicts of two
# grader versions).  2: boxes joined by connectors are one answer, "\boxed{25.}" = 25, answers
# over MAX_ANSWER_CHARS are "answer too long".  3: a box repeated is one answer ("\boxed{7}" x 400
# is 7); against a gold of several parts, boxes joined by prose that labels the parts ("for part (a)
# and") are one answer.  4: a value restated among joined boxes was an intermediate one ("\boxed{5}"
# x 50 then "\boxed{7}" is 7, not "5, 7"); a gold's parts are also a set's elements and items joined
# by "and"/"or"/";" ("\{4, 9\}", "4 \text{ and } 9" have two).
GRADER_VERSION = 4
DEFAULT_TIMEOUT = 5.0  # seconds of math-verify work per (gold, answer) pair
# Longest time limit accepted: setitimer overflows near 1e10 s, and no answer is worth an hour.
MAX_TIMEOUT = 3600.0
# Fallback parsing only looks at the end of a response: the answer is there, and parsing a
# megabyte of text with math-verify's regexes is slow.
FALLBACK_TAIL_CHARS = 2000
# Kinds of answer that are a response tail handed to math-verify whole (not an extracted string):
# "anchored" (no box or "Answer:" line, but the word "answer": math-verify's own anchors such as
# "the answer is 42", "Answer \[ 9 \]" find it) and "fallback" (--allow-fallback: anchor-free).
TAIL_KINDS = ("anchored", "fallback")
# Longest final answer handed to math-verify: real answers (tuples, intervals, matrices of a
# competition problem) are far shorter; a longer one is graded wrong with error "answer too
# long" without parsing it, so hostile output cannot buy seconds of regex/sympy work.
MAX_ANSWER_CHARS = 1000
# Characters of an over-long answer kept in Verdict.extracted (records stay small).
EXTRACTED_PREVIEW_CHARS = 200
_CACHE_MAX = 200_000
_INT_RE = re.compile(r"-?[0-9]{1,15}")  # <= 15 digits: math-verify compares at 15 digits precision
# Integer answers in the wrappers a model writes around them, which math-verify reads as that
# integer: "$25$", "\(25\)", "25^\circ", "25^{\circ}", a final period (Answer lines only; a
# box's period is already dropped).  tests/test_eval_graders.py checks every form of this grammar
# against math-verify itself.
_INT_CORE = r"(-?[0-9]{1,15})(?:[ \t]*\^[ \t]*(?:\\circ|\{\\circ\}))?"
_INT_ANSWER_RE = re.compile(
    rf"(?:\$[ \t]*{_INT_CORE}[ \t]*\$|\\\([ \t]*{_INT_CORE}[ \t]*\\\)|{_INT_CORE})\.?"
)
_INT_BOXED_RE = re.compile(rf"\$[ \t]*{_INT_CORE}[ \t]*\$|{_INT_CORE}")


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one response.

    correct: the grader's decision.  extracted: the answer string the grader compared (raw
    boxed/``Answer:`` text for math_verify, the Minerva-normalized string for paper), None
    when no answer was found; at most MAX_ANSWER_CHARS long.  grader: "math_verify" or "paper".
    error: "timeout", "no answer", "empty answer", "answer too long", "unparsable", "gold
    unparsable", "worker died", an exception name, or None.
    """

    correct: bool
    extracted: str | None
    grader: str
    error: str | None = None

    @property
    def reward(self) -> float:
        """Training reward: math_verify -> 1/0, paper -> +1/-1 (as the paper's verl code)."""
        if self.grader == "paper":
            return 1.0 if self.correct else -1.0
        return 1.0 if self.correct else 0.0

    def to_dict(self) -> dict:
        """Plain dict for json records."""
        return asdict(self)


# --------------------------------------------------------------------------- extraction


def _box_at(text: str, pos: int, limit: int = MAX_ANSWER_CHARS) -> tuple[str, int] | None:
    """Content and end (index after the closing brace) of the box command starting at ``pos``.

    None when it is unterminated.  A content longer than ``limit`` is cut at ``limit + 1``
    characters (the caller reports "answer too long"): scanning a 50 MB box char by char in
    Python would take seconds, and no real answer is that long.
    """
    i = pos + (6 if text.startswith("\\boxed", pos) else 5)
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        # "\boxed 5$": the argument is the next token.
        j = i
        while j < n and j - i <= limit and text[j] not in " $\n":
            j += 1
        return (text[i:j], j) if j > i else None
    depth = 0
    start = i + 1
    stop = min(n, start + limit + 1)
    for j in range(i, stop):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:j], j + 1
    if stop < n:
        return text[start:stop], stop  # over the limit (terminated or not)
    return None


def _last_box_pos(text: str, end: int) -> int:
    return max(text.rfind("\\boxed", 0, end), text.rfind("\\fbox", 0, end))


def last_boxed(text: str) -> tuple[str, int] | None:
    """Content and start position of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    The last occurrence decides: if it is unterminated (a truncated response) there is no
    boxed answer -- an earlier box from an intermediate step is not promoted to the answer.
    ``\\boxed 5`` (no braces) yields "5".  Contents longer than MAX_ANSWER_CHARS come back
    cut at MAX_ANSWER_CHARS + 1 characters.
    """
    pos = _last_box_pos(text, len(text))
    if pos < 0:
        return None
    box = _box_at(text, pos)
    return (box[0], pos) if box is not None else None


# What may stand between two boxes that together are one answer ("\boxed{1}, \boxed{2}",
# "\boxed{(2, 2)} \quad \text{and} \quad \boxed{(6, 2)}"): commas, "and"/"or", spacing commands
# and math delimiters; a blank line or any other word ("Wait, recheck:") separates a corrected
# answer from the one it corrects, and then the last box alone is the answer.  A one-letter
# variable being assigned ("x =", "x_2 =") may precede a box.
_CONNECTOR_RE = re.compile(
    r"(?:[ \t,;~$]|\n(?!\s*\n)|\\[,;:! ]|\\q?quad(?![A-Za-z])|\\[()]|and|or"
    r"|\\(?:text|mathrm|textrm|mbox)\{\s*(?:and|or|,)?\s*\}"
    r"|(?<![A-Za-z])[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=)*"  # "x = \boxed{3} or x = \boxed{-3}"
)
_MAX_GAP = 80  # characters between joined boxes; a connector is never longer
_MAX_JOINED = 1000  # boxes looked at before the last one (a degenerate response repeats thousands)

# When the gold answer has several parts, prose that only labels the parts may also join boxes
# ("\boxed{(3,3)} for part (a) and \boxed{(1,1)}", "Part (a): \boxed{4}. Part (b): \boxed{9}."):
# its words are all in _PART_WORDS, it holds a part label ("(b)", "b)", "part"), and nothing else --
# a word such as "Wait", "since", "actually" or "Thus" keeps the boxes apart (a correction).  With a
# one-part gold such labels are the response's own sub-steps ("Part (a) is \boxed{5} and the final
# answer to the question is \boxed{7}"): the last box is the answer.
_LABEL = r"(?:[a-hA-H]|[ivx]{1,4}|[1-9])"
_PART_TOKEN_RE = re.compile(
    rf"(?P<label>\({_LABEL}\)|(?<![A-Za-z0-9]){_LABEL}\))|(?P<word>[A-Za-z]+)"
    r"|(?P<space>\\[()]|\\[,;:! ]|\\q?quad(?![A-Za-z])|[\s,.;:$*~])"
)
_PART_WORDS = frozenset(
    [
        "for",
        "part",
        "parts",
        "case",
        "cases",
        "question",
        "and",
        "the",
        "answer",
        "answers",
        "final",
        "to",
        "is",
        "are",
        "of",
        "in",
        "respectively",
        "first",
        "second",
        "third",
        "fourth",
    ]
)
_PART_NAMES = frozenset({"part", "parts", "case", "cases", "question"})


def _labels_parts(gap: str) -> bool:
    """Whether the text between two boxes only labels the parts of one answer (see above)."""
    pos, labelled, prev = 0, False, ""
    for m in _PART_TOKEN_RE.finditer(gap):
        if m.start() != pos:
            return False  # a character no token allows ("?", "!", "=", a digit, a command)
        pos = m.end()
        if m["label"]:
            labelled = True
        elif m["word"]:
            word = m["word"].lower()
            if prev in _PART_NAMES and re.fullmatch(_LABEL, m["word"]):
                labelled = True  # "part b", "case 2"
            elif word not in _PART_WORDS:
                return False
            labelled = labelled or word in _PART_NAMES
            prev = word
    return pos == len(gap) and labelled


def _joined_boxes(text: str, pos: int, content: str, labelled: bool = False) -> str:
    """The last box's content, with the boxes before it that are joined to it by connectors
    only (see _CONNECTOR_RE) or, when ``labelled``, by prose that labels parts (_labels_parts),
    as one comma-separated answer: "(2, 2), (6, 2)"; which of the joined boxes are the answer
    when values repeat: _final_list."""
    chain, seen = [content], {content}
    total = len(content)
    for _ in range(_MAX_JOINED):
        prev = _last_box_pos(text, pos)
        if total > MAX_ANSWER_CHARS or prev < 0 or pos - prev > MAX_ANSWER_CHARS + _MAX_GAP:
            break
        box = _box_at(text, prev)
        if box is None or box[1] > pos or pos - box[1] > _MAX_GAP:
            break  # unterminated, nested around this box, or too far away
        gap_ok = _CONNECTOR_RE.fullmatch(text, box[1], pos) or (
            labelled and _labels_parts(text[box[1] : pos])
        )
        if not gap_ok:
            break
        c = _strip_box_content(box[0])
        if not c:
            break
        if c not in seen:
            seen.add(c)
            total += len(c) + 2
        chain.append(c)
        pos = prev
    return ", ".join(_final_list(chain[::-1]))


def _final_list(chain: list[str]) -> list[str]:
    """The answer among joined box values (in text order).  A list states each of its parts once,
    so a value stated again means the boxes are not one list:

    * the chain ends with one block stated twice in a row ("7 7 7", "1 2 1 2"): a degenerate output
      repeating its final answer; the answer is that block (the shortest such, of distinct values);
    * otherwise a restated value was an intermediate one ("5 5 5 7": 5 said over and over, then the
      final 7): the answer is what follows the last restatement (the last box alone when it is one).
    Without repeats the whole chain is the answer ("1 2 3")."""
    n = len(chain)
    for p in range(1, n // 2 + 1):
        block = chain[n - p :]
        if chain[n - 2 * p : n - p] == block and len(set(block)) == p:
            return block
    start, seen = 0, set()
    for i, v in enumerate(chain):
        if v in seen:
            start = i + 1
        seen.add(v)
    return chain[start:] or chain[-1:]


def _strip_box_content(content: str) -> str:
    """Box content without surrounding space and a final sentence period ("25." -> "25")."""
    c = content.strip()
    if c.endswith(".") and not c.endswith(".."):
        c = c[:-1].rstrip()
    return c


_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# The same with a bounded capture, so a 50 MB "Answer:" line is not copied to be rejected.
_ANSWER_BOUNDED_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]{1," + str(MAX_ANSWER_CHARS + 1) + "})")


def last_answer_line(text: str) -> tuple[str, int] | None:
    """Content and position of the last ``Answer: ...`` line (DAPO's regex); contents longer
    than MAX_ANSWER_CHARS come back cut at MAX_ANSWER_CHARS + 1 characters."""
    # Scan from the end: a full findall over a 1 MB response is wasted work.
    lower = text.lower()
    pos = lower.rfind("answer")
    while pos >= 0:
        m = _ANSWER_BOUNDED_RE.match(text, pos)
        if m:
            return m.group(1), pos
        pos = lower.rfind("answer", 0, pos)
    return None


def extract_final_answer(text: str, parts: int = 1) -> tuple[str | None, str]:
    """The final answer string and its kind ("boxed", "answer" or "none").

    Whichever of the last box and the last ``Answer:`` line comes later wins, so
    ``Answer: \\boxed{25}`` yields the box content "25".  Boxes joined to the last one by
    connectors only ("\\boxed{1}, \\boxed{2}") are one answer "1, 2", a repeated box counts
    once; a final period inside the box is dropped ("\\boxed{25.}" -> "25").  ``parts``: how
    many parts the expected answer has (``answer_parts(gold)``); with two or more, boxes joined
    by prose that only labels the parts ("for part (a) and") are one answer too.  An answer
    longer than MAX_ANSWER_CHARS is returned cut at MAX_ANSWER_CHARS + 1 characters (graded
    "answer too long").
    """
    box = last_boxed(text)
    line = last_answer_line(text)
    if line is not None and (box is None or line[1] > box[1]):
        if len(line[0]) > MAX_ANSWER_CHARS:
            return line[0], "answer"  # unstripped: a cut answer must not shrink under the limit
        return line[0].strip(), "answer"
    if box is not None:
        content, pos = box
        if len(content) > MAX_ANSWER_CHARS:
            return content, "boxed"
        return _joined_boxes(text, pos, _strip_box_content(content), labelled=parts > 1), "boxed"
    return None, "none"


_OPEN, _CLOSE = "([{", ")]}"


# Words and commands that join the items of a gold answer as they join boxes (_CONNECTOR_RE).
_GOLD_JOIN_RE = re.compile(
    r"\\(?:text|mathrm|textrm|mbox)\{\s*(?:and|or)\s*\}|(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])|;"
)
# A gold written as a set, "\{4, 9\}" / "\left\{ 4, 9 \right\}": its elements are its parts.
_SET_OPEN_RE = re.compile(r"\s*(?:\\left\s*)?\\\{")
_SET_CLOSE_RE = re.compile(r"(?:\\right\s*)?\\\}\s*$")


def answer_parts(gold: str) -> int:
    """Top-level items of a gold answer, as math-verify reads several values: items separated by
    commas, ";" or the words and/or ("(3, 3), (1, 1)" -> 2, "4 \\text{ and } 9" -> 2), or the
    elements of a set written around the whole gold ("\\{4, 9\\}" -> 2); commas inside brackets,
    braces or parentheses do not count ("(3, 3)" -> 1, "[0, 1)" -> 1, "1{,}000" -> 1)."""
    g = gold.strip().strip("$").strip()
    m = _SET_OPEN_RE.match(g)
    if m and _SET_CLOSE_RE.search(g) and _set_closes_at_end(g, m.end()):
        g = _SET_CLOSE_RE.sub("", g[m.end() :])
    g = _GOLD_JOIN_RE.sub(",", g)
    depth, items, current = 0, [], []
    for c in g:
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(c)
    items.append("".join(current).strip())
    return max(1, sum(1 for x in items if x))  # "4, and 9": the empty item between is no part


def _set_closes_at_end(g: str, start: int) -> bool:
    """Whether the set opened just before ``start`` (``\\{``) is closed by the ``\\}`` ending ``g``
    ("\\{1\\} \\cup \\{2\\}" is two sets, not one set of elements)."""
    depth, i = 1, start
    while i < len(g):
        if g.startswith("\\{", i):
            depth += 1
            i += 2
        elif g.startswith("\\}", i):
            depth -= 1
            if depth == 0:
                return not g[i + 2 :].strip()
            i += 2
        else:
            i += 1
    return False


# --------------------------------------------------------------------------- paper grader
# verl's recipe/dapo math_dapo.py (Minerva normalization, Lewkowycz et al. 2022).

SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]
REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva normalization exactly as verl's ``math_dapo.normalize_final_answer``."""
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


def grade_paper(response: str, gold: str) -> Verdict:
    """The RPG paper's grader: last ``Answer:`` in the final 300 chars, normalized exact match."""
    tail = response[-300:]
    matches = _ANSWER_RE.findall(tail)
    if not matches:
        # verl compares "[INVALID]" (never equal to a normalized gold) -> -1.
        return Verdict(False, None, "paper", "no answer")
    pred = normalize_final_answer(matches[-1])
    if not pred:
        # "Answer: $$" against a gold that is empty after normalization ("\boxed{}") would be an
        # exact match of nothing with nothing: no answer is never right (such golds are refused on load).
        return Verdict(False, pred, "paper", "empty answer")
    return Verdict(pred == normalize_final_answer(gold), pred, "paper", None)


def gold_damage(gold: str) -> str | None:
    """Why ``gold`` cannot be graded against (None: it can): empty after the paper grader's
    normalization (``\\boxed{}``, ``$$``, ``\\text{}``) -- nothing to compare an answer with."""
    if not normalize_final_answer(gold):
        return f"answer {gold[:60]!r} is empty after normalization (nothing to grade against)"
    return None


# --------------------------------------------------------------------------- math-verify

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
        # Warm up outside any deadline: the first parse builds the LaTeX grammar and imports sympy's
        # parts (seconds on a busy machine), which would otherwise count against the first item.
        verify(
            parse("$\\frac{1}{2}$", free, parsing_timeout=None), parse("$0.5$", free, parsing_timeout=None)
        )
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
        if (
            "$" in pred.replace("\\$", "")
            or "\\(" in pred
            or "\\[" in pred
            or not any(c in pred for c in "\\{^")
        ):
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


def int_answer(pred: str, kind: str) -> int | None:
    """The integer an extracted answer stands for when it is one in a known wrapper
    (_INT_ANSWER_RE / _INT_BOXED_RE), else None."""
    if kind == "answer":
        m = _INT_ANSWER_RE.fullmatch(pred)
    elif kind == "boxed":
        m = _INT_BOXED_RE.fullmatch(pred)
    else:
        return None
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))


# Rationals and single square roots with small integers, in the forms models write: "\frac{9}{32}",
# "\dfrac{-7}{4}", "9/32", "2\sqrt{5}", "\sqrt8", "\frac{5\sqrt{2}}{3}", "\frac{5}{3}\sqrt{2}".  Their
# exact values decide math-verify's verdict (equal values simplify to 0; unequal ones with integers
# below 10^4 differ far above its 15-digit comparison): tests/test_eval_graders.py checks the grammar
# against math-verify itself.  Decimals are left to math-verify (it rounds them to 6 places).
_N = r"[0-9]{1,4}"  # ASCII digits only: int() also reads full-width ones
_SQRT = rf"\\sqrt[ \t]*(?:\{{[ \t]*({_N})[ \t]*\}}|([0-9]))"
_FRAC = r"\\[dt]?frac"
_EXACT_FORMS = [
    (re.compile(rf"({_N})"), lambda m: (Fraction(int(m[1])), 1)),
    (re.compile(rf"({_N})[ \t]*/[ \t]*({_N})"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*(-?{_N})[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"{_FRAC}([0-9])([0-9])"), lambda m: (_q(m[1], m[2]), 1)),
    (re.compile(rf"(?:({_N})[ \t]*)?{_SQRT}"), lambda m: (_q(m[1] or "1", "1"), int(m[2] or m[3]))),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*(?:({_N})[ \t]*)?{_SQRT}[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}"),
     lambda m: (_q(m[1] or "1", m[4]), int(m[2] or m[3]))),
    (re.compile(rf"{_FRAC}[ \t]*\{{[ \t]*({_N})[ \t]*\}}[ \t]*\{{[ \t]*({_N})[ \t]*\}}[ \t]*{_SQRT}"),
     lambda m: (_q(m[1], m[2]), int(m[3] or m[4]))),
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
    """(q, m) with value q * sqrt(m), m squarefree, when ``text`` is in the exact grammar above."""
    wrap = _EXACT_WRAP.get(kind)
    w = wrap.fullmatch(text.strip(" \t")) if wrap else None
    if w is None:
        return None
    body = next(g for g in w.groups() if g is not None)
    sign = 1
    if body.startswith("-"):
        sign, body = -1, body[1:].lstrip()
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


def _int_fast_path(gold: str, pred: str, kind: str) -> Result | None:
    """Verdict for integers without sympy; identical to math-verify's (checked in tests)."""
    g = gold.strip()
    if not _INT_RE.fullmatch(g):
        return None
    value = int_answer(pred, kind)
    if value is None:
        return None
    return value == int(g), pred, None


def _fast_path(gold: str, pred: str, kind: str) -> Result | None:
    """A verdict without sympy where math-verify's is known: integers, then exact rationals and
    single square roots (both the gold and the answer in those grammars)."""
    fast = _int_fast_path(gold, pred, kind)
    if fast is not None or kind in TAIL_KINDS:
        return fast
    g = exact_answer(gold, "boxed")
    if g is None:
        return None
    p = exact_answer(pred, kind)
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


def grade(
    response: str,
    gold: str,
    grader: str = "math_verify",
    allow_fallback: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> Verdict:
    """Grade one response against a gold answer (see module docstring for the two graders).

    ``timeout`` bounds math-verify's parse+verify (seconds, may be fractional); outside the
    main thread the work runs in the worker pool (signals only work in the main thread).
    """
    check_timeout(timeout)
    if grader == "paper":
        return grade_paper(response, gold)
    if grader != "math_verify":
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    if not _in_main_thread():
        from .grader_pool import grade_many

        return grade_many(
            [response], [gold], grader, allow_fallback=allow_fallback, timeout=timeout, processes=1
        )[0]
    job = _mv_job(response, gold, allow_fallback)
    if isinstance(job, Verdict):
        return job
    hit = _cached(job)
    if hit is None:
        hit = _mv_check(*job, timeout)
        _cache_put(job, hit)
    return Verdict(hit[0], hit[1], "math_verify", hit[2])


# The pool lives in rpg_eval.grader_pool; these names stay reachable here (training's reward and
# callers import ``rpg_eval.graders.grade_many``), resolved on first use to avoid an import cycle.
_POOL_NAMES = ("grade_many", "shutdown_pool", "_pool", "_get_pool", "_Pool", "_Worker", "_worker_main")


def __getattr__(name: str) -> Any:
    if name in _POOL_NAMES:
        from . import grader_pool

        return getattr(grader_pool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
