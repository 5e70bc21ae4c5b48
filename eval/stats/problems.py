"""Per-problem scores of every checkpoint, from sample records: what every statistic that resamples
or pairs problems starts from (summaries, paired differences, seeds, the held-out Best).

A unit is one checkpoint of one run on one benchmark. Its complete problems (those with the unit's
full number of samples k; an interrupted unit's others are left out, with a warning) are sorted by
problem id, so two runs on the same problems list them in the same order. Each score of
``scores.SCORES`` gives one number per problem (mean@k: the share of its k samples graded right;
maj@k: 1 when the majority answer is right). For the held-out Best each problem's samples are also
split by sample index into a selection half (the first floor(k/2)) and a scoring half (the rest),
each scored the same way (mean@k of a half is the share right among its samples; maj@k its
majority vote).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scores import SCORES, Problems, Unit

GRADER_NAMES = ("math_verify", "paper")


def group_units(
    records: list[dict[str, Any]],
) -> tuple[dict[Unit, dict[str, dict[int, dict]]], dict[tuple, set]]:
    """Records by unit and problem ({unit: {problem_id: {sample_index: record}}}), and the prompt
    styles of each (run, benchmark); a run mixing prompt styles on a benchmark is refused."""
    units: dict[Unit, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    styles: dict[tuple, set] = defaultdict(set)
    for r in records:
        units[(r["run"], r["checkpoint"], int(r["step"]), r["benchmark"])][str(r["problem_id"])][
            int(r["sample_index"])
        ] = r
        styles[(r["run"], r["benchmark"])].add(r["prompt_style"])
    for (run, bench), st in styles.items():
        if len(st) > 1:
            raise ValueError(
                f"run {run!r} mixes prompt styles {sorted(st)} on {bench}: use one --run per style"
            )
    return units, styles


def complete_units(
    records: list[dict[str, Any]], warn: bool = True
) -> tuple[dict[Unit, Problems], dict[tuple, set]]:
    """Each unit's complete problems (sorted by id; each the list of its samples by index), units
    sorted by (run, benchmark, step, checkpoint); and the prompt styles of each (run, benchmark)."""
    units, styles = group_units(records)
    full: dict[Unit, Problems] = {}
    for key in sorted(units, key=lambda k: (k[0], k[3], k[2], k[1])):
        probs = units[key]
        n = max(len(s) for s in probs.values())
        kept = [[s[j] for j in sorted(s)] for _, s in sorted(probs.items()) if len(s) == n]
        if warn and len(kept) < len(probs):
            print(f"[rpg-eval] {key[1]} {key[3]}: {len(probs) - len(kept)} incomplete problems left out",
                  file=sys.stderr)  # fmt: skip
        full[key] = kept
    return full, styles


def split_halves(units: dict[Unit, Problems]) -> tuple[dict[Unit, Problems], dict[Unit, Problems]]:
    """The selection half (first floor(k/2) samples of each problem) and the scoring half (the
    rest) of every unit with k >= 2 samples per problem."""
    sel, held = {}, {}
    for u, problems in units.items():
        h = len(problems[0]) // 2
        if h >= 1:
            sel[u] = [s[:h] for s in problems]
            held[u] = [s[h:] for s in problems]
    return sel, held


@dataclass(frozen=True)
class CheckpointScores:
    """One checkpoint's per-problem values of one score: on all samples (``full``), on the
    selection half (``sel``) and on the scoring half (``held``; both None when k < 2)."""

    checkpoint: str
    step: int
    problem_ids: tuple[str, ...]
    k: int
    full: np.ndarray
    sel: np.ndarray | None = None
    held: np.ndarray | None = None

    def part(self, name: str) -> np.ndarray:
        """``full``, ``sel`` or ``held``; ValueError when the halves do not exist (k < 2)."""
        values = getattr(self, name)
        if values is None:
            raise ValueError(f"{self.checkpoint}: {self.k} sample(s) per problem cannot be split into halves")
        return values

    def denominator(self, score: str, part: str = "full") -> int:
        """What a per-problem value is a multiple of the inverse of: mean@k counts samples of the
        part (k, floor(k/2), k - floor(k/2)); maj@k is 0 or 1."""
        if score != "mean":
            return 1
        return {"full": self.k, "sel": self.k // 2, "held": self.k - self.k // 2}[part]


@dataclass(frozen=True)
class RunScores:
    """One run's checkpoints (by step) on one benchmark, for one grader and one score, with the
    facts two runs must share to be compared: golds by problem id and the sampling settings."""

    run: str
    benchmark: str
    grader: str
    score: str
    checkpoints: tuple[CheckpointScores, ...]
    golds: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def last(self) -> CheckpointScores:
        """The latest checkpoint."""
        return self.checkpoints[-1]

    def best(self, part: str = "full", exclude_step0: bool = False) -> CheckpointScores:
        """The checkpoint with the highest mean of ``part`` (earliest on ties); ``exclude_step0``
        leaves step 0 out unless it is the only one."""
        pool = [c for c in self.checkpoints if not (exclude_step0 and c.step == 0)] or list(self.checkpoints)
        means = [float(np.mean(c.part(part))) for c in pool]
        return pool[int(np.argmax(means))]  # argmax keeps the first of equal values


def _settings(r: dict[str, Any]) -> dict[str, Any]:
    """What shapes a record's verdicts besides the model: prompt style and sampling settings."""
    sampling = sorted((r.get("sampling") or {}).items())  # a mapping where present: records.py
    return {"prompt_style": r.get("prompt_style"), **{f"sampling.{k}": v for k, v in sampling}}


def run_scores(
    records: list[dict[str, Any]],
    graders: tuple[str, ...] = GRADER_NAMES,
    scores: tuple[str, ...] = tuple(SCORES),
    warn: bool = True,
) -> dict[tuple[str, str, str, str], RunScores]:
    """Per-problem scores of every (run, benchmark, grader, score) in ``records``."""
    units, _ = complete_units(records, warn=warn)
    sel_units, held_units = split_halves(units)
    values: dict[tuple[str, str, str], dict[Unit, list[float]]] = {}
    for key in scores:
        for g in graders:
            per_problem = SCORES[key].per_problem
            values[(key, g, "full")] = per_problem(units, g)
            values[(key, g, "sel")] = per_problem(sel_units, g) if sel_units else {}
            values[(key, g, "held")] = per_problem(held_units, g) if held_units else {}
    facts: dict[tuple[str, str], tuple[dict[str, str], dict[str, Any]]] = {}
    for r in records:
        golds, _ = facts.setdefault((r["run"], r["benchmark"]), ({}, _settings(r)))
        if isinstance(r.get("gold"), str):
            golds[str(r["problem_id"])] = r["gold"]
    out: dict[tuple[str, str, str, str], RunScores] = {}
    for (run, bench), (golds, settings) in facts.items():
        mine = [u for u in units if u[0] == run and u[3] == bench]
        for key in scores:
            for g in graders:
                ckpts = tuple(
                    CheckpointScores(
                        checkpoint=u[1], step=u[2], k=len(units[u][0]),
                        problem_ids=tuple(str(s[0]["problem_id"]) for s in units[u]),
                        full=np.asarray(values[(key, g, "full")][u], dtype=float),
                        sel=_array(values[(key, g, "sel")].get(u)),
                        held=_array(values[(key, g, "held")].get(u))
                    )
                    for u in sorted(mine, key=lambda u: (u[2], u[1]))
                )  # fmt: skip
                out[(run, bench, g, key)] = RunScores(run, bench, g, key, ckpts, golds, settings)
    return out


def _array(values: list[float] | None) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=float)
