"""``rpg-eval table``: the paper's comparison tables (Last / Best per benchmark), with a user's runs
(their ``last_best.csv`` or ``summary.csv``) beside them, in Markdown, LaTeX and CSV (flags:
docs/tables.md); ``rpg-eval table import-paper SRC.csv [--out DEST]`` normalises the paper's numbers.
Also runnable as ``python -m rpg_eval.report.tables``. Imports nothing from the training side.
"""

from __future__ import annotations

import argparse

from rpg_openrlhf.common.atomic import check_output_path
from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least, int_in, report_errors

from ...limits import MAX_ITERS
from ...options import key_values
from ...outputs import TABLE, check_claimable, claim
from ...stats.scores import DEFAULT, SCORES
from .build import build_tables
from .inputs import DEFAULT_PAPER, import_paper
from .layout import load_layout, split_list
from .render import FORMATS, output_names, to_markdown, write_outputs


def _build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="rpg-eval table",
        description="Build the paper's Last/Best tables (Markdown, LaTeX, CSV) with your runs beside them. "
        "`rpg-eval table import-paper SRC [--out DEST]` normalises the paper's reported numbers.",
    )
    p.add_argument("--layout", help="layout yaml (default: the packaged rpg_eval/report/tables/tables.yaml)")
    p.add_argument("--paper", default=None, help=f"paper numbers CSV (default: {DEFAULT_PAPER})")
    p.add_argument("--table", nargs="+", default=None, help="table ids to build (default: all in the layout)")
    p.add_argument("--runs", nargs="+", default=[], help="last_best.csv (or summary.csv) files of your runs")
    p.add_argument("--label", action="append", default=[], help="RUN=LABEL: row label of a run (repeatable)")
    p.add_argument("--grader", default=None, help="grader of the runs' numbers when a file holds several")
    p.add_argument("--no-append-runs", action="store_true", help="only show the runs the layout names")
    p.add_argument("--no-ci", action="store_true", help="do not print the runs' 95%% intervals")
    p.add_argument(
        "--rank", choices=("all", "paper"), default=None, help="override the layout's ranking scope"
    )
    p.add_argument(
        "--metric", choices=tuple(SCORES), default=DEFAULT, help="the runs' score (Best: its highest)"
    )
    p.add_argument(
        "--samples", nargs="+", default=[], help="run folders or samples.jsonl: for --baseline, seed rows"
    )
    p.add_argument(
        "--baseline", default=None, help="a run: mark cells whose paired difference to it excludes 0"
    )
    p.add_argument("--heldout", action="store_true", help="runs' cells also show the held-out Best")
    p.add_argument(
        "--iters", type=int_in(1, MAX_ITERS), default=2000, help="bootstrap resamples (seed, paired)"
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="bootstrap seed of seed and paired intervals"
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
    """Entry point of ``rpg-eval table`` (and ``python -m rpg_eval.report.tables``): one line and exit
    2 on any failure (a TableError, a bad --label, an --out that names a file, an unreadable input)."""
    return report_errors("rpg-eval table", _main, argv)


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "import-paper":
        a = _import_parser().parse_args(argv[1:])
        check_output_path(a.out, "--out", [a.src])  # a link, FIFO, folder or the input: refused
        df = import_paper(a.src, a.out)
        print(f"wrote {a.out}: {len(df)} cells, tables {', '.join(dict.fromkeys(df['table']))}")
        return 0
    a = _build_parser().parse_args(argv)
    formats = split_list(a.formats, FORMATS, "--formats")
    layout = load_layout(a.layout)
    if a.out is not None:  # a folder table did not make or mark, or a link or FIFO at a name: refused now
        check_claimable(a.out, TABLE, names=output_names(a.table or list(layout.tables), formats))
    tables = build_tables(
        layout,
        a.table,
        a.paper,
        a.runs,
        key_values(a.label, "--label", "RUN=LABEL"),
        a.grader,
        append_runs=not a.no_append_runs,
        show_ci=not a.no_ci,
        rank=a.rank,
        metric=a.metric,
        sample_paths=a.samples,
        baseline=a.baseline,
        show_heldout=a.heldout,
        stats=(a.iters, a.seed),
    )
    if a.out is None:
        print("\n".join(to_markdown(t) for t in tables))
    else:
        with claim(a.out, TABLE, names=output_names([t.spec.id for t in tables], formats)) as out:
            written = write_outputs(tables, out, formats)
        for p in written:
            print(f"wrote {p}")
    return 0
