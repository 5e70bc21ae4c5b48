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

math-verify's own timeouts (``signal.alarm``) are disabled: each parse+verify is bounded by our own
``setitimer`` deadline (rpg_eval.graders.math_check), off the main thread and in ``grade_many`` in a
process pool (rpg_eval.graders.pool) whose workers are killed if a C-level loop ignores the signal,
so every item ends within ``timeout + 1`` seconds.

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
from .math_check import DEFAULT_TIMEOUT, MAX_TIMEOUT, _in_main_thread, check_timeout, clear_caches
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
    processes = 0 if _in_main_thread() else 1  # the in-process path is grade_many's too
    return grade_many(
        [response], [gold], grader, processes=processes, timeout=timeout, allow_fallback=allow_fallback
    )[0]


# The grading's parts live in answers.py (strings), math_check.py (math-verify) and pool.py
# (processes); every name of theirs stays reachable here, where callers and tests have always found
# them (``_pool`` must be read at each use: shutdown_pool() replaces it).
def __getattr__(name: str) -> Any:
    from . import answers, math_check, pool

    for module in (math_check, answers, pool):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
