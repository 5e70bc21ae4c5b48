"""The paper's comparison tables (Last / Best per benchmark), with a user's runs beside them.

Rows are methods (the paper's reported numbers, from ``paper_tables.csv``) and runs (from the
``last_best.csv`` files that ``rpg-eval summarize`` writes, or a ``summary.csv``); columns are
benchmarks; each cell is ``Last / Best`` (mean@k), with the 95% interval where a run has one.
Which rows, their labels and order live in a yaml layout (``rpg_eval/tables.yaml`` by default).

Ranking rule (documented in docs/tables.md): within each benchmark column the Last values and
the Best values are ranked separately, on the value as displayed (rounded to ``digits``); the
highest value is bold, the second highest distinct value underlined; ties share the mark. The
number itself is marked, not the whole cell.

Usage::

    rpg-eval table [--layout L.yaml] [--paper results/paper/paper_tables.csv] [--table T3 ...]
                   [--runs last_best.csv ...] [--label RUN=LABEL] [--grader math_verify]
                   [--formats md,tex,csv] [--out DIR]
    rpg-eval table import-paper SRC.csv [--out results/paper/paper_tables.csv]

Also runnable as ``python -m rpg_eval.tables``. Imports nothing from the training side.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from rpg_openrlhf.common.atomic import atomic_write
from rpg_openrlhf.common.cliutil import OneLineParser, describe

PAPER_COLUMNS = ("table", "model", "context", "method", "benchmark", "last", "best")
LAST_BEST_REQUIRED = ("run", "benchmark", "last", "best")
LAST_BEST_OPTIONAL = (
    "grader",
    "last_step",
    "last_ci_low",
    "last_ci_high",
    "best_step",
    "best_ci_low",
    "best_ci_high",
    "last_maj",
    "last_maj_ci_low",
    "last_maj_ci_high",
    "best_maj",
    "best_maj_step",
    "best_maj_ci_low",
    "best_maj_ci_high",
)
# What a cell shows: metric -> the last_best.csv columns of Last and Best (value, step, interval).
METRICS = {
    "mean": {"last": "last", "last_step": "last_step", "last_ci": ("last_ci_low", "last_ci_high"),
             "best": "best", "best_step": "best_step", "best_ci": ("best_ci_low", "best_ci_high")},
    "maj": {"last": "last_maj", "last_step": "last_step", "last_ci": ("last_maj_ci_low", "last_maj_ci_high"),
            "best": "best_maj", "best_step": "best_maj_step", "best_ci": ("best_maj_ci_low", "best_maj_ci_high")},
}  # fmt: skip
SUMMARY_REQUIRED = ("run", "step", "benchmark", "mean")
DEFAULT_PAPER = Path("results/paper/paper_tables.csv")
FORMATS = ("md", "tex", "csv")
BOLD, UNDERLINE = "bold", "underline"
CSV_COLUMNS = (
    "table",
    "row",
    "label",
    "source",
    "model",
    "context",
    "method",
    "run",
    "grader",
    "benchmark",
    "last",
    "best",
    "last_mark",
    "best_mark",
    "last_ci_low",
    "last_ci_high",
    "best_ci_low",
    "best_ci_high",
    "last_step",
    "best_step",
    "note",
)


TABLE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")  # table ids are file names under --out


class TableError(ValueError):
    """Bad input to the table builder (the message names the file, column or run)."""


# --------------------------------------------------------------------------- data model


@dataclass
class RowSpec:
    """One row of a layout: a paper method or a user run."""

    method: str | None = None
    run: str | None = None
    label: str | None = None
    grader: str | None = None

    @property
    def name(self) -> str:
        """Label to print (the given label, else the method or run name)."""
        return self.label or self.method or self.run or ""


@dataclass
class TableSpec:
    """Layout of one table: columns, rows, ranking scope and number formats."""

    id: str
    title: str
    paper_table: str | None
    benchmarks: list[str]
    rows: list[RowSpec] | None
    rank: str = "all"
    digits: int = 4
    ci_digits: int = 3
    metric: str = "mean"  # what the runs' cells show: mean@k or maj@k (METRICS)


@dataclass
class Layout:
    """A parsed layout file: benchmark display names and the tables in order."""

    benchmarks: dict[str, str]
    tables: dict[str, TableSpec]
    path: str = "<layout>"

    def display(self, bench: str) -> str:
        """Display name of a benchmark key (AIME24 for aime24)."""
        return self.benchmarks.get(bench, bench.upper())


@dataclass
class Cell:
    """One benchmark cell of one row."""

    last: float = math.nan
    best: float = math.nan
    last_ci: tuple[float, float] | None = None
    best_ci: tuple[float, float] | None = None
    last_step: float = math.nan
    best_step: float = math.nan
    last_mark: str = ""
    best_mark: str = ""
    note: str = ""


@dataclass
class Row:
    """A built row: label, where it comes from and its cells by benchmark key."""

    label: str
    source: str  # "paper" or "run"
    method: str = ""
    run: str = ""
    grader: str = ""
    model: str = ""
    context: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)


@dataclass
class BuiltTable:
    """A table ready to render."""

    spec: TableSpec
    benchmark_labels: dict[str, str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def benchmark_key(name: str) -> str:
    """Normalise a benchmark name to the contract's key: ``"AIME24"`` -> ``"aime24"``."""
    return str(name).strip().lower().replace(" ", "").replace("-", "").replace("_", "")


def _is_nan(x: Any) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _require_columns(df: pd.DataFrame, columns: Iterable[str], path: str, what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TableError(
            f"{path}: missing column(s) {', '.join(missing)} for {what}; found: {', '.join(map(str, df.columns))}"
        )


def _numeric(df: pd.DataFrame, column: str, path: str, required: bool = True) -> None:
    """Convert ``df[column]`` to float in place, naming the first bad row on failure."""
    if column not in df.columns:
        if not required:
            df[column] = math.nan
        return
    raw = df[column]
    values = pd.to_numeric(raw.replace("", math.nan), errors="coerce")
    bad = values.isna() & raw.notna() & (raw.astype(str).str.strip() != "")
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
_INTERVALS = (
    ("mean", "ci_low", "ci_high"),
    ("maj", "maj_ci_low", "maj_ci_high"),
    ("last", "last_ci_low", "last_ci_high"),
    ("best", "best_ci_low", "best_ci_high"),
    ("last_maj", "last_maj_ci_low", "last_maj_ci_high"),
    ("best_maj", "best_maj_ci_low", "best_maj_ci_high"),
)
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
    if not p.is_file():
        raise TableError(f"{p}: file not found")
    try:
        return pd.read_csv(p, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TableError(f"{p}: not a readable CSV file ({exc})") from exc


# --------------------------------------------------------------------------- inputs


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
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _write(dest, out.to_csv(index=False, lineterminator="\n"))
    return df


def _last_best_from_summary(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Derive Last (latest step) / Best (highest mean, earliest on ties) from a summary.csv,
    with the same rule as ``rpg-eval summarize`` (:func:`rpg_eval.summary.last_best_rows`)."""
    from .summary import last_best_rows

    for c in ("step", "mean"):
        _numeric(df, c, name)
    for c in ("ci_low", "ci_high", "maj", "maj_ci_low", "maj_ci_high"):
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
        if all(c in df.columns for c in LAST_BEST_REQUIRED):
            for c in ("last", "best"):
                _numeric(df, c, name)
            for c in LAST_BEST_OPTIONAL:
                if c == "grader":
                    if c not in df.columns:
                        df[c] = ""
                else:
                    _numeric(df, c, name, required=False)
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
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=[*LAST_BEST_REQUIRED, *LAST_BEST_OPTIONAL, "file"])
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


def _paper_key(t: dict[str, Any], tid: str) -> str | None:
    """The paper table a layout table draws on: its ``paper_table`` (null: none), else its id."""
    if "paper_table" not in t:
        return tid
    return None if t["paper_table"] is None else str(t["paper_table"])


def load_layout(path: str | Path | None = None) -> Layout:
    """Parse a layout yaml (default: the packaged ``rpg_eval/tables.yaml``)."""
    if path is None:
        text = resources.files("rpg_eval").joinpath("tables.yaml").read_text(encoding="utf-8")
        name = "rpg_eval/tables.yaml"
    else:
        p = Path(path)
        if not p.is_file():
            raise TableError(f"{p}: layout file not found")
        text, name = p.read_text(encoding="utf-8"), str(p)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise TableError(f"{name}: not valid yaml ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("tables"), dict) or not data["tables"]:
        raise TableError(f"{name}: needs a 'tables:' mapping of table id -> layout")
    defaults = data.get("defaults") or {}
    benchmarks = {benchmark_key(k): str(v) for k, v in (data.get("benchmarks") or {}).items()}
    tables = {str(tid): _table_spec(name, str(tid), t, defaults) for tid, t in data["tables"].items()}
    return Layout(benchmarks=benchmarks, tables=tables, path=name)


_TABLE_KEYS = {"title", "paper_table", "benchmarks", "rows", "rank", "digits", "ci_digits"}


def _table_spec(name: str, tid: str, t: Any, defaults: dict[str, Any]) -> TableSpec:
    """One table of a layout file ``name``."""
    # The id becomes a file name under --out: no separators or '..' (it must not escape --out).
    if not TABLE_ID_RE.fullmatch(tid) or tid in (".", ".."):
        raise TableError(f"{name}: table id {tid!r} must match [A-Za-z0-9._-]+ (and not be '.' or '..')")
    t = t or {}
    if not isinstance(t, dict):
        raise TableError(f"{name}: table {tid} must be a mapping")
    unknown = set(t) - _TABLE_KEYS
    if unknown:
        raise TableError(
            f"{name}: table {tid} has unknown key(s) {sorted(unknown)}; known: {sorted(_TABLE_KEYS)}"
        )
    rows = None if t.get("rows") is None else [_row_spec(name, tid, i, r) for i, r in enumerate(t["rows"])]
    rank = str(t.get("rank", defaults.get("rank", "all")))
    if rank not in ("all", "paper"):
        raise TableError(f"{name}: table {tid} rank must be 'all' or 'paper', got {rank!r}")
    return TableSpec(
        id=tid,
        title=str(t.get("title", tid)),
        paper_table=_paper_key(t, tid),
        benchmarks=[benchmark_key(b) for b in (t.get("benchmarks") or [])],
        rows=rows,
        rank=rank,
        digits=int(t.get("digits", defaults.get("digits", 4))),
        ci_digits=int(t.get("ci_digits", defaults.get("ci_digits", 3))),
    )


def _row_spec(name: str, tid: str, i: int, r: Any) -> RowSpec:
    """Row ``i`` of table ``tid``: exactly one of method / run, optional label and grader."""
    if not isinstance(r, dict) or (("method" in r) == ("run" in r)):
        raise TableError(f"{name}: table {tid} row {i + 1} needs exactly one of 'method' or 'run': {r!r}")
    bad = set(r) - {"method", "run", "label", "grader"}
    if bad:
        raise TableError(f"{name}: table {tid} row {i + 1} has unknown key(s) {sorted(bad)}")
    text = {k: None if r.get(k) is None else str(r[k]) for k in ("method", "run", "label", "grader")}
    return RowSpec(**text)


# --------------------------------------------------------------------------- building


def _rank_marks(values: Sequence[float], digits: int) -> list[str]:
    """Bold the highest, underline the second highest distinct value (ties share a mark)."""
    rounded = [round(v, digits) for v in values if not _is_nan(v)]
    distinct = sorted(set(rounded), reverse=True)
    first = distinct[0] if distinct else None
    second = distinct[1] if len(distinct) > 1 else None
    marks = []
    for v in values:
        if _is_nan(v):
            marks.append("")
            continue
        r = round(v, digits)
        marks.append(BOLD if r == first else UNDERLINE if r == second else "")
    return marks


def _ci(low: Any, high: Any) -> tuple[float, float] | None:
    if _is_nan(low) or _is_nan(high):
        return None
    return float(low), float(high)


def _pick_grader(run: str, rows: pd.DataFrame, wanted: str | None) -> str:
    graders = sorted(set(rows["grader"]))
    if wanted is not None:
        if wanted not in graders:
            raise TableError(
                f"run '{run}' has no grader '{wanted}' (in {', '.join(sorted(set(rows['file'])))}); "
                f"graders present: {', '.join(graders)}"
            )
        return wanted
    if len(graders) > 1:
        raise TableError(
            f"run '{run}' has several graders ({', '.join(graders)}) in {', '.join(sorted(set(rows['file'])))}; "
            "choose one with --grader or a 'grader:' key on the row"
        )
    return graders[0]


def build_table(
    spec: TableSpec,
    layout: Layout,
    paper: pd.DataFrame | None,
    runs: pd.DataFrame | None = None,
    labels: dict[str, str] | None = None,
    grader: str | None = None,
    append_runs: bool = True,
    show_ci: bool = True,
    paper_path: str = "paper_tables.csv",
) -> BuiltTable:
    """Assemble one table from the paper's numbers and the users' runs.

    ``labels`` maps run name -> label (overrides the layout's); runs present in ``runs``
    but not named in the layout are appended after the paper rows when ``append_runs``.
    """
    labels = labels or {}
    runs = runs if runs is not None else pd.DataFrame(columns=["run", "benchmark", "grader", "file"])
    ptab = _paper_rows(spec, paper, paper_path)
    row_specs = _row_specs(spec, ptab, runs, append_runs)
    benches = spec.benchmarks or list(dict.fromkeys(list(ptab["benchmark"]) + list(runs["benchmark"])))
    if not benches:
        raise TableError(f"table {spec.id}: no benchmark columns (set 'benchmarks:' in {layout.path})")
    rows: list[Row] = []
    notes: list[str] = []
    for rs in row_specs:
        if rs.method is not None:
            rows.append(_paper_row(rs, spec, layout, ptab, paper_path, benches, notes))
        else:
            rows.append(_run_row(rs, spec, layout, runs, labels.get(rs.run or "", rs.name), grader, show_ci))
    _rank_columns(rows, benches, spec)
    return BuiltTable(
        spec=spec, benchmark_labels={b: layout.display(b) for b in benches}, rows=rows, notes=notes
    )


def _paper_rows(spec: TableSpec, paper: pd.DataFrame | None, paper_path: str) -> pd.DataFrame:
    """The paper's rows of this table (none for a table of runs only)."""
    if spec.paper_table is None:
        return pd.DataFrame(columns=list(PAPER_COLUMNS) + ["note"])
    if paper is None:
        raise TableError(f"table {spec.id} needs the paper's numbers (--paper)")
    ptab = paper[paper["table"] == spec.paper_table]
    if ptab.empty:
        known = ", ".join(sorted(paper["table"].unique()))
        raise TableError(
            f"{paper_path}: no rows with table == {spec.paper_table!r} (tables present: {known})"
        )
    return ptab


def _row_specs(spec: TableSpec, ptab: pd.DataFrame, runs: pd.DataFrame, append_runs: bool) -> list[RowSpec]:
    """The layout's rows (default: every paper method), then the runs it does not name."""
    row_specs = (
        list(spec.rows)
        if spec.rows is not None
        else [RowSpec(method=m) for m in dict.fromkeys(ptab["method"])]
    )
    named_runs = {r.run for r in row_specs if r.run}
    if append_runs:
        row_specs += [RowSpec(run=r) for r in dict.fromkeys(runs["run"]) if r not in named_runs]
    return row_specs


def _paper_row(
    rs: RowSpec,
    spec: TableSpec,
    layout: Layout,
    ptab: pd.DataFrame,
    paper_path: str,
    benches: list[str],
    notes: list[str],
) -> Row:
    """A row of the paper's numbers; its cells' notes (of shown benchmarks) appended to notes."""
    m = ptab[ptab["method"] == rs.method]
    if m.empty:
        raise TableError(
            f"{layout.path}: table {spec.id} names method {rs.method!r}, which {paper_path} does not "
            f"have for table {spec.paper_table} (methods: {', '.join(dict.fromkeys(ptab['method']))})"
        )
    row = Row(
        label=rs.name,
        source="paper",
        method=rs.method,
        model=str(m["model"].iloc[0]),
        context=str(m["context"].iloc[0]),
    )
    for _, r in m.iterrows():
        cell = Cell(last=float(r["last"]), best=float(r["best"]), note=str(r.get("note", "") or ""))
        row.cells[r["benchmark"]] = cell
        if cell.note and r["benchmark"] in benches:
            notes.append(f"{row.label}, {layout.display(r['benchmark'])}: {cell.note}.")
    return row


def _run_row(
    rs: RowSpec,
    spec: TableSpec,
    layout: Layout,
    runs: pd.DataFrame,
    label: str,
    grader: str | None,
    show_ci: bool,
) -> Row:
    """A row of one of the users' runs (Last / Best, their intervals and steps), one grader."""
    assert rs.run is not None
    r_all = runs[runs["run"] == rs.run]
    if r_all.empty:
        files = ", ".join(sorted(set(runs["file"]))) or "no --runs file given"
        known = ", ".join(dict.fromkeys(runs["run"])) or "none"
        raise TableError(
            f"{layout.path}: table {spec.id} names run {rs.run!r}, not found in {files} (runs: {known})"
        )
    g = _pick_grader(rs.run, r_all, rs.grader or grader)
    row = Row(label=label, source="run", run=rs.run, grader=g)
    cols = METRICS[spec.metric]
    for _, r in r_all[r_all["grader"] == g].iterrows():
        if _is_nan(r.get(cols["last"])) or _is_nan(r.get(cols["best"])):
            raise TableError(
                f"{r['file']}: run '{rs.run}' {r['benchmark']} has no maj@k (columns {cols['last']}, {cols['best']}); "
                "a last_best.csv written before maj@k: run rpg-eval summarize again"
            )
        row.cells[r["benchmark"]] = Cell(
            last=float(r[cols["last"]]),
            best=float(r[cols["best"]]),
            last_ci=_ci(r.get(cols["last_ci"][0]), r.get(cols["last_ci"][1])) if show_ci else None,
            best_ci=_ci(r.get(cols["best_ci"][0]), r.get(cols["best_ci"][1])) if show_ci else None,
            last_step=float(r.get(cols["last_step"], math.nan)),
            best_step=float(r.get(cols["best_step"], math.nan)),
        )
    return row


def _rank_columns(rows: list[Row], benches: list[str], spec: TableSpec) -> None:
    """Mark each column's ranks, Last and Best separately (paper rows only unless rank: all)."""
    ranked = [r for r in rows if spec.rank == "all" or r.source == "paper"]
    if spec.metric != "mean":  # the paper's rows are mean@32: ranked only against mean@k
        ranked = [r for r in ranked if r.source == "run"]
    for b in benches:
        for key in ("last", "best"):
            vals = [getattr(r.cells[b], key) if b in r.cells else math.nan for r in ranked]
            for r, mark in zip(ranked, _rank_marks(vals, spec.digits)):
                if b in r.cells:
                    setattr(r.cells[b], f"{key}_mark", mark)


# --------------------------------------------------------------------------- rendering


def _fmt(v: float, digits: int) -> str:
    return "–" if _is_nan(v) else f"{v:.{digits}f}"


def _legend(t: BuiltTable) -> list[str]:
    lines = [
        "Each cell: Last / Best (mean accuracy over the samples of each problem; the paper: mean@32). "
        "Bold: highest, underlined: second highest of the column; Last and Best ranked separately"
        + (" (paper rows only)" if t.spec.rank == "paper" else "")
        + "; ties share the mark."
    ]
    if t.spec.metric == "maj":
        lines[0] = (
            "Runs' cells: Last / Best of maj@k (majority vote over each problem's k samples, equivalent "
            "answers grouped; Best = the checkpoint with the highest maj@k); the paper's rows: mean@32 as "
            "reported. Bold: highest, underlined: second highest among the runs; Last and Best ranked "
            "separately; ties share the mark."
        )
    if any(r.source == "run" for r in t.rows):
        lines.append(
            "Rows after the paper's are runs of this project; [low, high]: 95% interval; –: not evaluated."
        )
    return lines + t.notes


@dataclass(frozen=True)
class Markup:
    """How one output format writes a cell: str.format templates for a marked value and an interval."""

    missing: str  # a value or cell not evaluated
    marks: dict[str, str]  # BOLD / UNDERLINE -> template of the value
    ci: str  # template of the interval appended to a value ({lo}, {hi})


MARKDOWN = Markup("–", {BOLD: "**{}**", UNDERLINE: "<u>{}</u>"}, " [{lo}, {hi}]")
LATEX = Markup(
    "--", {BOLD: r"\textbf{{{}}}", UNDERLINE: r"\underline{{{}}}"}, r"{{\scriptsize\,[{lo}, {hi}]}}"
)


def _value(v: float, mark: str, ci: tuple[float, float] | None, spec: TableSpec, fmt: Markup) -> str:
    """One number of a cell: value, its rank mark, its interval."""
    s = fmt.missing if _is_nan(v) else f"{v:.{spec.digits}f}"
    if mark in fmt.marks:
        s = fmt.marks[mark].format(s)
    if ci is not None:
        s += fmt.ci.format(lo=f"{ci[0]:.{spec.ci_digits}f}", hi=f"{ci[1]:.{spec.ci_digits}f}")
    return s


def _cell(c: Cell | None, spec: TableSpec, fmt: Markup) -> str:
    """A cell: Last / Best, or the format's missing mark."""
    if c is None:
        return fmt.missing
    return (
        _value(c.last, c.last_mark, c.last_ci, spec, fmt)
        + " / "
        + _value(c.best, c.best_mark, c.best_ci, spec, fmt)
    )


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(t: BuiltTable, heading: str = "###") -> str:
    """Render a table as GitHub Markdown (bold ``**x**``, underline ``<u>x</u>``)."""
    benches = list(t.benchmark_labels)
    lines = [f"{heading} {t.spec.title}", ""] if heading else []
    lines.append("| Method | " + " | ".join(t.benchmark_labels[b] for b in benches) + " |")
    lines.append("|:---|" + "|".join(":---:" for _ in benches) + "|")
    for r in t.rows:
        cells = [_cell(r.cells.get(b), t.spec, MARKDOWN) for b in benches]
        lines.append(f"| {_md_escape(r.label)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{line}  " for line in _legend(t)]
    return "\n".join(lines).rstrip() + "\n"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(s: str) -> str:
    """Escape LaTeX special characters in a label."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in s)


def to_latex(t: BuiltTable) -> str:
    """Render a table as a LaTeX ``table`` (needs ``\\usepackage{booktabs}``)."""
    benches = list(t.benchmark_labels)
    out = [
        "% generated by rpg-eval table; needs \\usepackage{booktabs}",
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{tex_escape(t.spec.title)}}}",
        rf"\label{{tab:{tex_escape(t.spec.id)}}}",
        r"\begin{tabular}{l" + "c" * len(benches) + "}",
        r"\toprule",
        "Method & " + " & ".join(tex_escape(t.benchmark_labels[b]) for b in benches) + r" \\",
        " & " + " & ".join("Last / Best" for _ in benches) + r" \\",
        r"\midrule",
    ]
    prev = None
    for r in t.rows:
        if prev is not None and prev != r.source:
            out.append(r"\midrule")
        prev = r.source
        cells = [_cell(r.cells.get(b), t.spec, LATEX) for b in benches]
        out.append(tex_escape(r.label) + " & " + " & ".join(cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(out)


def to_frame(t: BuiltTable) -> pd.DataFrame:
    """Tidy form: one row per (table row, benchmark) with values, marks, intervals and steps."""
    recs = []
    for i, r in enumerate(t.rows):
        for b in t.benchmark_labels:
            c = r.cells.get(b)
            if c is None:
                continue
            recs.append(
                {
                    "table": t.spec.id,
                    "row": i + 1,
                    "label": r.label,
                    "source": r.source,
                    "model": r.model,
                    "context": r.context,
                    "method": r.method,
                    "run": r.run,
                    "grader": r.grader,
                    "benchmark": b,
                    "last": _fmt(c.last, t.spec.digits),
                    "best": _fmt(c.best, t.spec.digits),
                    "last_mark": c.last_mark,
                    "best_mark": c.best_mark,
                    "last_ci_low": c.last_ci[0] if c.last_ci else math.nan,
                    "last_ci_high": c.last_ci[1] if c.last_ci else math.nan,
                    "best_ci_low": c.best_ci[0] if c.best_ci else math.nan,
                    "best_ci_high": c.best_ci[1] if c.best_ci else math.nan,
                    "last_step": c.last_step,
                    "best_step": c.best_step,
                    "note": c.note,
                }
            )
    return pd.DataFrame(recs, columns=list(CSV_COLUMNS))


def _write(path: Path, text: str) -> Path:
    """Write a file atomically: a link at the name is replaced, never written through."""
    with atomic_write(path, newline="") as f:
        f.write(text)
    return path


def write_outputs(tables: Sequence[BuiltTable], out_dir: str | Path, formats: Sequence[str]) -> list[Path]:
    """Write ``<out>/<id>.md|.tex|.csv`` per table (and ``tables.md`` with all tables)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for t in tables:
        if "md" in formats:
            written.append(_write(out / f"{t.spec.id}.md", to_markdown(t)))
        if "tex" in formats:
            written.append(_write(out / f"{t.spec.id}.tex", to_latex(t)))
        if "csv" in formats:
            text = to_frame(t).to_csv(index=False, lineterminator="\n", float_format="%.6g")
            written.append(_write(out / f"{t.spec.id}.csv", text))
    if "md" in formats and len(tables) > 1:
        body = "\n".join(to_markdown(t) for t in tables)
        written.append(_write(out / "tables.md", "<!-- generated by rpg-eval table -->\n\n" + body))
    return written


def build_tables(
    layout: Layout,
    table_ids: Sequence[str] | None = None,
    paper_path: str | Path | None = None,
    run_paths: Sequence[str | Path] = (),
    labels: dict[str, str] | None = None,
    grader: str | None = None,
    append_runs: bool = True,
    show_ci: bool = True,
    rank: str | None = None,
    metric: str = "mean",
) -> list[BuiltTable]:
    """Build the selected tables of a layout (all when ``table_ids`` is empty); ``metric``: what
    the runs' cells show, "mean" (mean@k) or "maj" (maj@k, Best chosen by maj@k)."""
    if metric not in METRICS:
        raise TableError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    ids = list(table_ids or layout.tables)
    unknown = [i for i in ids if i not in layout.tables]
    if unknown:
        raise TableError(
            f"{layout.path}: unknown table(s) {', '.join(unknown)}; known: {', '.join(layout.tables)}"
        )
    specs = [layout.tables[i] for i in ids]
    for s in specs:
        s.rank = rank if rank is not None else s.rank
        s.metric = metric
    paper = None
    ppath = Path(paper_path) if paper_path is not None else DEFAULT_PAPER
    if any(s.paper_table is not None for s in specs):
        if not ppath.is_file():
            raise TableError(
                f"{ppath}: the paper's numbers are not there; pass --paper, or create it with "
                "`rpg-eval table import-paper SRC --out results/paper/paper_tables.csv`"
            )
        paper = load_paper(ppath)
    runs = load_runs(run_paths) if run_paths else None
    if labels and runs is not None:
        missing = [k for k in labels if k not in set(runs["run"])]
        if missing:
            raise TableError(
                f"--label names unknown run(s) {', '.join(missing)}; runs: {', '.join(dict.fromkeys(runs['run']))}"
            )
    return [
        build_table(s, layout, paper, runs, labels, grader, append_runs, show_ci, paper_path=str(ppath))
        for s in specs
    ]


# --------------------------------------------------------------------------- CLI


def _parse_labels(items: Sequence[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        if "=" not in item:
            raise TableError(f"--label expects RUN=LABEL, got {item!r}")
        k, v = item.split("=", 1)
        labels[k.strip()] = v.strip()
    return labels


def _build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="rpg-eval table",
        description="Build the paper's Last/Best tables (Markdown, LaTeX, CSV) with your runs beside them. "
        "`rpg-eval table import-paper SRC [--out DEST]` normalises the paper's reported numbers.",
    )
    p.add_argument("--layout", help="layout yaml (default: the packaged rpg_eval/tables.yaml)")
    p.add_argument("--paper", default=None, help=f"paper numbers CSV (default: {DEFAULT_PAPER})")
    p.add_argument("--table", nargs="+", default=None, help="table ids to build (default: all in the layout)")
    p.add_argument("--runs", nargs="+", default=[], help="last_best.csv (or summary.csv) files of your runs")
    p.add_argument("--label", action="append", default=[], help="RUN=LABEL: row label of a run (repeatable)")
    p.add_argument("--grader", default=None, help="grader of the runs' numbers when a file holds several")
    p.add_argument(
        "--no-append-runs",
        action="store_true",
        help="only show runs the layout names (default: append every run after the paper rows)",
    )
    p.add_argument("--no-ci", action="store_true", help="do not print the runs' 95%% intervals")
    p.add_argument(
        "--rank", choices=("all", "paper"), default=None, help="override the layout's ranking scope"
    )
    p.add_argument(
        "--metric",
        choices=tuple(METRICS),
        default="mean",
        help="runs' cells: mean (mean@k, default) or maj (maj@k; Best = highest maj@k)",
    )
    p.add_argument("--formats", default="md", help="comma-separated subset of md,tex,csv (default: md)")
    p.add_argument("--out", default=None, help="output folder (default: print Markdown to stdout)")
    return p


def _import_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="rpg-eval table import-paper",
        description="Normalise a CSV of the paper's reported numbers (table,model,context,method,benchmark,last,best).",
    )
    p.add_argument("src", help="source CSV, e.g. ../shared/reference/paper_tables.csv")
    p.add_argument("--out", default=str(DEFAULT_PAPER), help=f"destination (default: {DEFAULT_PAPER})")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rpg-eval table`` (and ``python -m rpg_eval.tables``). Returns an exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except SystemExit as e:  # a usage error (one line, printed) or --help
        return int(e.code or 0)
    except (TableError, OSError) as exc:  # OSError: e.g. --out names a file, or an unreadable input
        print(f"rpg-eval table: error: {describe(exc)}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "import-paper":
        a = _import_parser().parse_args(argv[1:])
        df = import_paper(a.src, a.out)
        print(f"wrote {a.out}: {len(df)} cells, tables {', '.join(dict.fromkeys(df['table']))}")
        return 0
    a = _build_parser().parse_args(argv)
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise TableError(
            f"--formats: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(FORMATS)}"
        )
    layout = load_layout(a.layout)
    tables = build_tables(
        layout,
        a.table,
        a.paper,
        a.runs,
        _parse_labels(a.label),
        a.grader,
        append_runs=not a.no_append_runs,
        show_ci=not a.no_ci,
        rank=a.rank,
        metric=a.metric,
    )
    if a.out is None:
        print("\n".join(to_markdown(t) for t in tables))
    else:
        for p in write_outputs(tables, a.out, formats):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
