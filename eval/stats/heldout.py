"""A Best checkpoint chosen on data it is not scored on (the held-out Best), beside the paper's Best.

The paper's Best is the checkpoint with the highest score on the very problems and samples it
reports: the maximum of several noisy estimates, so it sits above what that checkpoint would score
on new samples (selection bias). The held-out Best separates choosing from scoring, one of two ways:

* ``samples`` (default): each problem's k samples are split by index into a selection half (the
  first floor(k/2)) and a scoring half (the rest). The checkpoint with the highest score on the
  selection halves is chosen (earliest on ties); its score on the scoring halves, with the
  bootstrap interval over problems, is the held-out Best. Both halves come from the same problems;
  what is held out is the sampling noise the choice fed on.
* ``benchmarks``: the checkpoint with the highest mean score over the run's *other* benchmarks
  (same step on each; earliest on ties) is chosen, and scored on all samples of this benchmark.
  Needs two benchmarks or more; only steps every benchmark scored are candidates (summarize names
  the steps it left out).

Both work on summary rows (summary.csv holds each checkpoint's ``<score>_sel`` and ``<score>_held``),
so last_best.csv's held-out columns are a pure function of summary.csv like the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .scores import Score

HELDOUT_BY = ("samples", "benchmarks")
Row = dict[str, Any]


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (empty, NaN, not a number)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _first_max(candidates: list[tuple[float, Row]]) -> Row | None:
    """The row of the highest value; the first of equal ones (rows come sorted by step)."""
    best: tuple[float, Row] | None = None
    for value, row in candidates:
        if best is None or value > best[0]:
            best = (value, row)
    return None if best is None else best[1]


def best_row(rows: Sequence[Row], column: str) -> Row | None:
    """The row with the highest finite ``column`` (the earliest of equal ones); None when no row has
    a number there (a summary.csv written before that column)."""
    return _first_max([(v, r) for r in rows if (v := finite(r.get(column))) is not None])


def by_samples(rows: Sequence[Row], s: Score) -> Row | None:
    """The row (checkpoint) with the highest selection-half value of ``s``; None when no row has
    one (one sample per problem, or a summary.csv written before the halves existed)."""
    return best_row(rows, s.sel)


def by_benchmarks(rows: Sequence[Row], others: Sequence[Sequence[Row]], s: Score) -> Row | None:
    """The row of ``rows`` (one benchmark) whose step has the highest mean value of ``s`` over the
    ``others`` (the same run's other benchmarks); only steps every other benchmark has count."""
    if not others:
        return None
    at_step = [{r["step"]: finite(r.get(s.value)) for r in other} for other in others]
    candidates = []
    for r in rows:
        values = [o.get(r["step"]) for o in at_step]
        if all(v is not None for v in values):
            candidates.append((sum(values) / len(values), r))  # type: ignore[arg-type]
    return _first_max(candidates)


def unscored_steps(rows: Sequence[Row], others: Sequence[Sequence[Row]]) -> list[int]:
    """The steps of ``rows`` that some other benchmark did not score: ``by_benchmarks`` cannot
    choose them (say so: a Best among fewer checkpoints than the paper's Best sees)."""
    scored = [{r["step"] for r in other} for other in others]
    return sorted({r["step"] for r in rows if not all(r["step"] in steps for steps in scored)})


def heldout_columns(chosen: Row | None, s: Score, by: str) -> Row:
    """last_best.csv's held-out columns of ``s`` from the chosen summary row (NaN when none): its
    scoring-half value (``samples``) or its full value (``benchmarks``), interval and step."""
    if chosen is None:
        return {
            s.heldout: math.nan,
            s.heldout_step: math.nan,
            s.heldout_ci[0]: math.nan,
            s.heldout_ci[1]: math.nan,
        }
    value, ci = (s.held, s.held_ci) if by == "samples" else (s.value, s.ci)
    return {
        s.heldout: chosen.get(value, math.nan),
        s.heldout_step: chosen["step"],
        s.heldout_ci[0]: chosen.get(ci[0], math.nan),
        s.heldout_ci[1]: chosen.get(ci[1], math.nan),
    }
