"""maj@k: the majority vote over a problem's k samples, answers grouped by equivalence under a grader.

For one problem and one grader:

1. Every sample whose grader found an answer votes for it (``extracted[grader]`` not null); a
   sample without an answer does not vote.
2. Answers are grouped into classes of equivalent answers, in sample order: an answer joins the
   first class whose representative (the class's first answer) it is equivalent to, else it
   starts a class. Equal strings are always equivalent; for ``math_verify`` two different strings
   are equivalent when the grader, given the representative as the gold answer, grades the other
   sample's response right (so ``\\frac12``, ``0.5`` and ``1/2`` are one answer); for ``paper``
   (exact match after Minerva normalization) only equal normalized strings are.
3. The largest class wins; a tie goes to the class whose representative came first.
4. maj@k of the problem is 1 when the winning class's representative was graded right, else 0
   (0 when no sample has an answer).

maj@k of a checkpoint is the mean over problems, with the same percentile bootstrap interval as
mean@k. It is a pure function of the records (the equivalence checks are deterministic grading,
memoized like all verdicts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Sample = dict[str, Any]  # a record: "extracted", "correct", "response"


def _answer(r: Sample, grader: str) -> str | None:
    a = (r.get("extracted") or {}).get(grader)
    return a if isinstance(a, str) and a != "" else None


def _distinct(samples: Sequence[Sample], grader: str) -> list[tuple[str, Sample, int]]:
    """(answer, first sample with it, votes) per distinct answer string, in order of first appearance."""
    first: dict[str, list] = {}
    for r in samples:
        a = _answer(r, grader)
        if a is not None:
            first.setdefault(a, [a, r, 0])[2] += 1
    return [tuple(v) for v in first.values()]  # type: ignore[misc]


def equivalence_jobs(problems: Sequence[Sequence[Sample]], grader: str) -> list[tuple[str, str]]:
    """The (response, gold) pairs whose verdicts ``vote`` needs for ``math_verify``: each later
    distinct answer's response against each earlier distinct answer (as gold)."""
    if grader != "math_verify":
        return []
    jobs = []
    for samples in problems:
        d = _distinct(samples, grader)
        jobs += [(d[j][1].get("response") or "", d[i][0]) for j in range(len(d)) for i in range(j)]
    return jobs


def vote(samples: Sequence[Sample], grader: str, same: dict[tuple[str, str], bool]) -> bool:
    """maj@k of one problem (see the module docstring); ``same[(response, gold)]``: the verdicts of
    ``equivalence_jobs``."""
    classes: list[list] = []  # [representative answer, representative sample, votes]
    for answer, sample, votes in _distinct(samples, grader):
        response = sample.get("response") or ""
        for c in classes:
            if grader == "math_verify" and same.get((response, c[0]), False):
                c[2] += votes
                break
        else:
            classes.append([answer, sample, votes])
    if not classes:
        return False
    best = max(classes, key=lambda c: c[2])  # max keeps the first of equal counts
    return bool(best[1]["correct"][grader])


def maj_per_problem(problems: Sequence[Sequence[Sample]], grader: str) -> list[float]:
    """maj@k (0.0 or 1.0) of each problem (a list of its samples' records)."""
    jobs = list(dict.fromkeys(equivalence_jobs(problems, grader)))
    same: dict[tuple[str, str], bool] = {}
    if jobs:
        from ..graders.pool import grade_many

        # allow_fallback: a sample that voted without an anchor got its answer from the fallback.
        verdicts = grade_many([r for r, _ in jobs], [g for _, g in jobs], "math_verify", allow_fallback=True)
        same = {job: v.correct for job, v in zip(jobs, verdicts)}
    return [float(vote(samples, grader, same)) for samples in problems]
