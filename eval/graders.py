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
``grade_many`` run the work in a process pool whose workers are killed if a C-level loop
ignores the signal, so every item ends within ``timeout + 1`` seconds.

Imports math_verify only (no lm-eval, no torch), so the training reward can use it anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait as mp_wait

GRADERS = ("math_verify", "paper")
# Fallback parsing only looks at the end of a response: the answer is there, and parsing a
# megabyte of text with math-verify's regexes is slow.
FALLBACK_TAIL_CHARS = 2000
_CACHE_MAX = 200_000
_INT_RE = re.compile(r"-?[0-9]{1,15}")  # <= 15 digits: math-verify compares at 15 digits precision


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one response.

    correct: the grader's decision.  extracted: the answer string the grader compared (raw
    boxed/``Answer:`` text for math_verify, the Minerva-normalized string for paper), None
    when no answer was found.  grader: "math_verify" or "paper".  error: "timeout", "no
    answer", an exception name, or None.
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


def last_boxed(text: str) -> tuple[str, int] | None:
    """Content and start position of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    The last occurrence decides: if it is unterminated (a truncated response) there is no
    boxed answer -- an earlier box from an intermediate step is not promoted to the answer.
    ``\\boxed 5`` (no braces) yields "5".
    """
    pos = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if pos < 0:
        return None
    i = pos + (6 if text.startswith("\\boxed", pos) else 5)
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        # "\boxed 5$": the argument is the next token.
        j = i
        while j < n and text[j] not in " $\n":
            j += 1
        return (text[i:j], pos) if j > i else None
    depth = 0
    start = i + 1
    for j in range(i, n):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:j], pos
    return None


_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def last_answer_line(text: str) -> tuple[str, int] | None:
    """Content and position of the last ``Answer: ...`` line (DAPO's regex)."""
    # Scan from the end: a full findall over a 1 MB response is wasted work.
    lower = text.lower()
    pos = lower.rfind("answer")
    while pos >= 0:
        m = _ANSWER_RE.match(text, pos)
        if m:
            return m.group(1), pos
        pos = lower.rfind("answer", 0, pos)
    return None


def extract_final_answer(text: str) -> tuple[str | None, str]:
    """The final answer string and its kind ("boxed", "answer" or "none").

    Whichever of the last box and the last ``Answer:`` line comes later wins, so
    ``Answer: \\boxed{25}`` yields the box content "25".
    """
    box = last_boxed(text)
    line = last_answer_line(text)
    if line is not None and (box is None or line[1] > box[1]):
        return line[0].strip(), "answer"
    if box is not None:
        return box[0].strip(), "boxed"
    return None, "none"


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
    return Verdict(pred == normalize_final_answer(gold), pred, "paper", None)


# --------------------------------------------------------------------------- math-verify

_mv = None  # lazily imported math_verify pieces (keeps `import rpg_eval.graders` cheap)
_gold_cache: dict[str, list] = {}
_verdict_cache: dict[tuple[str, str, str], tuple[bool, str | None, str | None]] = {}


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
        _mv = (parse, verify, anchored, free, TimeoutException)
    return _mv


_fired = [False]


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise math_verify's TimeoutException after ``seconds`` (main thread only)."""
    timeout_exc = _math_verify()[4]
    _fired[0] = False

    def handler(signum, frame):
        # math-verify swallows TimeoutException in places (verify returns False), so the
        # flag tells the caller that the verdict is a timeout, not a real False.
        _fired[0] = True
        raise timeout_exc("grading timed out")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def wrap_prediction(pred: str, kind: str) -> str:
    """The string math-verify parses for an extracted answer of ``kind``."""
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
    return pred  # fallback: the response tail, parsed anchor-free


def wrap_gold(gold: str) -> str:
    """Gold answers need a delimiter to parse; strip any $...$ the data carries."""
    g = gold.strip()
    if len(g) >= 2 and g[0] == "$" and g[-1] == "$":
        g = g[1:-1]
    return "\\boxed{" + g + "}"


def _int_fast_path(gold: str, pred: str, kind: str) -> tuple[bool, str | None, str | None] | None:
    """Verdict for plain integers without sympy; identical to math-verify's (checked in tests)."""
    if kind != "fallback" and _INT_RE.fullmatch(pred) and _INT_RE.fullmatch(gold.strip()):
        return int(pred) == int(gold.strip()), pred, None
    return None


def _mv_check_unbounded(gold: str, pred: str, kind: str) -> tuple[bool, str | None, str | None]:
    """parse(gold) + parse(pred) + verify, without any timeout.  Returns (correct, extracted, error)."""
    fast = _int_fast_path(gold, pred, kind)
    if fast is not None:
        return fast
    parse, verify, anchored, free, _ = _math_verify()
    g = _gold_cache.get(gold)
    if g is None:
        g = parse(wrap_gold(gold), free, parsing_timeout=None)
        if len(_gold_cache) > 10_000:
            _gold_cache.clear()
        _gold_cache[gold] = g
    if not g:
        return False, pred if kind != "fallback" else None, "gold unparsable"
    p = parse(wrap_prediction(pred, kind), anchored if kind != "fallback" else free, parsing_timeout=None)
    if not p:
        return (
            False,
            pred if kind != "fallback" else None,
            "unparsable" if kind != "fallback" else "no answer",
        )
    extracted = pred if kind != "fallback" else (p[-1] if isinstance(p[-1], str) else str(p[0]))
    return bool(verify(g, p, timeout_seconds=None)), extracted, None


def _mv_check(gold: str, pred: str, kind: str, timeout: float) -> tuple[bool, str | None, str | None]:
    """_mv_check_unbounded under a signal deadline (caller must be the main thread)."""
    timeout_exc = _math_verify()[4]
    try:
        with _deadline(timeout):
            res = _mv_check_unbounded(gold, pred, kind)
        if _fired[0]:
            return False, res[1], "timeout"
        return res
    except timeout_exc:
        return False, pred if kind != "fallback" else None, "timeout"
    except Exception as e:  # noqa: BLE001 - sympy raises anything; a crash is a wrong answer
        return False, pred if kind != "fallback" else None, type(e).__name__


def _mv_job(response: str, gold: str, allow_fallback: bool) -> tuple[str, str, str] | Verdict:
    """Extraction step: either a finished Verdict or a (gold, pred, kind) job to check."""
    pred, kind = extract_final_answer(response)
    if pred is None:
        if not allow_fallback:
            return Verdict(False, None, "math_verify", "no answer")
        return gold, response[-FALLBACK_TAIL_CHARS:], "fallback"
    if not pred:
        return Verdict(False, "", "math_verify", "empty answer")
    return gold, pred, kind


def _cache_put(key: tuple[str, str, str], value: tuple[bool, str | None, str | None]) -> None:
    if value[2] == "timeout":
        return  # timeouts depend on load; never memoize them
    if len(_verdict_cache) >= _CACHE_MAX:
        _verdict_cache.clear()
    _verdict_cache[key] = value


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- public API


def grade(
    response: str,
    gold: str,
    grader: str = "math_verify",
    allow_fallback: bool = False,
    timeout: float = 5,
) -> Verdict:
    """Grade one response against a gold answer (see module docstring for the two graders).

    ``timeout`` bounds math-verify's parse+verify (seconds, may be fractional); outside the
    main thread the work runs in the worker pool (signals only work in the main thread).
    """
    if grader == "paper":
        return grade_paper(response, gold)
    if grader != "math_verify":
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    if not _in_main_thread():
        return grade_many(
            [response], [gold], grader, allow_fallback=allow_fallback, timeout=timeout, processes=1
        )[0]
    job = _mv_job(response, gold, allow_fallback)
    if isinstance(job, Verdict):
        return job
    hit = _verdict_cache.get(job)
    if hit is None:
        hit = _mv_check(*job, timeout)
        _cache_put(job, hit)
    return Verdict(hit[0], hit[1], "math_verify", hit[2])


def grade_many(
    responses: Sequence[str],
    golds: Sequence[str],
    grader: str = "math_verify",
    processes: int | None = None,
    timeout: float = 5,
    allow_fallback: bool = False,
    progress: bool = False,
) -> list[Verdict]:
    """Grade many responses; verdicts equal ``grade`` item by item.

    Answers are extracted in this process, repeated (gold, answer) pairs are checked once
    (and memoized across calls).  ``processes``: 0 = in this process; None = in this
    process for small batches in the main thread, else a pool of ``os.cpu_count()``
    workers; n >= 1 = a pool of n workers.  Each item is bounded by ``timeout`` (+1 s).
    """
    if len(responses) != len(golds):
        raise ValueError(f"responses ({len(responses)}) and golds ({len(golds)}) differ in length")
    if grader == "paper":
        return [grade_paper(r, g) for r, g in zip(responses, golds)]
    if grader != "math_verify":
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    out: list[Verdict | None] = [None] * len(responses)
    todo: dict[tuple[str, str, str], list[int]] = {}
    for i, (r, g) in enumerate(zip(responses, golds)):
        job = _mv_job(r, g, allow_fallback)
        if isinstance(job, Verdict):
            out[i] = job
            continue
        hit = _verdict_cache.get(job)
        if hit is not None:
            out[i] = Verdict(hit[0], hit[1], "math_verify", hit[2])
        else:
            todo.setdefault(job, []).append(i)
    jobs = []
    for job, idxs in todo.items():
        fast = _int_fast_path(*job)
        if fast is None:
            jobs.append(job)
            continue
        _cache_put(job, fast)
        for i in idxs:
            out[i] = Verdict(fast[0], fast[1], "math_verify", fast[2])
    if jobs:
        in_process = processes == 0 or (processes is None and len(jobs) <= 64 and _in_main_thread())
        if in_process and not _in_main_thread():
            in_process = False
        if in_process:
            results = [_mv_check(*job, timeout) for job in _maybe_tqdm(jobs, progress)]
        else:
            nproc = processes or os.cpu_count() or 1
            results = _get_pool(nproc).run(jobs, timeout, progress)
        for job, res in zip(jobs, results):
            _cache_put(job, res)
            v = Verdict(res[0], res[1], "math_verify", res[2])
            for i in todo[job]:
                out[i] = v
    return out  # type: ignore[return-value]


def _maybe_tqdm(items: list, progress: bool):
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="grading", unit="answer")


# --------------------------------------------------------------------------- process pool
# Workers are plain `python -c` subprocesses talking over two os pipes: unlike
# multiprocessing's spawn/forkserver they never re-import the caller's __main__ (no
# `if __name__ == "__main__"` guard needed), and unlike fork they are safe when the parent
# runs threads (torch, ray).


def _worker_main(rfd: int, wfd: int) -> None:
    """Worker loop: receive [(idx, gold, pred, kind, timeout)], send (idx, result) per item."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    rconn, wconn = Connection(rfd, writable=False), Connection(wfd, readable=False)
    _math_verify()
    wconn.send(("ready", None))
    while True:
        try:
            batch = rconn.recv()
        except EOFError:
            return
        if batch is None:
            return
        for idx, gold, pred, kind, timeout in batch:
            wconn.send((idx, _mv_check(gold, pred, kind, timeout)))


class _Worker:
    """One worker subprocess and the parent's ends of its pipes."""

    def __init__(self) -> None:
        from multiprocessing.connection import Connection

        c_r, p_w = os.pipe()  # parent -> child
        p_r, c_w = os.pipe()  # child -> parent
        code = f"from rpg_eval.graders import _worker_main; _worker_main({c_r}, {c_w})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(c_r, c_w))
        os.close(c_r)
        os.close(c_w)
        self.recv = Connection(p_r, writable=False)
        self.send = Connection(p_w, readable=False)
        self.ready = False
        self.batch: list[int] = []  # job ids sent and not yet answered, in the worker's order
        self.since = 0.0  # when the worker started its current item

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.recv.close()
        self.send.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send.send(None)
            self.proc.wait(timeout=2)
        self.kill()


class _Pool:
    """A minimal process pool with per-item hard deadlines (kill + respawn on overrun).

    The parent knows each worker's batch order, so the item in progress is the first
    unanswered one and it started when the previous answer arrived: no shared memory.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.workers = [_Worker() for _ in range(n)]
        self.lock = threading.Lock()  # one batch at a time (grade() may come from threads)

    def run(self, jobs: list[tuple[str, str, str]], timeout: float, progress: bool) -> list:
        """Check ``jobs`` (gold, pred, kind); results in job order."""
        with self.lock:
            return self._run(jobs, timeout, progress)

    def _run(self, jobs: list[tuple[str, str, str]], timeout: float, progress: bool) -> list:
        results: list = [None] * len(jobs)
        chunk = max(1, min(256, len(jobs) // (self.n * 4)))
        queue = [list(range(s, min(s + chunk, len(jobs)))) for s in range(0, len(jobs), chunk)]
        queue.reverse()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(jobs), desc="grading", unit="answer")
        done = 0

        def finish(idx: int, res: tuple) -> None:
            nonlocal done
            results[idx] = res
            done += 1
            if bar:
                bar.update(1)

        def feed(w: _Worker) -> None:
            if w.ready and not w.batch and queue:
                w.batch = queue.pop()
                w.since = time.monotonic()
                w.send.send([(i, *jobs[i], timeout) for i in w.batch])

        for w in self.workers:
            feed(w)
        while done < len(jobs):
            by_conn = {w.recv: w for w in self.workers}
            for conn in mp_wait(list(by_conn), timeout=0.05):
                w = by_conn[conn]
                try:
                    while conn.poll():
                        idx, res = conn.recv()
                        if idx == "ready":
                            w.ready, w.since = True, time.monotonic()
                        elif w.batch and idx == w.batch[0]:
                            w.batch.pop(0)
                            w.since = time.monotonic()
                            finish(idx, res)
                except (EOFError, OSError):
                    pass  # the worker died; handled below
                feed(w)
            now = time.monotonic()
            for k, w in enumerate(self.workers):
                dead = w.proc.poll() is not None
                overrun = w.ready and w.batch and now - w.since > timeout + 0.5
                if not (dead or overrun):
                    continue
                if w.batch:
                    idx = w.batch.pop(0)  # the item that hung or crashed the worker
                    finish(idx, (False, _pred_or_none(jobs[idx]), "timeout" if overrun else "worker died"))
                    if w.batch:
                        queue.append(w.batch)
                w.kill()
                self.workers[k] = _Worker()
        if bar:
            bar.close()
        return results

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []


def _pred_or_none(job: tuple[str, str, str]) -> str | None:
    return None if job[2] == "fallback" else job[1]


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool(n: int) -> _Pool:
    """The persistent worker pool (start-up costs ~1 s: reuse it across calls, and a
    larger pool serves a request for fewer workers)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.n < n:
            if _pool is not None:
                _pool.close()
            _pool = _Pool(n)
        return _pool


def shutdown_pool() -> None:
    """Stop the worker processes (also registered at exit)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


atexit.register(shutdown_pool)


def clear_caches() -> None:
    """Forget memoized verdicts (benchmarks and tests that time cold grading)."""
    _verdict_cache.clear()
    _gold_cache.clear()
