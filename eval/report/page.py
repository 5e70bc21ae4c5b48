"""``rpg-eval report OUT``: one self-contained HTML page of an evaluation, to read offline.

It holds, from the runs' sample records and TensorBoard logs (docs/eval.md, "The report page"): the
Last / Best table (95% intervals, the held-out Best, the marks against ``--baseline RUN``), accuracy
against checkpoint step, the training curves in the methods' plot colours (``plots.run_colors``),
and a sample browser (prompt, response, both graders' answers and verdicts, gold) whose filters live
in the page's address (``report.html?bench=0&correct=0``).

Nothing is fetched when the page is opened: styles, script, images and data are inside it (the
data as JSON in a ``<script type="application/json">``; model output is shown as text, never as
markup). The browser shows 50 samples a page; a response longer than ``--response-chars`` is shown
as its head and its tail, where the answer is, with the number of characters left out.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.colors import to_hex

from rpg_openrlhf.common.atomic import check_output_path, write_file
from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least, int_in, report_errors

from .. import outdir
from ..data import load_benchmark
from ..limits import MAX_ITERS
from ..options import key_values
from ..outputs import run_inputs
from ..run.prompts import render_prompt
from ..stats.problems import GRADER_NAMES, run_scores
from ..stats.scores import DEFAULT, SCORES
from ..stats.summary import last_best_rows, load_records, summary_rows
from . import plots
from .tables.build import build_table
from .tables.layout import Layout, RowSpec, TableSpec
from .tables.render import to_html

FLAG_RIGHT = {"math_verify": 1, "paper": 2}  # bits of a sample's flags
FLAG_TRUNCATED, FLAG_TRUNCATION_KNOWN = 4, 8
FLAG_ANSWER = {"math_verify": 16, "paper": 32}
FLAG_CUT = 64  # the response is shown as head + tail


class ReportError(ValueError):
    """Bad input to the report (the message names the file or flag)."""


def _png(fig: Any) -> str:
    return "data:image/png;base64," + base64.b64encode(plots.render(fig, "png", 100)).decode("ascii")


def shown_response(text: str, limit: int) -> tuple[str, bool]:
    """``text``, or its head (a fifth of ``limit``) and tail with the count of characters left out."""
    if len(text) <= limit:
        return text, False
    head = limit // 5
    tail = limit - head
    return f"{text[:head]}\n[… {len(text) - limit:,} characters not shown …]\n{text[-tail:]}", True


def problem_texts(
    run_dirs: Sequence[Path], data_files: dict[str, str]
) -> tuple[dict[tuple[str, str], str], list[str]]:
    """(benchmark, problem id) -> problem text, from ``--data NAME=FILE`` or from the data sources the
    runs' run.json name (local files only: nothing is fetched; a file whose problems changed since the
    run is not used), and notes on benchmarks without texts."""
    sources: dict[str, tuple[str, str | None]] = {b: (f, None) for b, f in data_files.items()}
    for d in run_dirs:
        try:
            meta = outdir.read_run_json(d)
        except ValueError:
            meta = None
        for bench, info in ((meta or {}).get("data") or {}).items():
            if isinstance(info, dict) and isinstance(info.get("source"), str):
                sources.setdefault(bench, (info["source"], info.get("sha256")))
    texts: dict[tuple[str, str], str] = {}
    notes = []
    for bench, (source, sha) in sorted(sources.items()):
        if not Path(source).exists():
            notes.append(f"{bench}: prompts not shown ({source} is not a local file here)")
            continue
        try:
            problems = load_benchmark(source, bench)
        except (ValueError, OSError) as e:
            notes.append(f"{bench}: prompts not shown ({source}: {e})")
            continue
        if sha is not None and outdir.data_fingerprint(problems) != sha:
            notes.append(f"{bench}: prompts not shown ({source} holds other problems than the run used)")
            continue
        texts.update({(bench, p.id): p.problem for p in problems})
    return texts, notes


def _flags(r: dict[str, Any]) -> int:
    flags = sum(bit for g, bit in FLAG_RIGHT.items() if r["correct"][g])
    flags |= sum(bit for g, bit in FLAG_ANSWER.items() if (r.get("extracted") or {}).get(g) not in (None, ""))
    tokens, limit = r.get("response_tokens"), (r.get("sampling") or {}).get("max_tokens")
    if isinstance(tokens, int) and isinstance(limit, int):
        flags |= FLAG_TRUNCATION_KNOWN | (FLAG_TRUNCATED if tokens >= limit else 0)
    return flags


def sample_data(
    records: list[dict[str, Any]],
    labels: dict[str, str],
    texts: dict[tuple[str, str], str],
    response_chars: int,
) -> dict[str, Any]:
    """The browser's data, column by column (strings that repeat are stored once and referred to)."""
    runs = list(dict.fromkeys(r["run"] for r in records))
    benches = sorted({r["benchmark"] for r in records})
    ckpts = sorted(
        {(r["run"], r["checkpoint"], int(r["step"])) for r in records},
        key=lambda c: (runs.index(c[0]), c[2], c[1]),
    )
    ckpt_index = {(c[0], c[1]): i for i, c in enumerate(ckpts)}
    problems: dict[tuple[str, str], int] = {}
    problem_rows: list[list[Any]] = []
    answers: dict[str, int] = {}
    cols: dict[str, list[Any]] = {k: [] for k in ("c", "p", "i", "r", "a", "b", "f")}

    def ckpt(r: dict[str, Any]) -> int:
        return ckpt_index[(r["run"], r["checkpoint"])]

    for r in sorted(
        records, key=lambda r: (ckpt(r), r["benchmark"], str(r["problem_id"]), r["sample_index"])
    ):
        key = (r["benchmark"], str(r["problem_id"]))
        if key not in problems:
            problems[key] = len(problem_rows)
            text = texts.get(key)
            prompt = render_prompt(text, r.get("prompt_style", "boxed")) if text is not None else None
            problem_rows.append([benches.index(key[0]), key[1], str(r.get("gold", "")), prompt])
        text, cut = shown_response(str(r.get("response") or ""), response_chars)
        ext = r.get("extracted") or {}
        cols["c"].append(ckpt(r))
        cols["p"].append(problems[key])
        cols["i"].append(int(r["sample_index"]))
        cols["r"].append(text)
        for col, g in (("a", "math_verify"), ("b", "paper")):
            value = ext.get(g)
            cols[col].append(-1 if value is None else answers.setdefault(str(value), len(answers)))
        cols["f"].append(_flags(r) | (FLAG_CUT if cut else 0))
    return {
        "runs": [labels.get(r, r) for r in runs],
        "benchmarks": benches,
        "checkpoints": [[runs.index(run), name, step] for run, name, step in ckpts],
        "problems": problem_rows,
        "answers": list(answers),
        "samples": cols,
        "graders": list(GRADER_NAMES),
        "flags": {
            "right": FLAG_RIGHT,
            "answer": FLAG_ANSWER,
            "truncated": FLAG_TRUNCATED,
            "truncation_known": FLAG_TRUNCATION_KNOWN,
            "cut": FLAG_CUT,
        },  # fmt: skip
    }


def _json_for_script(data: Any) -> str:
    """JSON safe inside a <script> element: every "<" (and ">", "&") written as its \\u escape, so
    no content can change how the page parses ("</script>" ending it, "<!--<script>" switching the
    parser into its double-escaped state where the page's own "</script>" no longer ends it)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _asset(name: str) -> str:
    return resources.files("rpg_eval.report").joinpath("assets", name).read_text(encoding="utf-8")


def _training_figures(tb: Sequence[str], colors: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, image) of each training curve panel, every TensorBoard run on it."""
    runs = plots.load_tb(tb)
    figures = plots.overlay_figures(runs, colors=colors, smooth_weight=0.6) if runs else {}
    return [(plots.PANEL_TITLES.get(panel, panel), _png(fig)) for panel, (fig, _) in figures.items()]


def build_page(
    run_dirs: Sequence[str | Path],
    tb: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    baseline: str | None = None,
    grader: str = "math_verify",
    metric: str = DEFAULT,
    title: str = "rpg-eval report",
    data_files: dict[str, str] | None = None,
    response_chars: int = 1000,
    iters: int = 2000,
    seed: int = 0,
) -> str:
    """The report page (see the module docstring) as one HTML document."""
    labels = dict(labels or {})
    dirs = [Path(p) if Path(p).is_dir() else Path(p).parent for p in run_dirs]
    records = load_records(run_dirs)
    if not records:
        raise ReportError(f"--runs {' '.join(map(str, run_dirs))}: no records")
    runs = list(dict.fromkeys(r["run"] for r in records))
    if baseline is not None and baseline not in runs:
        raise ReportError(f"--baseline {baseline}: not a run of --runs (runs: {', '.join(runs)})")
    rows = summary_rows(records, seed=seed, iters=iters, warn=False)
    benches = sorted({r["benchmark"] for r in records})
    frame = pd.DataFrame([{**r, "file": "<records>"} for r in last_best_rows(rows)])
    spec = TableSpec(id="report", title=f"Last / Best ({SCORES[metric].name}, {grader} grader)", paper_table=None,
                     benchmarks=benches, rows=[RowSpec(run=r, label=labels.get(r, r)) for r in runs], metric=metric,
                     baseline=baseline, show_heldout=True)  # fmt: skip
    problems = run_scores(records, graders=(grader,), scores=(metric,), warn=False) if baseline else None
    table = build_table(spec, Layout(benchmarks={b: b for b in benches}, tables={}, path="<report>"), None, frame, labels, grader,
                        append_runs=False, problems=problems, stats=(iters, seed))  # fmt: skip
    tb_labels = [plots._split_label(item)[0] for item in tb]
    shown = [labels.get(r, r) for r in runs] + [x for x in tb_labels if x]
    colors = {k: to_hex(v) for k, v in plots.run_colors(shown).items()}  # matplotlib's cycle, as CSS colours
    summary = pd.DataFrame([{**r, "file": "<records>"} for r in rows])
    eval_fig, _ = plots.eval_figure(summary, labels, grader, None, [metric], colors)
    texts, notes = problem_texts(dirs, data_files or {})
    notes += [f"{b}: prompts not shown (no run.json names its data file here; give --data {b}=FILE)"
              for b in benches if not any(k[0] == b for k in texts) and not any(n.startswith(f"{b}:") for n in notes)]  # fmt: skip
    data = sample_data(records, labels, texts, response_chars)
    body = _body(
        title, table, colors, labels, runs, _png(eval_fig), _training_figures(tb, colors), notes, data
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_asset('page.css')}</style></head>\n<body>{body}"
        f'<script id="rpg-data" type="application/json">{_json_for_script(data)}</script>\n'
        f"<script>{_asset('page.js')}</script></body></html>\n"
    )


def _body(
    title: str,
    table: Any,
    colors: dict[str, str],
    labels: dict[str, str],
    runs: list[str],
    eval_png: str,
    training: list[tuple[str, str]],
    notes: list[str],
    data: dict[str, Any],
) -> str:
    n = len(data["samples"]["c"])
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{html.escape(colors[labels.get(r, r)])}"></span>'
        f"{html.escape(labels.get(r, r))}</span>"
        for r in runs
    )
    curves = (
        "".join(
            f'<figure><img alt="{html.escape(t)}" src="{png}"><figcaption>{html.escape(t)}</figcaption></figure>'
            for t, png in training
        )
        or "<p>No training logs given (<code>--tb</code>).</p>"
    )
    note = "".join(f"<p class=note>{html.escape(x)}</p>" for x in notes)
    return f"""
<header><h1>{html.escape(title)}</h1>
<p>{len(runs)} run(s): {legend}; {len(data["benchmarks"])} benchmark(s), {len(data["checkpoints"])} checkpoints,
{n:,} samples. Written by <code>rpg-eval report</code>; everything on this page is inside it (no network).</p>
<nav><a href="#table">Table</a> · <a href="#eval">Accuracy by step</a> · <a href="#training">Training curves</a>
 · <a href="#samples">Samples</a></nav></header>
<section id="table"><h2>Last / Best</h2>{to_html(table, colors)}</section>
<section id="eval"><h2>Accuracy against checkpoint step</h2><figure><img alt="accuracy by step" src="{eval_png}">
</figure></section>
<section id="training"><h2>Training curves</h2><div class="figures">{curves}</div></section>
<section id="samples"><h2>Samples</h2>{note}
<form id="filters" onsubmit="return false">
<label>benchmark <select id="f-bench"></select></label>
<label>checkpoint <select id="f-ckpt"></select></label>
<label>grader <select id="f-grader"></select></label>
<label>verdict <select id="f-correct"><option value="">right or wrong</option><option value="1">right</option>
<option value="0">wrong</option></select></label>
<label><input type="checkbox" id="f-disagree"> graders disagree</label>
<label><input type="checkbox" id="f-truncated"> truncated</label>
<label><input type="checkbox" id="f-noanswer"> no answer</label>
</form>
<p id="count" data-matching="0"></p><div id="pager-top" class="pager"></div>
<ol id="sample-list"></ol><div id="pager" class="pager"></div>
</section>
"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="rpg-eval report", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the HTML file to write (e.g. report.html)")
    p.add_argument("--runs", nargs="+", required=True, help="run directories (or samples.jsonl files)")
    p.add_argument("--tb", nargs="+", default=[], help="[LABEL=]TensorBoard folder of a run's training")
    p.add_argument("--label", action="append", default=[], help="RUN=LABEL: the name a run is shown under")
    p.add_argument("--baseline", help="a run: mark cells whose paired difference to it excludes 0")
    p.add_argument("--grader", choices=GRADER_NAMES, default="math_verify", help="grader of table and plots")
    p.add_argument("--metric", choices=tuple(SCORES), default=DEFAULT, help="the table's score")
    p.add_argument("--title", default="rpg-eval report", help="the page's title")
    p.add_argument("--data", action="append", default=[], help="NAME=FILE: a benchmark's problems (prompts)")
    p.add_argument("--response-chars", type=int_at_least(100), default=1000,
                   help="longest response shown whole; longer ones show their head and tail")  # fmt: skip
    p.add_argument("--iters", type=int_in(1, MAX_ITERS), default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="bootstrap seed")
    return p


def _main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    inputs = run_inputs([*a.runs, *a.tb, *(d.split("=", 1)[-1] for d in a.data)])
    check_output_path(a.out, "OUT", inputs)  # a link, FIFO, folder or an input there: refused before the work
    page = build_page(a.runs, a.tb, key_values(a.label, "--label", "RUN=LABEL"), a.baseline, a.grader, a.metric, a.title,
                      key_values(a.data, "--data", "NAME=FILE"), a.response_chars, a.iters, a.seed)  # fmt: skip
    write_file(a.out, page, "OUT")
    print(f"wrote {a.out} ({math.ceil(len(page.encode()) / 1024):,} KiB)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpg-eval report`` (one line and exit 2 on any failure)."""
    return report_errors("rpg-eval report", _main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
