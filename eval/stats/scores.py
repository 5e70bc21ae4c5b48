"""The scores a checkpoint gets, one entry each: the one list that summary.csv, last_best.csv,
``rpg-eval table --metric`` and ``rpg-eval plot --metric`` are drawn from.

A score is a number per problem (mean@k: the share of its k samples graded right; maj@k: whether
the majority answer is right, ``rpg_eval.stats.majority``), averaged over problems with a percentile
bootstrap interval (``rpg_eval.stats.metrics``). Its columns:

- summary.csv: ``value``, ``ci`` (one row per checkpoint);
- last_best.csv: ``last`` / ``best`` with their intervals (``<col>_ci_low``, ``<col>_ci_high``)
  and the steps they were taken at; Last is the latest checkpoint whatever the score, so every
  score shares ``last_step``; Best is the checkpoint with the highest value of this score.

Adding a score is one entry of :data:`SCORES` (with its per-problem function); the tables, plots
and summaries pick it up. Imports nothing from the training side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: (run, checkpoint, step, benchmark): the checkpoint of one run scored on one benchmark.
Unit = tuple[str, str, int, str]
#: A unit's complete problems, each the list of its sample records in sample order.
Problems = list[list[dict[str, Any]]]


def mean_per_problem(units: dict[Unit, Problems], grader: str) -> dict[Unit, list[float]]:
    """mean@k per problem: the share of its samples ``grader`` graded right."""
    return {
        u: [sum(bool(r["correct"][grader]) for r in s) / len(s) for s in problems]
        for u, problems in units.items()
    }


def maj_per_unit(units: dict[Unit, Problems], grader: str) -> dict[Unit, list[float]]:
    """maj@k per problem (``rpg_eval.stats.majority``), every unit in one batch of equivalence checks."""
    from .majority import maj_per_problem  # grading: only where scores are computed, not read

    keys = list(units)
    per_problem = maj_per_problem([s for k in keys for s in units[k]], grader)
    out, i = {}, 0
    for k in keys:
        out[k] = per_problem[i : i + len(units[k])]
        i += len(units[k])
    return out


@dataclass(frozen=True)
class Score:
    """One score and where it is written."""

    key: str  # the --metric value
    name: str  # as printed in legends and messages
    value: str  # summary.csv: the mean over problems
    ci: tuple[str, str]  # summary.csv: its 95% interval
    last: str  # last_best.csv: the value at the latest checkpoint
    best: str  # last_best.csv: the highest value over checkpoints
    best_step: str  # last_best.csv: the step of that checkpoint
    per_problem: Callable[[dict[Unit, Problems], str], dict[Unit, list[float]]]
    legend: str = ""  # a table's legend for runs' cells showing this score ("": the mean@k legend)
    last_step: str = "last_step"  # shared by every score

    @property
    def last_ci(self) -> tuple[str, str]:
        return f"{self.last}_ci_low", f"{self.last}_ci_high"

    @property
    def best_ci(self) -> tuple[str, str]:
        return f"{self.best}_ci_low", f"{self.best}_ci_high"

    # The held-out Best (rpg_eval.stats.heldout): summary.csv holds each checkpoint's value on the
    # selection half of every problem's samples (``sel``) and on the scoring half (``held``, with its
    # interval); last_best.csv the checkpoint chosen on held-out data and its value on data it was
    # not chosen on (``heldout``, its step and interval).
    @property
    def sel(self) -> str:
        return f"{self.value}_sel"

    @property
    def held(self) -> str:
        return f"{self.value}_held"

    @property
    def held_ci(self) -> tuple[str, str]:
        return f"{self.held}_ci_low", f"{self.held}_ci_high"

    @property
    def heldout(self) -> str:
        return f"heldout_{self.best}"

    @property
    def heldout_step(self) -> str:
        return f"heldout_{self.best_step}"

    @property
    def heldout_ci(self) -> tuple[str, str]:
        return f"{self.heldout}_ci_low", f"{self.heldout}_ci_high"

    @property
    def summary_columns(self) -> list[str]:
        return [self.value, *self.ci, self.sel, self.held, *self.held_ci]

    @property
    def last_best_columns(self) -> list[str]:
        return [self.last, self.last_step, *self.last_ci, self.best, self.best_step, *self.best_ci,
                self.heldout, self.heldout_step, *self.heldout_ci]  # fmt: skip


SCORES: dict[str, Score] = {
    s.key: s
    for s in (
        Score("mean", "mean@k", "mean", ("ci_low", "ci_high"), "last", "best", "best_step", mean_per_problem),
        Score(
            "maj", "maj@k", "maj", ("maj_ci_low", "maj_ci_high"), "last_maj", "best_maj", "best_maj_step",
            maj_per_unit,
            legend="Runs' cells: Last / Best of maj@k (majority vote over each problem's k samples, "
            "equivalent answers grouped; Best = the checkpoint with the highest maj@k); the paper's rows: "
            "mean@32 as reported."
        )
    )
}  # fmt: skip
#: The score every table and plot shows unless told otherwise, and the paper's (mean@32).
DEFAULT = "mean"


def summary_score_columns() -> list[str]:
    """summary.csv's score columns, in SCORES order (pass@k sits between the first and the rest)."""
    return [c for s in SCORES.values() for c in s.summary_columns]


def last_best_score_columns() -> list[str]:
    """last_best.csv's score columns, in SCORES order, each once (``last_step`` is shared)."""
    return list(dict.fromkeys(c for s in SCORES.values() for c in s.last_best_columns))


def score_intervals() -> list[tuple[str, str, str]]:
    """(value, low, high) of every score column that has an interval, in either file."""
    pairs = [((s.value, s.ci), (s.held, s.held_ci), (s.last, s.last_ci), (s.best, s.best_ci),
              (s.heldout, s.heldout_ci)) for s in SCORES.values()]  # fmt: skip
    return [(col, *ci) for group in pairs for col, ci in group]


def step_columns() -> list[str]:
    """Every column that holds a checkpoint step, in either file (``step`` of summary.csv)."""
    steps = [c for s in SCORES.values() for c in (s.last_step, s.best_step, s.heldout_step)]
    return list(dict.fromkeys(["step", *steps]))
