"""Building the tables: the paper's rows and the runs' rows of each layout table, their cells
(Last / Best of the chosen score, intervals, steps) and the ranking marks.

Ranking rule (docs/tables.md, "Cells and ranking rule"): within each benchmark column the Last
values and the Best values are ranked separately, on the value as displayed (rounded to ``digits``);
the highest value is bold, the second highest distinct value underlined; ties share the mark. The
paper's rows are ranked among themselves, as the paper printed them (they carry no interval); this
project's runs among themselves, where a run also shares the mark of the column's highest (second
highest) run when the two are tied within noise: the exact sign-flip test of their paired difference
on the same problems does not reject at 5% (with their samples; stats/paired.py), else their two 95%
intervals overlap (conservative).
Imports nothing from the training side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rpg_openrlhf.common.cliutil import describe

from ...stats.compare import CompareError, check_comparable, compare_point
from ...stats.paired import PairedDifference
from ...stats.problems import RunScores
from ...stats.scores import DEFAULT, SCORES
from ...stats.seeds import seed_summary
from .inputs import DEFAULT_PAPER, PAPER_COLUMNS, load_paper, load_runs
from .layout import Layout, RowSpec, TableError, TableSpec, is_nan

BOLD, UNDERLINE = "bold", "underline"
#: Per-problem scores of runs: (run, benchmark, grader, score) -> RunScores (stats/problems.py).
Problems = dict[tuple[str, str, str, str], RunScores]


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
    # the held-out Best (a run's last_best.csv columns): value, interval, step
    heldout: float = math.nan
    heldout_ci: tuple[float, float] | None = None
    heldout_step: float = math.nan
    # A - baseline on the same problems (runs, with --baseline): paired interval and p-value
    last_vs: PairedDifference | None = None
    best_vs: PairedDifference | None = None
    # a row of seed runs: the std of the seeds' values (Last, Best) and how many seeds
    last_std: float = math.nan
    best_std: float = math.nan
    n_seeds: int = 0


@dataclass
class Row:
    """A built row: label, where it comes from and its cells by benchmark key."""

    label: str
    source: str  # "paper", "run" or "seeds"
    method: str = ""
    run: str = ""
    grader: str = ""
    model: str = ""
    context: str = ""
    cells: dict[str, Cell] = field(default_factory=dict)
    seeds: tuple[str, ...] = ()


@dataclass
class BuiltTable:
    """A table ready to render."""

    spec: TableSpec
    benchmark_labels: dict[str, str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    noise_tests: tuple[str, ...] = ()  # how runs were tested for ties within noise (PAIRED, OVERLAP)


#: How two runs' values were found tied within noise (the legend names the tests a table used).
PAIRED, OVERLAP = "paired", "overlap"


def tied_within_noise(
    ref: Row,
    row: Row,
    bench: str,
    key: str,
    spec: TableSpec,
    problems: Problems | None,
    stats: tuple[int, int],
) -> tuple[str | None, bool]:
    """(the test applied, whether it ties them): is ``row``'s value at ``key`` ("last"/"best") of
    ``bench`` within noise of ``ref``'s? PAIRED: the exact sign-flip test of the paired difference on the
    same problems does not reject at 5% (both runs' samples given, on the checkpoints the cells show); else
    OVERLAP: their two 95% intervals overlap; None: neither can be applied (not tied)."""
    a, b = ref.cells[bench], row.cells[bench]
    if ref.source == row.source == "run" and problems is not None:
        found = [problems.get((r.run, bench, r.grader, spec.metric)) for r in (ref, row)]
        if found[0] is not None and found[1] is not None:
            try:
                ca, cb, diff = compare_point(found[0], found[1], key, iters=stats[0], seed=stats[1])
            except CompareError:  # other problems or sample counts: no paired test; the intervals below
                ca = cb = diff = None
            # the checkpoints the cells show (a Best chosen without step 0 may be another one)
            if diff is not None and (ca.step, cb.step) == (
                getattr(a, f"{key}_step"),
                getattr(b, f"{key}_step"),
            ):
                return PAIRED, not diff.excludes_zero
    ci_a, ci_b = getattr(a, f"{key}_ci"), getattr(b, f"{key}_ci")
    if ci_a is None or ci_b is None:
        return None, False
    return OVERLAP, ci_a[0] <= ci_b[1] and ci_b[0] <= ci_a[1]


def _noise_marks(
    ranked: list[Row],
    bench: str,
    key: str,
    spec: TableSpec,
    problems: Problems | None,
    stats: tuple[int, int],
    tests: set[str],
) -> list[str]:
    """The marks of the rows ``ranked`` in one column: the highest value (as displayed) bold, shared
    by every row equal to it or (runs) tied with it within noise; the highest of the others underlined,
    likewise. ``tests`` collects the tests applied (the legend names them)."""
    values = [round(getattr(r.cells[bench], key), spec.digits) for r in ranked]
    marks = [""] * len(ranked)
    left = [i for i in sorted(range(len(ranked)), key=lambda i: -values[i]) if not is_nan(values[i])]
    for mark in (BOLD, UNDERLINE):
        if not left:
            break
        top = left[0]
        group = []
        for i in left:
            tied = values[i] == values[top]  # equal as displayed: a tie, whatever the noise
            if not tied:
                test, tied = tied_within_noise(ranked[top], ranked[i], bench, key, spec, problems, stats)
                tests.update([test] if test else [])
            if tied:
                group.append(i)
        for i in group:
            marks[i] = mark
        left = [i for i in left if i not in group]
    return marks


def _ci(low: Any, high: Any) -> tuple[float, float] | None:
    if is_nan(low) or is_nan(high):
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
    problems: Problems | None = None,
    stats: tuple[int, int] = (2000, 0),
) -> BuiltTable:
    """Assemble one table from the paper's numbers and the users' runs.

    ``labels`` maps run name -> label (overrides the layout's); runs present in ``runs``
    but not named in the layout are appended after the paper rows when ``append_runs``.
    ``problems``: per-problem scores of runs (from their samples), for seed rows and the paired
    differences to ``spec.baseline``; ``stats``: (bootstrap resamples, seed) of their intervals.
    """
    labels = labels or {}
    spec.show_ci = show_ci  # cells keep their intervals (the ranking uses them); rendering shows them or not
    runs = runs if runs is not None else pd.DataFrame(columns=["run", "benchmark", "grader", "file"])
    ptab = _paper_rows(spec, paper, paper_path)
    row_specs = _row_specs(spec, ptab, runs, append_runs)
    seed_benches = [
        b for rs in row_specs if rs.seeds for k in (problems or {}) if k[0] in rs.seeds for b in [k[1]]
    ]
    benches = spec.benchmarks or list(
        dict.fromkeys(list(ptab["benchmark"]) + list(runs["benchmark"]) + seed_benches)
    )
    if not benches:
        raise TableError(f"table {spec.id}: no benchmark columns (set 'benchmarks:' in {layout.path})")
    rows: list[Row] = []
    notes: list[str] = []
    for rs in row_specs:
        if rs.method is not None:
            rows.append(_paper_row(rs, spec, layout, ptab, paper_path, benches, notes))
        elif rs.seeds is not None:
            rows.append(seeds_row(rs, spec, layout, problems, rs.grader or grader or "math_verify", stats))
        else:
            rows.append(_run_row(rs, spec, layout, runs, labels.get(rs.run or "", rs.name), grader))
    if spec.baseline is not None:
        mark_differences(rows, spec, problems, stats)
    tests = _rank_columns(rows, benches, spec, problems, stats)
    return BuiltTable(
        spec=spec, benchmark_labels={b: layout.display(b) for b in benches}, rows=rows, notes=notes,
        noise_tests=tuple(t for t in (PAIRED, OVERLAP) if t in tests)
    )  # fmt: skip


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
    rs: RowSpec, spec: TableSpec, layout: Layout, runs: pd.DataFrame, label: str, grader: str | None
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
    s = SCORES[spec.metric]
    for _, r in r_all[r_all["grader"] == g].iterrows():
        if is_nan(r.get(s.last)) or is_nan(r.get(s.best)):
            raise TableError(
                f"{r['file']}: run '{rs.run}' {r['benchmark']} has no {s.name} (columns {s.last}, {s.best}); "
                f"a last_best.csv written before {s.name}: run rpg-eval summarize again"
            )
        row.cells[r["benchmark"]] = Cell(
            last=float(r[s.last]),
            best=float(r[s.best]),
            last_ci=_ci(r.get(s.last_ci[0]), r.get(s.last_ci[1])),
            best_ci=_ci(r.get(s.best_ci[0]), r.get(s.best_ci[1])),
            last_step=float(r.get(s.last_step, math.nan)),
            best_step=float(r.get(s.best_step, math.nan)),
            heldout=float(r.get(s.heldout, math.nan)),
            heldout_ci=_ci(r.get(s.heldout_ci[0]), r.get(s.heldout_ci[1])),
            heldout_step=float(r.get(s.heldout_step, math.nan)),
        )
    # a file without the columns predates the held-out Best; NaN in them: one sample per problem (no halves)
    if spec.show_heldout and not r_all.get("has_heldout", pd.Series([True])).all():
        raise TableError(
            f"{', '.join(sorted(set(r_all['file'])))}: run '{rs.run}' has no held-out Best (columns {s.heldout}, "
            f"{s.heldout_step}); a last_best.csv written before it: run rpg-eval summarize again"
        )
    return row


def _run_scores(
    problems: Problems | None, run: str, bench: str, grader: str, score: str, what: str
) -> RunScores:
    """The per-problem scores of ``run`` on ``bench``; TableError naming ``what`` needs them."""
    if problems is None:
        raise TableError(f"{what} needs the runs' samples, per problem: give them with --samples RUN_DIR ...")
    found = problems.get((run, bench, grader, score))
    if found is None:
        known = ", ".join(sorted({k[0] for k in problems})) or "none"
        raise TableError(
            f"{what}: no samples of run '{run}' on {bench} with grader {grader} (--samples runs: {known})"
        )
    return found


def seeds_row(
    rs: RowSpec,
    spec: TableSpec,
    layout: Layout,
    problems: Problems | None,
    grader: str,
    stats: tuple[int, int],
) -> Row:
    """A row of one method's runs over training seeds (stats/seeds.py): in each benchmark, the mean
    over seeds of Last and of each seed's Best, the std across seeds and the interval of a
    bootstrap over seeds and problems. The seeds must share problems, golds and settings."""
    assert rs.seeds is not None
    what = f"{layout.path}: table {spec.id} row '{rs.name}' (seeds {', '.join(rs.seeds)})"
    if len(set(rs.seeds)) < 2:
        raise TableError(
            f"{what}: a seeds row needs two seeds or more (a std over one seed is no spread); show one run "
            "as {run: NAME}"
        )
    if problems is None:
        raise TableError(
            f"{what} needs the seed runs' samples, per problem: give them with --samples RUN_DIR ..."
        )
    row = Row(label=rs.name, source="seeds", grader=grader, seeds=rs.seeds)
    for bench in spec.benchmarks or sorted({k[1] for k in problems if k[0] in rs.seeds}):
        if not any((r, bench, grader, spec.metric) in problems for r in rs.seeds):
            continue
        seeds = [_run_scores(problems, r, bench, grader, spec.metric, what) for r in rs.seeds]
        for other in seeds[1:]:
            try:
                check_comparable(seeds[0], other, "the first seed", "another")
            except CompareError as e:
                raise TableError(f"{what}: {e}") from None
        cell = Cell(n_seeds=len(seeds))
        for point in ("last", "best"):
            chosen = [sc.last() if point == "last" else sc.best() for sc in seeds]
            if len({c.problem_ids for c in chosen}) > 1:
                raise TableError(f"{what}: {bench}: the seeds' checkpoints hold other complete problems")
            summary = seed_summary(np.stack([c.full for c in chosen]), iters=stats[0], seed=stats[1])
            setattr(cell, point, summary.mean)
            setattr(cell, f"{point}_std", summary.std)
            setattr(cell, f"{point}_ci", (summary.ci_low, summary.ci_high))
        row.cells[bench] = cell
    return row


def mark_differences(
    rows: list[Row], spec: TableSpec, problems: Problems | None, stats: tuple[int, int]
) -> None:
    """Each run row's paired difference to the baseline run (``spec.baseline``), Last and Best of the
    table's score, on the same problems (stats/paired.py); refused when the two runs' problems, golds
    or settings differ."""
    base = next((r for r in rows if r.source == "run" and r.run == spec.baseline), None)
    if base is None:
        raise TableError(f"--baseline {spec.baseline}: no row of table {spec.id} is that run")
    what = f"--baseline {spec.baseline}"
    for row in rows:
        if row.source != "run" or row is base:
            continue
        for bench, cell in row.cells.items():
            if bench not in base.cells:
                continue
            a = _run_scores(problems, row.run, bench, row.grader, spec.metric, what)
            b = _run_scores(problems, base.run, bench, base.grader, spec.metric, what)
            try:
                check_comparable(a, b, row.label, base.label)
                cell.last_vs = compare_point(a, b, "last", iters=stats[0], seed=stats[1])[2]
                cell.best_vs = compare_point(a, b, "best", iters=stats[0], seed=stats[1])[2]
            except CompareError as e:
                raise TableError(f"table {spec.id}, {what}: {e}") from None


def _rank_columns(
    rows: list[Row], benches: list[str], spec: TableSpec, problems: Problems | None, stats: tuple[int, int]
) -> set[str]:
    """Mark each column's ranks, Last and Best separately: the paper's rows among themselves, as the
    paper printed them; the runs (and seed rows) among themselves, ties within noise sharing a mark
    (none with rank: paper). Returns the noise tests applied (PAIRED, OVERLAP)."""
    paper = [r for r in rows if r.source == "paper"]
    runs = [r for r in rows if r.source != "paper"] if spec.rank == "all" else []
    tests: set[str] = set()
    for b in benches:
        for key in ("last", "best"):
            for group in (paper, runs):  # ranked apart (the paper's rows have no interval or samples)
                ranked = [r for r in group if b in r.cells]
                for r, mark in zip(ranked, _noise_marks(ranked, b, key, spec, problems, stats, tests)):
                    setattr(r.cells[b], f"{key}_mark", mark)
    return tests


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
    metric: str = DEFAULT,
    sample_paths: Sequence[str | Path] = (),
    baseline: str | None = None,
    show_heldout: bool = False,
    stats: tuple[int, int] = (2000, 0),
) -> list[BuiltTable]:
    """Build the selected tables of a layout (all when ``table_ids`` is empty); ``metric``: what
    the runs' cells show, "mean" (mean@k) or "maj" (maj@k, Best chosen by maj@k); ``sample_paths``:
    the runs' samples (run directories or samples.jsonl), for seed rows and ``baseline``: the run
    whose paired differences to the other runs mark their cells; ``show_heldout``: runs' cells also
    show the held-out Best; ``stats``: (bootstrap resamples, seed) of the seed and paired intervals."""
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
        s.baseline = baseline
        s.show_heldout = show_heldout
    problems = load_problems(sample_paths, metric) if sample_paths else None
    ppath = Path(paper_path) if paper_path is not None else DEFAULT_PAPER
    paper = None
    if any(s.paper_table is not None for s in specs):  # a table of the layout shows the paper's rows
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
    shared = (layout, paper, runs, labels, grader, append_runs, show_ci)
    return [build_table(s, *shared, paper_path=str(ppath), problems=problems, stats=stats) for s in specs]


def load_problems(paths: Sequence[str | Path], metric: str) -> Problems:
    """Per-problem scores of every run in the samples ``paths`` (both graders, ``metric``)."""
    from ...stats.problems import run_scores
    from ...stats.summary import load_records

    try:
        records = load_records(paths)
    except (ValueError, OSError) as e:
        raise TableError(f"--samples: {describe(e)}") from None
    if not records:
        raise TableError(f"--samples {' '.join(map(str, paths))}: no records")
    return run_scores(records, scores=(metric,), warn=False)
