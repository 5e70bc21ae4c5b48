"""The table builder's inputs: the paper's reported numbers (``paper_tables.csv``) and users' runs
(``last_best.csv``, or a ``summary.csv`` reduced to Last / Best), read and checked.

Bad input raises :class:`TableError` naming the file, the line and the column. Imports nothing
from the training side.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from rpg_openrlhf.common.atomic import write_file

from ...outputs import read_input
from ...stats.scores import (
    DEFAULT,
    SCORES,
    last_best_score_columns,
    score_intervals,
    step_columns,
    summary_score_columns,
)
from .layout import TableError, benchmark_key

PAPER_COLUMNS = ("table", "model", "context", "method", "benchmark", "last", "best")
LAST_BEST_REQUIRED = ("run", "benchmark", "last", "best")
LAST_BEST_OPTIONAL = tuple(c for c in last_best_score_columns() if c not in LAST_BEST_REQUIRED)
SUMMARY_REQUIRED = ("run", "step", "benchmark", "mean")
# The repository's copy of the paper's numbers, wherever the command runs from (not the current
# directory's results/: run elsewhere, that was another file or none).
DEFAULT_PAPER = Path(__file__).resolve().parents[3] / "results" / "paper" / "paper_tables.csv"
STEP_COLUMNS = tuple(step_columns())
_STEP_RE = re.compile(r"[0-9]+")  # a step is ASCII digits: not "10.5", "-1", "1e3" or "٣"


def _require_columns(df: pd.DataFrame, columns: Iterable[str], path: str, what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TableError(
            f"{path}: missing column(s) {', '.join(missing)} for {what}; found: {', '.join(map(str, df.columns))}"
        )


def _numeric(df: pd.DataFrame, column: str, path: str, required: bool = True) -> None:
    """Convert ``df[column]`` to float in place, naming the first bad row on failure; a step column
    (STEP_COLUMNS) must hold ASCII digits (an empty cell or "nan" where it is optional)."""
    if column not in df.columns:
        if not required:
            df[column] = math.nan
        return
    raw = df[column]
    if column in STEP_COLUMNS:
        text = raw.astype(str).str.strip()
        missing = text.isin(["", "nan"]) & (not required)
        bad = ~(text.map(lambda t: _STEP_RE.fullmatch(t) is not None) | missing)
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise TableError(
                f"{path}: column '{column}' row {i + 2} (line of the file): value {raw.iloc[i]!r} is not a "
                "checkpoint step (ASCII digits, an integer >= 0)"
            )
    values = pd.to_numeric(raw.replace("", math.nan), errors="coerce")
    # "nan": what summarize writes for a score it cannot compute (a held-out Best of one sample each)
    bad = values.isna() & raw.notna() & ~raw.astype(str).str.strip().isin(["", "nan"])
    bad |= values.isin([math.inf, -math.inf])  # "inf", "1e400": never a score, and it would rank first
    if required:
        bad |= values.isna()
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        what = "not a finite number" if values.iloc[i] in (math.inf, -math.inf) else "not a number"
        raise TableError(
            f"{path}: column '{column}' row {i + 2} (line of the file): value {raw.iloc[i]!r} is {what}"
        )
    df[column] = values.astype(float)


# Score columns with their interval columns, as rpg-eval writes them (summary.csv, last_best.csv).
_INTERVALS = tuple(score_intervals())
_INTERVAL_SLACK = 1e-9  # a percentile of means of equal values may differ from their mean by an ulp


def _check_scores(df: pd.DataFrame, path: str) -> None:
    """Refuse a row whose score is negative (a share of problems solved is >= 0) or lies outside
    its own interval (``ci_low > mean``): such a table would be meaningless, not wrong-looking."""
    for value, low, high in _INTERVALS:
        if value not in df.columns:
            continue
        v = df[value]
        checks = [(v < 0, f"'{value}' is negative; a score is a share of problems solved, >= 0")]
        if low in df.columns:
            checks.append(
                (df[low] > v + _INTERVAL_SLACK, f"'{low}' is above '{value}'; its interval must hold it")
            )
        if high in df.columns:
            checks.append(
                (df[high] < v - _INTERVAL_SLACK, f"'{high}' is below '{value}'; its interval must hold it")
            )
        for bad, what in checks:
            if bad.any():
                i = int(bad.to_numpy().nonzero()[0][0])
                shown = ", ".join(f"{c}={df[c].iloc[i]:g}" for c in (value, low, high) if c in df.columns)
                raise TableError(f"{path}: row {i + 2} (line of the file): {what} ({shown})")


def _read_csv(path: str | Path) -> pd.DataFrame:
    p = Path(path)
    data = read_input(p)  # missing, a FIFO or a device: refused in one line, not waited on or read forever
    try:
        return pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TableError(f"{p}: not a readable CSV file ({exc})") from exc


def load_paper(path: str | Path) -> pd.DataFrame:
    """Read a paper-numbers CSV (``table,model,context,method,benchmark,last,best[,note]``).

    Benchmarks are normalised to keys (``aime24``); ``last``/``best`` become floats. Raises
    :class:`TableError` naming the file and column on bad input or duplicated cells.
    """
    name = str(path)
    df = _read_csv(path)
    _require_columns(df, PAPER_COLUMNS, name, "the paper's numbers")
    df = df.copy()
    for c in ("table", "model", "context", "method", "benchmark"):
        df[c] = df[c].astype(str).str.strip()
        empty = df[c] == ""
        if empty.any():
            raise TableError(
                f"{name}: column '{c}' is empty on line {int(empty.to_numpy().nonzero()[0][0]) + 2}"
            )
    df["benchmark"] = df["benchmark"].map(benchmark_key)
    for c in ("last", "best"):
        _numeric(df, c, name)
    _check_scores(df, name)
    if "note" not in df.columns:
        df["note"] = ""
    dup = df.duplicated(["table", "method", "benchmark"], keep=False)
    if dup.any():
        r = df[dup].iloc[0]
        raise TableError(
            f"{name}: table {r['table']} method {r['method']} benchmark {r['benchmark']} appears twice"
        )
    return df


def import_paper(src: str | Path, dest: str | Path) -> pd.DataFrame:
    """Normalise the reference CSV into the project's ``paper_tables.csv`` and write it.

    Keeps every row and its order; benchmark names become keys; numbers are written with
    four decimals, as printed in the paper; a ``note`` column flags the paper's own
    oddities (Last > Best), which are kept as printed.
    """
    df = load_paper(src)
    notes = []
    for _, r in df.iterrows():
        note = str(r.get("note", "") or "")
        if r["last"] > r["best"] and not note:
            note = "Last > Best as printed in the paper (kept)"
        notes.append(note)
    out = df[list(PAPER_COLUMNS)].copy()
    out["note"] = notes
    for c in ("last", "best"):
        out[c] = out[c].map(lambda v: f"{v:.4f}")
    write_file(dest, out.to_csv(index=False, lineterminator="\n"), "--out")  # a link there: refused
    return df


def _last_best_from_summary(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Derive Last (latest step) / Best (highest mean, earliest on ties) from a summary.csv,
    with the same rule as ``rpg-eval summarize`` (:func:`rpg_eval.stats.summary.last_best_rows`)."""
    from ...stats.summary import last_best_rows

    for c in ("step", "mean"):
        _numeric(df, c, name)
    for c in summary_score_columns():
        if c not in SUMMARY_REQUIRED:
            _numeric(df, c, name, required=False)
    _check_scores(df, name)
    for c in ("grader", "checkpoint"):
        if c not in df.columns:
            df[c] = ""
    return pd.DataFrame(last_best_rows(df.to_dict("records")))


def load_runs(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Read users' ``last_best.csv`` files (or ``summary.csv``, reduced to Last/Best).

    Returns one row per (run, benchmark, grader) with a ``file`` column. A run that
    appears in two files for the same benchmark and grader is an error naming both files.
    """
    frames = []
    for p in paths:
        name = str(p)
        df = _read_csv(p)
        # written before the held-out Best existed (its columns are added below as empty ones)
        has_heldout = SCORES[DEFAULT].heldout in df.columns or SCORES[DEFAULT].sel in df.columns
        if all(c in df.columns for c in LAST_BEST_REQUIRED):
            for c in ("last", "best"):
                _numeric(df, c, name)
            for c in LAST_BEST_OPTIONAL:
                _numeric(df, c, name, required=False)
            df["grader"] = df.get("grader", "")
            _check_scores(df, name)
        elif all(c in df.columns for c in SUMMARY_REQUIRED):
            df = _last_best_from_summary(df, name)
        else:
            _require_columns(
                df,
                LAST_BEST_REQUIRED,
                name,
                "a last_best.csv (or run, step, benchmark, mean of a summary.csv)",
            )
        if df.empty:
            raise TableError(f"{name}: no rows")
        df["run"] = df["run"].astype(str).str.strip()
        df["grader"] = df["grader"].astype(str).str.strip()
        df["benchmark"] = df["benchmark"].map(benchmark_key)
        df["file"] = name
        df["has_heldout"] = has_heldout
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=[*LAST_BEST_REQUIRED, "grader", *LAST_BEST_OPTIONAL, "file"])
    runs = pd.concat(frames, ignore_index=True)
    dup = runs.duplicated(["run", "benchmark", "grader"], keep=False)
    if dup.any():
        d = runs[dup]
        r = d.iloc[0]
        files = sorted(set(d[(d["run"] == r["run"]) & (d["benchmark"] == r["benchmark"])]["file"]))
        raise TableError(
            f"run '{r['run']}' benchmark {r['benchmark']} grader '{r['grader']}' appears more than once "
            f"(in {', '.join(files)}); rename the run or pass each file once"
        )
    return runs
