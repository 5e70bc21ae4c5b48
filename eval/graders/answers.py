"""Answers of one response, and the paper's grader: the final answer extracted cheaply by string
scanning (the last complete ``\\boxed{...}`` or the last ``Answer:`` line, whichever comes later,
joined boxes as one answer), the parts a gold answer has, Minerva normalization and the paper's
exact-match grader (verl's ``math_dapo.compute_score``).

Pure string work: no math-verify, no processes (those are ``rpg_eval.graders.math_check`` and
``rpg_eval.graders.pool``; the public API is ``rpg_eval.graders``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

GRADERS = ("math_verify", "paper")
# Bumped whenever a verdict can change (run.json records it: a resume never mixes verdicts of two
# grader versions). 5: an "Answer:" line's answer is its first sentence.
GRADER_VERSION = 5
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


def _last_box_pos(text: str, end: int, start: int = 0) -> int:
    return max(text.rfind("\\boxed", start, end), text.rfind("\\fbox", start, end))


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
    r"|(?P<space>\\[()\[\]]|\\[,;:! ]|\\q?quad(?![A-Za-z])|[\s,.;:$*~])"
)
# Prose between boxes is often written in text mode inside the math ("$$\boxed{(3, 3)} \text{ for part
# (a) and } \boxed{(1, 1)}$$"): such a command is read as the words it holds.
_TEXT_MODE_RE = re.compile(r"\\(?:text|textrm|textnormal|textbf|textit|mathrm|mbox|emph)\s*\{([^{}]*)\}")
_PART_WORDS = frozenset({"for", "part", "parts", "case", "cases", "question", "and", "the", "answer",
                        "answers", "final", "to", "is", "are", "of", "in", "respectively", "first", "second",
                        "third", "fourth"})  # fmt: skip
_PART_NAMES = frozenset({"part", "parts", "case", "cases", "question"})


def _labels_parts(gap: str) -> bool:
    """Whether the text between two boxes only labels the parts of one answer (see above)."""
    gap = _TEXT_MODE_RE.sub(lambda m: f" {m[1]} ", gap)
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
        # Only a box near enough can join: searching the whole text for a "\fbox" that is not
        # there, once per joined box, made 1 MB of "\boxed{1}" cost seconds.
        prev = _last_box_pos(text, pos, max(0, pos - MAX_ANSWER_CHARS - _MAX_GAP))
        if total > MAX_ANSWER_CHARS or prev < 0:
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


# DAPO's "Answer:" regex with a bounded capture, so a 50 MB "Answer:" line is not copied to be rejected
# (the paper grader's tail is 300 characters: the bound never cuts there).
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]{1," + str(MAX_ANSWER_CHARS + 1) + "})")


def last_answer_line(text: str) -> tuple[str, int] | None:
    """Content and position of the last ``Answer: ...`` line (DAPO's regex); contents longer
    than MAX_ANSWER_CHARS come back cut at MAX_ANSWER_CHARS + 1 characters."""
    # Scan from the end: a full findall over a 1 MB response is wasted work.
    lower = text.lower()
    pos = lower.rfind("answer")
    while pos >= 0:
        m = _ANSWER_RE.match(text, pos)
        if m:
            return m.group(1), pos
        pos = lower.rfind("answer", 0, pos)
    return None


# Where the answer on an "Answer:" line ends: a sentence end outside math ("$20\%$. I hope it is
# correct.": a ".", "!" or "?" followed by a space and a capital letter), or a chat template's token
# that a model wrote past its turn ("<|im_start|>", "</s>").  What follows is commentary ("I hope it is
# correct. Note: ..."), however long; the answer is the sentence before it.  "Part (b)" after a
# sentence end continues a multi-part answer, so it ends nothing.
_SENTENCE_END_RE = re.compile(
    r"[.!?]\s+(?=[A-Z])(?!(?:Part|Parts|Case|Cases|Question)\b)|<\|[A-Za-z_]+\|>|</s>"
)
_MATH_OPEN = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}  # "$$" before "$"


def answer_sentence(line: str) -> str:
    """The first sentence of an ``Answer:`` line's content (see _SENTENCE_END_RE); a sentence end
    inside math (``$...$``, ``\\(...\\)``, ``\\[...\\]``) or braces is none."""
    depth, close, i = 0, None, 0
    while i < len(line):
        if close is not None:  # inside math: only its closing delimiter matters
            if line.startswith(close, i):
                i, close = i + len(close), None
                continue
            i += 2 if line[i] == "\\" else 1
            continue
        opener = next((o for o in _MATH_OPEN if line.startswith(o, i)), None)
        if opener is not None:
            i, close = i + len(opener), _MATH_OPEN[opener]
            continue
        c = line[i]
        if c == "\\":  # a command or an escaped character ("\\$5" is money, not math)
            i += 2
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0:
            m = _SENTENCE_END_RE.match(line, i)
            if m:
                return line[:i].rstrip()
        i += 1
    return line


def extract_final_answer(text: str, parts: int = 1) -> tuple[str | None, str]:
    """The final answer string and its kind ("boxed", "answer" or "none").

    Whichever of the last box and the last ``Answer:`` line comes later wins, so ``Answer:
    \\boxed{25}`` yields the box content "25".  The last box decides: if it is unterminated (a
    truncated response) there is no boxed answer -- an earlier box from an intermediate step is not
    promoted to the answer.  Boxes joined to the last one by connectors only ("\\boxed{1},
    \\boxed{2}") are one answer "1, 2", a repeated box counts once; a final period inside the box is
    dropped ("\\boxed{25.}" -> "25").  ``parts``: how many parts the expected answer has
    (``answer_parts(gold)``); with two or more, boxes joined by prose that only labels the parts ("for
    part (a) and") are one answer too.  An answer longer than MAX_ANSWER_CHARS is returned cut at
    MAX_ANSWER_CHARS + 1 characters (graded "answer too long").
    """
    pos = _last_box_pos(text, len(text))
    box = _box_at(text, pos) if pos >= 0 else None
    line = last_answer_line(text)
    if line is not None and (box is None or line[1] > pos):
        content = answer_sentence(line[0])
        if len(content) > MAX_ANSWER_CHARS:
            return content, "answer"  # unstripped: a cut answer must not shrink under the limit
        return content.strip(), "answer"
    if box is not None:
        content = box[0]
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

SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]  # fmt: skip
REMOVED_EXPRESSIONS = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
                       "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
                       "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
                       "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
                       "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"',
                       "\\dots"]  # fmt: skip


def _unwrap_lazy(text: str, opener: str) -> str:
    r"""``re.sub(re.escape(opener) + r"(.*?)(\})", "\1", text)`` in linear time: each ``opener``
    (scanning on after the previous replacement) up to the first ``}`` after it on its line is
    replaced by what lies between; once an opener has no ``}`` after it on its line, no later one
    on that line has either."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        out, pos = [], 0
        while (p := line.find(opener, pos)) >= 0:
            q = line.find("}", p + len(opener))
            if q < 0:
                break
            out += [line[pos:p], line[p + len(opener) : q]]
            pos = q + 1
        if out:
            lines[k] = "".join(out) + line[pos:]
    return "\n".join(lines)


def _unwrap_greedy(text: str, opener: str) -> str:
    r"""``re.sub(re.escape(opener) + r"(.*)(\})", "\1", text)`` in linear time: on each line, the
    first ``opener`` with a ``}`` after it, up to the line's last ``}``, is replaced by what lies
    between (nothing after that ``}`` can match again)."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        p, q = line.find(opener), line.rfind("}")
        if p >= 0 and q >= p + len(opener):
            lines[k] = line[:p] + line[p + len(opener) : q] + line[q + 1 :]
    return "\n".join(lines)


def normalize_final_answer(final_answer: str) -> str:
    """Minerva normalization exactly as verl's ``math_dapo.normalize_final_answer``, in time linear
    in the answer's length (its ``$...$``, ``\\text{...}``, ``\\boxed{...}`` regexes are quadratic;
    their linear equivalents, checked against them in tests/test_eval_normalize.py)."""
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    # verl's r"(.*?)(\$)(.*?)(\$)(.*)" -> "$\3$", anchored at line starts (verl's retries every start of
    # a line without two "$": quadratic); "." stops at a newline, so each line is one try.
    final_answer = re.sub(r"^[^$\n]*\$([^$\n]*)\$.*$", r"$\1$", final_answer, flags=re.M)
    final_answer = _unwrap_lazy(final_answer, "\\text{")
    final_answer = _unwrap_lazy(final_answer, "\\textbf{")
    final_answer = _unwrap_lazy(final_answer, "\\overline{")
    final_answer = _unwrap_greedy(final_answer, "\\boxed{")
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
    """Why ``gold`` cannot be graded against (None: it can): longer than MAX_ANSWER_CHARS (a
    benchmark answer is a number or a short expression; no extracted answer can be that long), or
    empty after the paper grader's normalization (``\\boxed{}``, ``$$``, ``\\text{}``) -- nothing
    to compare an answer with."""
    if len(gold) > MAX_ANSWER_CHARS:
        return (
            f"answer of {len(gold):,} characters ({gold[:20]!r}...) is longer than {MAX_ANSWER_CHARS:,}: a "
            "benchmark answer is a number or a short expression (no answer that long is ever graded)"
        )
    if not normalize_final_answer(gold):
        return f"answer {gold[:60]!r} is empty after normalization (nothing to grade against)"
    return None
