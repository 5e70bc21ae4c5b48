"""Tidy tables from sample records (a pure function of the records).

summary.csv: one row per (run, checkpoint, step, benchmark, grader): mean@k with a 95%
bootstrap interval over problems (seeded), pass@k for k in {1, 2, 4, ..., n}.
last_best.csv: one row per (run, benchmark, grader): Last = highest step, Best = max mean
over checkpoints (earliest step on ties; ``exclude_step0`` leaves step 0 out of Best).
Schemas: docs/contracts.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .. import records as rec
from ..outputs import write_files
from .heldout import HELDOUT_BY, best_row, by_benchmarks, by_samples, heldout_columns, unscored_steps
from .metrics import bootstrap_ci, pass_at_ks
from .problems import GRADER_NAMES, complete_units, run_scores
from .scores import DEFAULT, SCORES, last_best_score_columns, summary_score_columns

SUMMARY_HEAD = ["run", "checkpoint", "step", "benchmark", "grader", "prompt_style", "n_problems", "n_samples",
                *SCORES[DEFAULT].summary_columns]  # fmt: skip
LAST_BEST_HEAD = ["run", "benchmark", "grader", *SCORES[DEFAULT].last_best_columns]
# The other scores' columns (scores.py), after the columns above (and summary.csv's pass@k).
SUMMARY_MORE = [c for c in summary_score_columns() if c not in SUMMARY_HEAD]
LAST_BEST_MORE = [*(c for c in last_best_score_columns() if c not in LAST_BEST_HEAD), "heldout_by"]


def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of the given samples.jsonl files (or run directories), each (run, checkpoint,
    step, benchmark, problem, sample) once: a key seen again (two runs that wrote one directory at
    once, or a file given twice) is counted once, with a warning.  Records of one run name made
    with other settings (sampling, seed) or other data (another gold for a problem) are refused,
    naming the setting and both places: they are two runs, not one. So is a checkpoint of one run
    at two steps (a record that disagrees with the others, or two passes over a checkpoint that
    changed between them): its scores would be split or dropped."""
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    made: dict[Any, tuple[Any, str]] = {}  # what a run's records must share -> (value, where first seen)
    dupes = 0
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "samples.jsonl"
        for lineno, r in rec.read_records_numbered(p):
            _check_same_run(r, f"{p}:{lineno}", made)
            key = record_key(r)
            if key in seen:
                dupes += 1
                continue
            seen.add(key)
            out.append(r)
    if dupes:
        print(f"[rpg-eval] {dupes} duplicate records (same run, checkpoint, step, benchmark, problem, sample) counted once",
              file=sys.stderr)  # fmt: skip
    return out


def _check_same_run(r: dict[str, Any], where: str, made: dict[Any, tuple[Any, str]]) -> None:
    """Refuse a record whose settings or gold differ from an earlier record of the same run."""
    facts = {f"sampling.{k}": v for k, v in (r.get("sampling") or {}).items()}  # a mapping: records.py
    for what, value in {**facts, "seed": r.get("seed")}.items():
        first = made.setdefault((r["run"], what), (value, where))
        if first[0] != value:
            raise ValueError(
                f"{where}: run {r['run']!r} was made with {what} {value!r} here and {first[0]!r} at "
                f"{first[1]}: two runs under one name; summarize them separately (another --out) or "
                "give them different --run names"
            )
    first = made.setdefault((r["run"], "step", r["checkpoint"]), (r["step"], where))
    if first[0] != r["step"]:
        raise ValueError(
            f"{where}: run {r['run']!r}, checkpoint {r['checkpoint']!r} is at step {r['step']} here and at step "
            f"{first[0]} at {first[1]}: one checkpoint, two steps (two passes over a checkpoint that changed, or "
            "an edited record); summarize each pass separately, or give them different --run names"
        )
    if "gold" in r:
        key = (r["run"], "gold", r["benchmark"], str(r["problem_id"]))
        first = made.setdefault(key, (r["gold"], where))
        if first[0] != r["gold"]:
            raise ValueError(
                f"{where}: run {r['run']!r}, {r['benchmark']} problem {r['problem_id']}: gold {r['gold']!r} here "
                f"and {first[0]!r} at {first[1]}: records of other data under one run name; summarize them "
                "separately"
            )


def record_key(r: dict[str, Any]) -> tuple[str, str, int, str, str, int]:
    """What identifies a sample record: (run, checkpoint, step, benchmark, problem_id, sample_index)."""
    return (
        r["run"],
        r["checkpoint"],
        int(r["step"]),
        r["benchmark"],
        str(r["problem_id"]),
        int(r["sample_index"]),
    )


def summary_rows(
    records: list[dict[str, Any]], seed: int = 0, iters: int = 2000, warn: bool = True
) -> list[dict[str, Any]]:
    """summary.csv rows: every score of scores.py with its interval (problems resampled with one
    seed), its values on the selection and scoring halves of each problem's samples (the latter
    with its interval; heldout.py), and pass@k. Problems with fewer samples than the unit's maximum
    (an interrupted unit) are left out, with a warning."""
    units, styles = complete_units(records, warn=warn)
    scores = run_scores(records, warn=False)
    rows = []
    for key, samples in units.items():
        run, ckpt, step, bench = key
        for g in GRADER_NAMES:
            row = {"run": run, "checkpoint": ckpt, "step": step, "benchmark": bench, "grader": g,
                   "prompt_style": next(iter(styles[(run, bench)])), "n_problems": len(samples),
                   "n_samples": len(samples[0])}  # fmt: skip
            for s in SCORES.values():
                c = next(c for c in scores[(run, bench, g, s.key)].checkpoints if c.checkpoint == ckpt)
                lo, hi = bootstrap_ci(c.full, iters=iters, seed=seed)
                row.update({s.value: float(np.mean(c.full)), s.ci[0]: lo, s.ci[1]: hi})
                if c.sel is not None and c.held is not None:
                    lo, hi = bootstrap_ci(c.held, iters=iters, seed=seed)
                    row.update({s.sel: float(np.mean(c.sel)), s.held: float(np.mean(c.held)),
                                s.held_ci[0]: lo, s.held_ci[1]: hi})  # fmt: skip
            row.update(pass_at_ks([[r["correct"][g] for r in s] for s in samples]))
            rows.append(row)
    return rows


def last_best_rows(
    rows: list[dict[str, Any]], exclude_step0: bool = False, heldout_by: str = "samples"
) -> list[dict[str, Any]]:
    """last_best.csv rows from summary rows: Last = highest step; Best = the highest value of each
    score (mean@k: ``best``, maj@k: ``best_maj``, ...), each the earliest step on ties; the held-out
    Best of each score (heldout.py), chosen ``heldout_by`` "samples" or "benchmarks"."""
    if heldout_by not in HELDOUT_BY:
        raise ValueError(f"--heldout-by must be one of {', '.join(HELDOUT_BY)}, got {heldout_by!r}")
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["run"], r["benchmark"], r["grader"])].append(r)
    pools = {}
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: (r["step"], r["checkpoint"]))
        pools[key] = (rs, [r for r in rs if not (exclude_step0 and r["step"] == 0)] or rs)
    out = []
    for (run, bench, g), (rs, pool) in sorted(pools.items()):
        last = rs[-1]
        others = [p for (r2, b2, g2), (_, p) in sorted(pools.items()) if (r2, g2) == (run, g) and b2 != bench]
        row: dict[str, Any] = {"run": run, "benchmark": bench, "grader": g, "last_step": last["step"],
                               "heldout_by": heldout_by}  # fmt: skip
        left_out = unscored_steps(pool, others) if heldout_by == "benchmarks" and others else []
        if left_out and g == GRADER_NAMES[0]:  # the same steps under every grader: said once
            print(f"[rpg-eval] {run} {bench}: held-out Best by benchmarks chooses among the steps every "
                  f"benchmark scored; left out step(s) {', '.join(map(str, left_out))}", file=sys.stderr)  # fmt: skip
        for s in SCORES.values():
            # no row with a number for this score (a summary.csv written before it): Best of mean@k
            # falls back to the first checkpoint, the others are left empty
            best = best_row(pool, s.value) or (pool[0] if s.key == DEFAULT else {})
            for col, ci, src in ((s.last, s.last_ci, last), (s.best, s.best_ci, best)):
                row.update({col: src.get(s.value, math.nan), ci[0]: src.get(s.ci[0], math.nan),
                            ci[1]: src.get(s.ci[1], math.nan)})  # fmt: skip
            row[s.best_step] = best.get("step", math.nan)
            chosen = by_samples(pool, s) if heldout_by == "samples" else by_benchmarks(pool, others, s)
            row.update(heldout_columns(chosen, s, heldout_by))
        out.append(row)
    return out


def disagreements(records: list[dict[str, Any]], max_examples: int = 5) -> dict[str, Any]:
    """Where the two graders disagree: counts and a few examples (shortened)."""
    mv_only = [r for r in records if r["correct"]["math_verify"] and not r["correct"]["paper"]]
    pa_only = [r for r in records if r["correct"]["paper"] and not r["correct"]["math_verify"]]

    def ex(r: dict[str, Any]) -> dict[str, Any]:
        return {
            "checkpoint": r.get("checkpoint"),
            "benchmark": r.get("benchmark"),
            "problem_id": r.get("problem_id"),
            "sample_index": r.get("sample_index"),
            "gold": r.get("gold"),
            "extracted": r.get("extracted"),
            "response_tail": str(r.get("response", ""))[-200:],
        }

    return {
        "n_samples": len(records),
        "n_disagree": len(mv_only) + len(pa_only),
        "math_verify_only": len(mv_only),
        "paper_only": len(pa_only),
        "examples_math_verify_only": [ex(r) for r in mv_only[:max_examples]],
        "examples_paper_only": [ex(r) for r in pa_only[:max_examples]],
    }


def _csv_text(head: list[str], rows: list[dict[str, Any]]) -> str:
    """A table as csv text (its columns: ``head``, then any others, in _col_order)."""
    extra = sorted({k for r in rows for k in r} - set(head), key=_col_order)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=head + extra, restval="")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _col_order(c: str) -> tuple[int, int, str]:
    """Extra columns: pass@k by k, then the other scores' columns, then any other by name."""
    if c.startswith("pass@"):
        return (0, int(c.split("@")[1]), c)
    known = SUMMARY_MORE + LAST_BEST_MORE
    return (1, known.index(c), c) if c in known else (2, 0, c)


def summary_tables(
    records: list[dict[str, Any]],
    exclude_step0: bool = False,
    seed: int = 0,
    iters: int = 2000,
    heldout_by: str = "samples",
) -> dict[str, Any]:
    """What summarize writes, computed from ``records`` (load_records): {"summary", "last_best",
    "disagreements"}."""
    if not records:
        raise ValueError("no records to summarize")
    rows = summary_rows(records, seed=seed, iters=iters)
    lb = last_best_rows(rows, exclude_step0=exclude_step0, heldout_by=heldout_by)
    return {"summary": rows, "last_best": lb, "disagreements": disagreements(records)}


def write_summary(out: str | Path, result: dict[str, Any]) -> None:
    """summary.csv, last_best.csv and disagreements.json into the open directory ``out`` (each
    replaced atomically, never through a link: the project's write policy). Every text is made
    (and encoded) before the first write: a failure leaves no table of the new ones beside the old."""
    texts = {
        "summary.csv": _csv_text(SUMMARY_HEAD, result["summary"]),
        "last_best.csv": _csv_text(LAST_BEST_HEAD + LAST_BEST_MORE, result["last_best"]),
        "disagreements.json": json.dumps(result["disagreements"], indent=1, ensure_ascii=False),
    }
    for text in texts.values():
        text.encode("utf-8")  # a lone surrogate fails here, not after two files were replaced
    write_files(out, texts)


def print_headline(result: dict[str, Any], headline: str = "math_verify") -> None:
    """Last and Best of every run and benchmark under the headline grader, and the graders' disagreement."""
    for r in result["last_best"]:
        if r["grader"] == headline:
            others = "".join(
                f"; {s.name} last={100 * r[s.last]:.1f} best={100 * r[s.best]:.1f} (step {r[s.best_step]})"
                for s in SCORES.values()
                if s.key != DEFAULT
            )
            print(
                f"{r['run']} {r['benchmark']} [{headline}] last={100 * r['last']:.1f} (step {r['last_step']}) "
                f"best={100 * r['best']:.1f} (step {r['best_step']}){others}"
            )
    dis = result["disagreements"]
    print(f"graders disagree on {dis['n_disagree']} of {dis['n_samples']} samples (see disagreements.json)")


def summarize(
    paths: Iterable[str | Path],
    out: str | Path,
    exclude_step0: bool = False,
    seed: int = 0,
    iters: int = 2000,
    headline: str = "math_verify",
    heldout_by: str = "samples",
) -> dict[str, Any]:
    """Write summary.csv, last_best.csv and disagreements.json into ``out`` (an open directory, or a
    path: created only once the tables are computed, so a failure leaves no empty directory); print
    the headline. Which directory a command may write is the command's to decide (eval/outputs.py)."""
    result = summary_tables(load_records(paths), exclude_step0, seed, iters, heldout_by)
    write_summary(out, result)
    print_headline(result, headline)
    return result
