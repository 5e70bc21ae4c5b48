"""Table layouts (``rpg_eval/report/tables/tables.yaml`` or ``--layout``): which tables, their benchmark columns,
rows, ranking scope and number formats; the errors of the table builder; benchmark keys.

A layout is configuration, not code: docs/tables.md describes its keys. Imports nothing from the
training side.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ...outputs import read_input
from ...stats.scores import DEFAULT

TABLE_ID_RE = re.compile(r"[A-Za-z0-9._-]+")  # table ids are file names under --out


class TableError(ValueError):
    """Bad input to the table builder (the message names the file, column or run)."""


@dataclass
class RowSpec:
    """One row of a layout: a paper method, a user run, or one method's runs over training seeds."""

    method: str | None = None
    run: str | None = None
    label: str | None = None
    grader: str | None = None
    seeds: tuple[str, ...] | None = None  # the runs of one method, one per training seed

    @property
    def name(self) -> str:
        """Label to print (the given label, else the method or run name, or the seed runs)."""
        return self.label or self.method or self.run or " + ".join(self.seeds or ())


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
    metric: str = DEFAULT  # what the runs' cells show: a score of scores.SCORES (mean@k, maj@k)
    baseline: str | None = None  # a run: cells whose paired difference to it excludes 0 are marked
    show_heldout: bool = False  # runs' cells also show the held-out Best
    show_ci: bool = True  # runs' cells print their 95% intervals (the ranking uses them either way)


@dataclass
class Layout:
    """A parsed layout file: benchmark display names and the tables in order."""

    benchmarks: dict[str, str]
    tables: dict[str, TableSpec]
    path: str = "<layout>"

    def display(self, bench: str) -> str:
        """Display name of a benchmark key (AIME24 for aime24)."""
        return self.benchmarks.get(bench, bench.upper())


def benchmark_key(name: str) -> str:
    """Normalise a benchmark name to the contract's key: ``"AIME24"`` -> ``"aime24"``."""
    return str(name).strip().lower().replace(" ", "").replace("-", "").replace("_", "")


def split_list(text: str | None, known: Sequence[str], flag: str, default: Sequence[str] = ()) -> list[str]:
    """A comma-separated option (``default`` when not given), each item one of ``known`` (a
    TableError naming ``flag`` otherwise)."""
    items = [x.strip() for x in text.split(",") if x.strip()] if text is not None else list(default)
    bad = [x for x in items if x not in known]
    if bad or not items:
        raise TableError(f"{flag}: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(known)}")
    return items


def is_nan(x: Any) -> bool:
    """A missing number: None, NaN, or what pandas reads as missing."""
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def load_layout(path: str | Path | None = None) -> Layout:
    """Parse a layout yaml (default: the packaged ``rpg_eval/report/tables/tables.yaml``)."""
    if path is None:
        text = resources.files("rpg_eval.report.tables").joinpath("tables.yaml").read_text(encoding="utf-8")
        name = "rpg_eval/report/tables/tables.yaml"
    else:
        name = str(path)
        try:
            text = read_input(path).decode("utf-8")  # missing, a FIFO or a device: refused, not waited on
        except UnicodeDecodeError as exc:
            raise TableError(f"{name}: not UTF-8 text ({exc})") from None
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
    paper = t.get("paper_table", tid)  # the paper table it draws on (default: its id; null: none)
    rank = str(t.get("rank", defaults.get("rank", "all")))
    if rank not in ("all", "paper"):
        raise TableError(f"{name}: table {tid} rank must be 'all' or 'paper', got {rank!r}")
    return TableSpec(
        id=tid,
        title=str(t.get("title", tid)),
        paper_table=None if paper is None else str(paper),
        benchmarks=[benchmark_key(b) for b in (t.get("benchmarks") or [])],
        rows=rows,
        rank=rank,
        digits=int(t.get("digits", defaults.get("digits", 4))),
        ci_digits=int(t.get("ci_digits", defaults.get("ci_digits", 3))),
    )


def _row_spec(name: str, tid: str, i: int, r: Any) -> RowSpec:
    """Row ``i`` of table ``tid``: exactly one of method / run / seeds (a list of run names, one
    method's runs over training seeds), optional label and grader."""
    if not isinstance(r, dict) or sum(k in r for k in ("method", "run", "seeds")) != 1:
        raise TableError(
            f"{name}: table {tid} row {i + 1} needs exactly one of 'method', 'run' or 'seeds': {r!r}"
        )
    bad = set(r) - {"method", "run", "seeds", "label", "grader"}
    if bad:
        raise TableError(f"{name}: table {tid} row {i + 1} has unknown key(s) {sorted(bad)}")
    text = {k: None if r.get(k) is None else str(r[k]) for k in ("method", "run", "label", "grader")}
    seeds = r.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, list) or not seeds or not all(isinstance(x, str) and x for x in seeds):
            raise TableError(
                f"{name}: table {tid} row {i + 1}: 'seeds' must be a list of run names, got {seeds!r}"
            )
        if len(set(seeds)) != len(seeds):
            raise TableError(f"{name}: table {tid} row {i + 1}: 'seeds' names a run twice: {seeds!r}")
    return RowSpec(**text, seeds=None if seeds is None else tuple(seeds))
