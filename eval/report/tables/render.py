"""Rendering built tables: Markdown, LaTeX (booktabs) and a tidy CSV, written by the project's write policy.

The number itself carries the rank mark (bold / underline), not the whole cell. Imports nothing
from the training side.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ...outputs import write_files
from ...stats.paired import PairedDifference
from ...stats.scores import SCORES
from .build import BOLD, OVERLAP, PAIRED, UNDERLINE, BuiltTable, Cell
from .layout import TableSpec, is_nan

FORMATS = ("md", "tex", "csv")
CSV_COLUMNS = (
    "table", "row", "label", "source", "model", "context", "method", "run", "grader", "benchmark", "last", "best",
    "last_mark", "best_mark", "last_ci_low", "last_ci_high", "best_ci_low", "best_ci_high", "last_step", "best_step",
    "note",
    # the held-out Best, seed rows, the paired difference to the baseline (empty where not asked for)
    "heldout", "heldout_ci_low", "heldout_ci_high", "heldout_step", "seeds", "last_std", "best_std", "baseline",
    "last_diff", "last_diff_ci_low", "last_diff_ci_high", "last_p", "best_diff", "best_diff_ci_low",
    "best_diff_ci_high", "best_p",
)  # fmt: skip


def _fmt(v: float, digits: int) -> str:
    return "–" if is_nan(v) else f"{v:.{digits}f}"


def _signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def _base_label(t: BuiltTable) -> str | None:
    """The label of the baseline run's row (the run's name where no row shows it)."""
    return next((r.label for r in t.rows if r.run == t.spec.baseline and r.source == "run"), t.spec.baseline)


def differences(t: BuiltTable) -> list[str]:
    """One line per (row, benchmark) with a paired difference to the baseline: Last and Best."""
    base = _base_label(t)
    lines = []
    for r in t.rows:
        for b, c in r.cells.items():
            parts = [
                f"{name} {_signed(d.diff, t.spec.digits)} [{_signed(d.ci_low, t.spec.ci_digits)}, "
                f"{_signed(d.ci_high, t.spec.ci_digits)}], p = {d.p_value:.2g}"
                for name, d in (("Last", c.last_vs), ("Best", c.best_vs))
                if d is not None
            ]
            if parts:
                verdict = (
                    "differ"
                    if any(d.excludes_zero for d in (c.last_vs, c.best_vs) if d)
                    else "no difference shown"
                )
                lines.append(
                    f"{r.label} − {base}, {t.benchmark_labels.get(b, b)}: {'; '.join(parts)} ({verdict})."
                )
    return lines


#: The legend's sentence of the rule that ties runs within noise, by the tests a table applied.
_SIGN_FLIP = "the exact sign-flip test of their paired difference on the same problems does not reject at 5%"
NOISE_RULE = {
    (PAIRED,): _SIGN_FLIP,
    (OVERLAP,): "their 95% intervals overlap (conservative: it finds a winner less often than the paired "
    "test on the runs' samples, --samples)",
    (PAIRED, OVERLAP): f"{_SIGN_FLIP}, or, for runs whose samples were not given, their 95% intervals "
    "overlap (conservative)",
}


def _ranking(t: BuiltTable) -> str:
    """The legend's sentences of the ranking rule (docs/tables.md, "Cells and ranking rule")."""
    paper = any(r.source == "paper" for r in t.rows)
    runs = t.spec.rank == "all" and any(r.source != "paper" for r in t.rows)
    if paper and runs:
        text = ("Bold: highest, underlined: second highest of the column, Last and Best ranked separately, "
                "the paper's rows among themselves (as the paper printed them) and this project's runs among "
                "themselves; ties share the mark.")  # fmt: skip
    else:
        text = (
            "Bold: highest, underlined: second highest of the column; Last and Best ranked separately"
            + (" (paper rows only)" if paper and t.spec.rank == "paper" else "")
            + "; ties share the mark."
        )
    if runs and t.noise_tests:
        text += (
            " A run shares the mark of the column's highest (second highest) run when the two are tied "
            f"within noise: {NOISE_RULE[t.noise_tests]}."
        )
    return text


def _legend(t: BuiltTable) -> list[str]:
    cells = SCORES[t.spec.metric].legend or (
        "Each cell: Last / Best (mean accuracy over the samples of each problem; the paper: mean@32)."
    )
    lines = [f"{cells} {_ranking(t)}"]
    if any(r.source != "paper" for r in t.rows):
        lines.append(
            "Rows after the paper's are runs of this project; [low, high]: 95% interval; –: not evaluated. "
            "Best: the checkpoint with the highest score on these same problems (selected on the test "
            "problems, as the paper's Best; biased upward)."
        )
    if t.spec.show_heldout:
        lines.append(
            "held-out: a Best chosen on the first half of each problem's samples and scored on the other half "
            "(or chosen on the run's other benchmarks: rpg-eval summarize --heldout-by benchmarks), with its "
            "95% interval."
        )
    for r in t.rows:
        if r.source == "seeds":
            n = max((c.n_seeds for c in r.cells.values()), default=len(r.seeds))
            lines.append(
                f"{r.label}: mean ± std over {n} seeds ({', '.join(r.seeds)}) of Last and of each seed's Best; "
                "[low, high]: 95% interval of a bootstrap over seeds and problems."
            )
    if t.spec.baseline is not None:
        lines.append(
            f"▲ / ▼: above / below {_base_label(t)}: the exact sign-flip test of the paired difference on the same "
            "problems rejects at 5% (p <= 0.05); [low, high]: the shifts that test does not reject. Differences:"
        )
        lines += differences(t)
    return lines + t.notes


@dataclass(frozen=True)
class Markup:
    """How one output format writes a cell: str.format templates for a marked value, an interval,
    a std across seeds, the direction of a difference to the baseline and a held-out Best."""

    missing: str  # a value or cell not evaluated
    marks: dict[str, str]  # BOLD / UNDERLINE -> template of the value
    ci: str  # template of the interval appended to a value ({lo}, {hi})
    std: str = " ± {}"  # std across seeds
    up: str = " ▲"  # the sign-flip test against the baseline rejects, A above
    down: str = " ▼"  # ... below 0
    heldout: str = " (held-out {})"


MARKDOWN = Markup("–", {BOLD: "**{}**", UNDERLINE: "<u>{}</u>"}, " [{lo}, {hi}]")
LATEX = Markup(
    "--", {BOLD: r"\textbf{{{}}}", UNDERLINE: r"\underline{{{}}}"}, r"{{\scriptsize\,[{lo}, {hi}]}}",
    std=r" $\pm$ {}", up=r"$^{{+}}$", down=r"$^{{-}}$", heldout=r" {{\scriptsize(held-out {})}}",
)  # fmt: skip
HTML = Markup(
    "–", {BOLD: "<b>{}</b>", UNDERLINE: "<u>{}</u>"}, ' <span class="ci">[{lo}, {hi}]</span>',
    std=' <span class="std">± {}</span>', up=' <span class="up" title="above the baseline">▲</span>',
    down=' <span class="down" title="below the baseline">▼</span>', heldout=' <span class="heldout">held-out {}</span>',
)  # fmt: skip


def _value(
    v: float,
    mark: str,
    ci: tuple[float, float] | None,
    spec: TableSpec,
    fmt: Markup,
    std: float = math.nan,
    vs: PairedDifference | None = None,
) -> str:
    """One number of a cell: value, its rank mark, its std across seeds, its interval, the direction
    of its difference to the baseline."""
    s = fmt.missing if is_nan(v) else f"{v:.{spec.digits}f}"
    if mark in fmt.marks:
        s = fmt.marks[mark].format(s)
    if not is_nan(std):
        s += fmt.std.format(f"{std:.{spec.ci_digits}f}")
    if ci is not None and spec.show_ci:
        s += fmt.ci.format(lo=f"{ci[0]:.{spec.ci_digits}f}", hi=f"{ci[1]:.{spec.ci_digits}f}")
    if vs is not None and vs.direction:
        s += fmt.up if vs.direction > 0 else fmt.down
    return s


def _cell(c: Cell | None, spec: TableSpec, fmt: Markup) -> str:
    """A cell: Last / Best (and the held-out Best), or the format's missing mark."""
    if c is None:
        return fmt.missing
    text = (
        _value(c.last, c.last_mark, c.last_ci, spec, fmt, c.last_std, c.last_vs)
        + " / "
        + _value(c.best, c.best_mark, c.best_ci, spec, fmt, c.best_std, c.best_vs)
    )
    if spec.show_heldout and not is_nan(c.heldout):
        text += fmt.heldout.format(_value(c.heldout, "", c.heldout_ci, spec, fmt))
    return text


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
    """Tidy form: one row per (table row, benchmark) with values, marks, intervals and steps, in the
    order of CSV_COLUMNS (intervals NaN with --no-ci; held-out, seed and baseline columns NaN or empty
    where not asked for)."""
    spec, nan = t.spec, math.nan

    def ci(x: tuple[float, float] | None) -> tuple[float, float]:
        return x if x is not None and spec.show_ci else (nan, nan)

    def vs(d: PairedDifference | None) -> tuple[float, ...]:
        return (d.diff, d.ci_low, d.ci_high, d.p_value) if d else (nan,) * 4

    recs = []
    for i, r in enumerate(t.rows):
        for b, c in ((b, r.cells[b]) for b in t.benchmark_labels if b in r.cells):
            held = (c.heldout, *ci(c.heldout_ci), c.heldout_step) if spec.show_heldout else (nan,) * 4
            recs.append([
                spec.id, i + 1, r.label, r.source, r.model, r.context, r.method, r.run, r.grader, b,
                _fmt(c.last, spec.digits), _fmt(c.best, spec.digits), c.last_mark, c.best_mark,
                *ci(c.last_ci), *ci(c.best_ci), c.last_step, c.best_step, c.note, *held, " ".join(r.seeds),
                c.last_std, c.best_std, spec.baseline if c.last_vs or c.best_vs else "",
                *vs(c.last_vs), *vs(c.best_vs),
            ])  # fmt: skip
    return pd.DataFrame(recs, columns=list(CSV_COLUMNS))


def to_html(t: BuiltTable, colors: dict[str, str] | None = None) -> str:
    """A table as an HTML fragment (``<table class="results">``, the legend as paragraphs); a row whose
    run (or label) has a colour in ``colors`` gets a swatch of it (the plots' colour of that method)."""
    colors = colors or {}
    benches = list(t.benchmark_labels)
    head = "".join(
        f"<th>{html.escape(t.benchmark_labels[b])}<br><small>Last / Best</small></th>" for b in benches
    )
    body = []
    for r in t.rows:
        color = colors.get(r.run) or colors.get(r.label)
        swatch = f'<span class="swatch" style="background:{html.escape(color)}"></span>' if color else ""
        cells = "".join(f"<td>{_cell(r.cells.get(b), t.spec, HTML)}</td>" for b in benches)
        body.append(f'<tr class="{r.source}"><th scope="row">{swatch}{html.escape(r.label)}</th>{cells}</tr>')
    legend = "".join(f"<p>{html.escape(line)}</p>" for line in _legend(t))
    return (
        f'<table class="results"><caption>{html.escape(t.spec.title)}</caption>'
        f"<thead><tr><th>Method</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        f'<div class="legend">{legend}</div>'
    )


def to_csv(t: BuiltTable) -> str:
    """The tidy form (to_frame) as CSV text, numbers with six significant digits."""
    return to_frame(t).to_csv(index=False, lineterminator="\n", float_format="%.6g")


def output_names(table_ids: Sequence[str], formats: Sequence[str]) -> list[str]:
    """The files write_outputs writes: ``<id>.md|.tex|.csv`` per table, ``tables.md`` for several."""
    names = [f"{i}.{fmt}" for i in table_ids for fmt in FORMATS if fmt in formats]
    return names + (["tables.md"] if "md" in formats and len(table_ids) > 1 else [])


def render_outputs(tables: Sequence[BuiltTable], formats: Sequence[str]) -> dict[str, str]:
    """File name -> text of every output (see output_names)."""
    render = {"md": to_markdown, "tex": to_latex, "csv": to_csv}
    files = {f"{t.spec.id}.{fmt}": render[fmt](t) for t in tables for fmt in FORMATS if fmt in formats}
    if "md" in formats and len(tables) > 1:
        body = "\n".join(to_markdown(t) for t in tables)
        files["tables.md"] = "<!-- generated by rpg-eval table -->\n\n" + body
    return files


def write_outputs(tables: Sequence[BuiltTable], out_dir: str | Path, formats: Sequence[str]) -> list[Path]:
    """Write ``<out>/<id>.md|.tex|.csv`` per table (and ``tables.md`` with all tables) into ``out_dir``
    (an open directory, or a path: created), each file atomically and never through a link."""
    return write_files(out_dir, render_outputs(tables, formats))
