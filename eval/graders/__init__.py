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
``grade_many`` run the work in a process pool (rpg_eval.graders.pool) whose workers are killed if
a C-level loop ignores the signal, so every item ends within ``timeout + 1`` seconds.

This module is the API; the work is done in ``rpg_eval.graders.answers`` (extraction, the paper's
grader), ``rpg_eval.graders.math_check`` (math-verify under a deadline, memoized) and
``rpg_eval.graders.pool`` (batches, worker processes), none of which imports this one.

Imports math_verify only (no lm-eval, no torch), so the training reward can use it anywhere.
"""

from __future__ import annotations

from typing import Any

from .answers import (
    GRADER_VERSION,
    GRADERS,
    MAX_ANSWER_CHARS,
    Verdict,
    answer_parts,
    extract_final_answer,
    gold_damage,
    grade_paper,
    normalize_final_answer,
)
from .math_check import (
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    _cache_put,
    _cached,
    _in_main_thread,
    _mv_check,
    _mv_job,
    check_timeout,
    clear_caches,
)
from .pool import grade_many, shutdown_pool

__all__ = ["DEFAULT_TIMEOUT", "GRADERS", "GRADER_VERSION", "MAX_ANSWER_CHARS", "MAX_TIMEOUT", "Verdict",
           "answer_parts", "check_timeout", "clear_caches", "extract_final_answer", "gold_damage", "grade",
           "grade_many", "grade_paper", "normalize_final_answer", "shutdown_pool"]  # fmt: skip


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


# The grading's parts live in answers.py (strings), math_check.py (math-verify) and pool.py
# (processes); every name of theirs stays reachable here, where callers and tests have always found
# them (``_pool`` must be read at each use: shutdown_pool() replaces it).
def __getattr__(name: str) -> Any:
    from . import answers, math_check, pool

    for module in (math_check, answers, pool):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
