"""``rpg-eval plot``: training curves and eval scores against step, per run and overlaid across runs
(docs/tables.md, "Plots": the flags, the tags looked for and the files written).

Reads OpenRLHF's TensorBoard event files (``<tensorboard_dir>/<run_name>/events.out.tfevents.*``,
every key of its step status as ``train/<key>``) and the ``summary.csv`` of ``rpg-eval summarize``.
A metric's tag: the first of its :data:`METRIC_ALIASES` (``--alias`` puts tags first) that equals a
tag, ends one as ``/<candidate>`` or is its last segment as ``rpg_<candidate>``; never an ``eval/``
tag; among several, ``train/...`` wins, then the shortest. Writes ``run_<name>``, ``overlay_<panel>``
(two or more runs) and ``eval`` (one panel per benchmark) as PNG and PDF into ``--out``. Also
runnable as ``python -m rpg_eval.report.plots``. Imports nothing from the training side.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede any pyplot import elsewhere in the process

import io  # noqa: E402

import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rpg_openrlhf.common.atomic import OWNER_FILE  # noqa: E402
from rpg_openrlhf.common.cliutil import OneLineParser, float_in, int_in, report_errors  # noqa: E402

from ..options import key_values  # noqa: E402
from ..outputs import PLOT, check_claimable, claim, read_input, write_files  # noqa: E402
from ..stats.scores import DEFAULT, SCORES, summary_score_columns  # noqa: E402
from .tables.layout import split_list  # noqa: E402

#: metric -> candidate TensorBoard tags, most preferred first (see the module docstring).
#: OpenRLHF 0.11.2 logs ``train/reward``, ``train/response_length``, ``train/kl`` (KL loss to the
#: reference when --init_kl_coef > 0), ``train/entropy_loss`` (token entropy, only when an entropy
#: coefficient is set), ``train/ppo_clip_ratio``, ``train/ppo_kl``, ``train/rollout/reward_mean``,
#: ``train/rollout/response_length_mean``; RPG's loss adds kl, w_mean, w_max, w_min,
#: clip_frac_low, clip_frac_high, clip_frac_dual.
METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "reward": ("train/reward", "train/rollout/reward_mean", "reward", "reward_mean", "score"),
    "response_length": (
        "train/response_length",
        "train/rollout/response_length_mean",
        "response_length",
        "response_length_mean",
        "gen_len",
    ),  # fmt: skip
    "entropy": ("train/policy_entropy", "train/entropy", "policy_entropy", "entropy", "entropy_loss"),
    "kl": ("train/kl", "kl", "rpg_kl", "kl_loss"),
    "clip_frac_low": ("clip_frac_low",),
    "clip_frac_high": ("clip_frac_high",),
    "clip_frac_dual": ("clip_frac_dual",),
    "ppo_clip_ratio": ("train/ppo_clip_ratio", "ppo_clip_ratio", "clip_ratio"),
    "w_mean": ("w_mean",),
    "w_max": ("w_max",),
    "w_min": ("w_min",),
}

#: panel -> (y-axis label, metrics drawn on it). A panel is drawn when one of its metrics exists.
PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("reward (mean over the batch)", ("reward",)),
    "response_length": ("response length (tokens)", ("response_length",)),
    "entropy": ("policy entropy (nats/token)", ("entropy",)),
    "kl": ("KL to the reference", ("kl",)),
    "clip_fraction": (
        "fraction of tokens clipped",
        ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "ppo_clip_ratio"),
    ),
    "importance_weight": ("importance weight w = π_θ / π_old", ("w_mean", "w_max", "w_min")),
}
PANEL_TITLES = {"reward": "Reward", "response_length": "Response length", "entropy": "Entropy", "kl": "KL",
                "clip_fraction": "Clip fraction", "importance_weight": "Importance weights"}  # fmt: skip
FORMATS = ("png", "pdf")
#: Highest --dpi: a 3 x 3 grid of panels at 600 dpi is ~9,000 x 6,500 pixels (print quality); far
#: larger values exhaust memory (100,000 dpi asked for terabytes).
MAX_DPI = 600
_LINESTYLES = ("-", "--", ":", "-.")


class PlotError(ValueError):
    """Bad input to the plotter (the message names the path, column or run)."""


@dataclass
class PlotResult:
    """What one figure holds: its files and, per panel, the labels of the lines drawn."""

    paths: list[Path]
    series: dict[str, list[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------- reading


def discover_runs(path: str | Path, label: str | None = None) -> dict[str, Path]:
    """Map run name -> event folder (a folder at or under ``path`` holding TensorBoard event files).
    One folder: named ``label`` or the folder's name; several (a ``tensorboard_dir`` holding many
    runs): named by their path below ``path``."""
    p = Path(path)
    if not p.exists():
        raise PlotError(f"{p}: no such file or folder")
    if p.is_file() and "tfevents" not in p.name:
        raise PlotError(f"{p}: not a TensorBoard event file (name lacks 'tfevents')")
    dirs = [p.parent] if p.is_file() else sorted({f.parent for f in p.rglob("*tfevents*") if f.is_file()})
    if not dirs:
        raise PlotError(f"{p}: no TensorBoard event files (events.out.tfevents.*) in it or below")
    if len(dirs) == 1:
        return {label or (dirs[0].name if dirs[0] != Path(".") else p.resolve().name): dirs[0]}
    base = p if p.is_dir() else p.parent
    out = {}
    for d in dirs:
        rel = d.relative_to(base).as_posix()
        rel = rel if rel != "." else base.resolve().name
        out[f"{label}/{rel}" if label else rel] = d
    return out


def load_scalars(path: str | Path) -> dict[str, pd.DataFrame]:
    """All scalar series of one event folder: tag -> DataFrame(step, value, wall_time).

    Several event files in the folder (a resumed run) are read together; where a step was
    logged twice, the later write wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    p = Path(path)
    acc = EventAccumulator(str(p), size_guidance={"scalars": 0})
    try:
        acc.Reload()
    except Exception as exc:  # corrupt or foreign files
        raise PlotError(f"{p}: cannot read TensorBoard events ({exc})") from exc
    out: dict[str, pd.DataFrame] = {}
    for tag in acc.Tags().get("scalars", []):
        ev = acc.Scalars(tag)
        df = pd.DataFrame(
            {
                "step": [e.step for e in ev],
                "value": [e.value for e in ev],
                "wall_time": [e.wall_time for e in ev],
            }
        )
        df = df.sort_values(["step", "wall_time"], kind="stable").drop_duplicates("step", keep="last")
        out[tag] = df.reset_index(drop=True)
    return out


def _matches(tag: str, cand: str) -> bool:
    last = tag.rsplit("/", 1)[-1]
    return tag == cand or tag.endswith("/" + cand) or last == "rpg_" + cand


def resolve_tag(
    metric: str, tags: Sequence[str], aliases: dict[str, Sequence[str]] | None = None
) -> str | None:
    """The tag that holds ``metric`` among ``tags`` (see the module docstring), or None."""
    usable = [t for t in tags if not t.startswith("eval/")]
    for cand in (aliases or METRIC_ALIASES)[metric]:
        hits = [t for t in usable if _matches(t, cand)]
        if hits:
            return sorted(hits, key=lambda t: (t != cand, not t.startswith("train/"), len(t), t))[0]
    return None


def resolve_metrics(
    scalars: dict[str, pd.DataFrame], metrics: Sequence[str], aliases: dict[str, Sequence[str]] | None = None
) -> dict[str, str]:
    """metric -> tag for every metric of ``metrics`` found in ``scalars``."""
    found = {m: resolve_tag(m, list(scalars), aliases) for m in metrics}
    return {m: tag for m, tag in found.items() if tag is not None}


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard-style debiased exponential moving average (``weight`` in [0, 1); 0: unchanged)."""
    out, last, n = [], 0.0, 0
    for v in values:
        if math.isnan(v):
            out.append(v)
            continue
        n += 1
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n) if weight > 0 else v)
    return out


def load_summary(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Read eval ``summary.csv`` files (columns run, step, benchmark, mean; optional grader,
    ci_low, ci_high, maj, maj_ci_low, maj_ci_high), with the file name in a ``file`` column."""
    return pd.concat([_read_summary(Path(path)) for path in paths], ignore_index=True)


def _read_summary(p: Path) -> pd.DataFrame:
    data = read_input(p)  # missing, a FIFO or a device: refused in one line, not waited on or read forever
    try:
        df = pd.read_csv(io.BytesIO(data))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise PlotError(f"{p}: not a readable CSV file ({exc})") from exc
    missing = [c for c in ("run", "step", "benchmark", "mean") if c not in df.columns]
    if missing:
        raise PlotError(
            f"{p}: missing column(s) {', '.join(missing)}; found: {', '.join(map(str, df.columns))}"
        )
    if df.empty:
        raise PlotError(f"{p}: no rows (only a header): nothing to plot; run rpg-eval summarize first")
    for c in ("step", *summary_score_columns()):
        if c not in df.columns:
            df[c] = math.nan
            continue
        num = pd.to_numeric(df[c], errors="coerce")
        bad = (num.isna() & df[c].notna()) | num.isin([math.inf, -math.inf])
        if c in ("step", "mean"):
            bad |= num.isna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise PlotError(f"{p}: column '{c}' line {i + 2}: {_shown(df[c].iloc[i])} is not a finite number")
        df[c] = num
    df["grader"] = df["grader"].fillna("").astype(str) if "grader" in df.columns else ""
    df["run"] = df["run"].astype(str)
    df["benchmark"] = df["benchmark"].astype(str).str.lower()
    df["file"] = str(p)
    return df


def _shown(value: object) -> str:
    """A cell as the file has it: "nan", "inf", "'abc'" (not numpy's repr, "np.float64(nan)")."""
    if isinstance(value, str):
        return repr(value)
    return "an empty cell or NaN" if pd.isna(value) else f"{float(value):g}"  # numpy scalars too


def run_colors(names: Sequence[str]) -> dict[str, str]:
    """One colour per run name (as shown, after --label) for every figure of one ``plot`` call: the
    names sorted, then matplotlib's colour cycle in that order; a method keeps its colour from the
    training curves to the eval plot whatever order each figure meets its runs in."""
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(sorted(set(names)))}


# --------------------------------------------------------------------------- drawing


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


def render(fig: Figure, fmt: str, dpi: int) -> bytes:
    """A figure as the bytes of an image file (png, pdf), without a date or a tool version in it."""
    meta = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", metadata=meta)
    return buf.getvalue()


def _save(fig: Figure, out_dir: str | Path, name: str, formats: Sequence[str], dpi: int) -> list[Path]:
    """Render each format in memory, then write ``name.<format>`` into ``out_dir`` atomically."""
    # not with_suffix: run names may hold dots
    return write_files(out_dir, {f"{name}.{fmt}": render(fig, fmt, dpi) for fmt in formats})


def _draw_series(ax, df: pd.DataFrame, label: str, weight: float, color=None, linestyle="-") -> None:
    x, y = df["step"].to_numpy(), df["value"].astype(float).tolist()
    if weight > 0:
        (raw,) = ax.plot(x, y, alpha=0.25, linewidth=0.8, color=color, linestyle=linestyle)
        ax.plot(x, smooth(y, weight), label=label, color=raw.get_color(), linestyle=linestyle, linewidth=1.5)
    else:
        marker = "." if len(x) < 30 else None
        ax.plot(x, y, label=label, color=color, linestyle=linestyle, linewidth=1.4, marker=marker)


def _panels_figure(n: int) -> tuple[Figure, int, int]:
    """A figure for ``n`` panels, three to a row."""
    cols = min(3, n)
    rows = math.ceil(n / cols)
    return Figure(figsize=(5.0 * cols, 3.6 * rows), layout="constrained"), rows, cols


def _label_axes(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_run(
    name: str,
    scalars: dict[str, pd.DataFrame],
    out_dir: str | Path,
    panels: Sequence[str] | None = None,
    aliases: dict[str, Sequence[str]] | None = None,
    formats: Sequence[str] = FORMATS,
    smooth_weight: float = 0.0,
    dpi: int = 120,
) -> PlotResult:
    """One figure for one run: a grid of the panels that have data. Returns files and series."""
    panels = list(panels or PANELS)
    found = {p: resolve_metrics(scalars, PANELS[p][1], aliases) for p in panels}
    found = {p: m for p, m in found.items() if m}
    if not found:
        raise PlotError(
            f"run {name!r}: none of the metrics {', '.join(m for p in panels for m in PANELS[p][1])} "
            f"in its TensorBoard tags ({', '.join(sorted(scalars)) or 'none'}); add --alias METRIC=TAG"
        )
    fig, rows, cols = _panels_figure(len(found))
    fig.suptitle(f"Training curves: {name}")
    result = PlotResult(paths=[])
    for i, (panel, mtags) in enumerate(found.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        for metric, tag in mtags.items():
            _draw_series(ax, scalars[tag], f"{metric} ({tag})", smooth_weight)
        result.series[panel] = [f"{m} ({t})" for m, t in mtags.items()]
        _label_axes(ax, PANEL_TITLES.get(panel, panel), "training step", PANELS[panel][0])
    result.paths = _save(fig, out_dir, f"run_{_safe(name)}", formats, dpi)
    return result


def overlay_figures(
    runs: dict[str, dict[str, pd.DataFrame]],
    panels: Sequence[str] | None = None,
    aliases: dict[str, Sequence[str]] | None = None,
    smooth_weight: float = 0.0,
    colors: dict[str, str] | None = None,
) -> dict[str, tuple[Figure, list[str]]]:
    """One figure per panel with every run on it (colour: run, ``colors`` or run_colors; line
    style: metric): panel -> (figure, labels of its lines)."""
    colors = colors or run_colors(list(runs))
    results: dict[str, tuple[Figure, list[str]]] = {}
    for panel in panels or PANELS:
        metrics = PANELS[panel][1]
        per_run = {name: resolve_metrics(sc, metrics, aliases) for name, sc in runs.items()}
        if not any(per_run.values()):
            continue
        fig = Figure(figsize=(7.0, 4.2), layout="constrained")
        ax = fig.add_subplot(1, 1, 1)
        labels = []
        for name, mtags in per_run.items():
            for metric, tag in mtags.items():
                label = name if len(metrics) == 1 else f"{name}: {metric}"
                style = _LINESTYLES[metrics.index(metric) % len(_LINESTYLES)]
                _draw_series(ax, runs[name][tag], label, smooth_weight, colors[name], style)
                labels.append(label)
        _label_axes(ax, f"{PANEL_TITLES.get(panel, panel)} across runs", "training step", PANELS[panel][0])
        results[panel] = (fig, labels)
    return results


def eval_figure(
    summary: pd.DataFrame,
    labels: dict[str, str] | None = None,
    grader: str | None = None,
    benchmarks: Sequence[str] | None = None,
    metrics: Sequence[str] = (DEFAULT,),
    colors: dict[str, str] | None = None,
) -> tuple[Figure, PlotResult]:
    """Eval score (shaded 95% interval) against checkpoint step: a panel per benchmark, a line per
    run (per run and grader when several graders are present and none chosen) and metric
    (``metrics``: "mean" = mean@k, "maj" = maj@k; a line's label names the metric unless it is
    mean@k alone). Returns the figure and the labels of its lines (``PlotResult.series``)."""
    labels = labels or {}
    df = _eval_rows(summary, grader, metrics)
    benches = list(benchmarks or dict.fromkeys(df["benchmark"]))
    missing = [b for b in benches if b not in set(df["benchmark"])]
    if missing:
        raise PlotError(
            f"benchmark(s) {', '.join(missing)} not in the summary (has: {', '.join(dict.fromkeys(df['benchmark']))})"
        )
    several_graders = df["grader"].nunique() > 1
    colors = colors or run_colors([labels.get(r, r) for r in df["run"]])
    graders = list(dict.fromkeys(df["grader"]))
    fig, rows, cols = _panels_figure(len(benches))
    names_metrics = " / ".join(SCORES[m].name for m in metrics)
    fig.suptitle(f"Eval score against training step ({names_metrics}, 95% interval)")
    result = PlotResult(paths=[])
    for i, b in enumerate(benches):
        ax = fig.add_subplot(rows, cols, i + 1)
        names = []
        for (run, g), d in df[df["benchmark"] == b].groupby(["run", "grader"], sort=False):
            d = d.sort_values("step")
            label = labels.get(run, run) + (f" [{g}]" if several_graders else "")
            for j, m in enumerate(metrics):
                s = SCORES[m]
                shown = label if list(metrics) == [DEFAULT] else f"{label} {s.name}"
                style = _LINESTYLES[(graders.index(g) * len(metrics) + j) % len(_LINESTYLES)]
                (line,) = ax.plot(d["step"], d[s.value], marker="o", markersize=3, label=shown, linestyle=style,
                                  color=colors[labels.get(run, run)])  # fmt: skip
                if d[s.ci[0]].notna().any():
                    ax.fill_between(d["step"], d[s.ci[0]], d[s.ci[1]], alpha=0.2, color=line.get_color())
                names.append(shown)
        result.series[b] = names
        _label_axes(ax, b.upper(), "training step (checkpoint)", "accuracy")
    return fig, result


def _eval_rows(summary: pd.DataFrame, grader: str | None, metrics: Sequence[str]) -> pd.DataFrame:
    """The summary rows to draw (one grader, or all), checked to hold every metric asked for."""
    df = summary
    if grader is not None:
        df = df[df["grader"] == grader]
        if df.empty:
            raise PlotError(
                f"no rows with grader {grader!r} (graders: {', '.join(sorted(set(summary['grader'])))})"
            )
    for m in metrics:
        col, name = SCORES[m].value, SCORES[m].name
        if df[col].isna().all():
            files = ", ".join(dict.fromkeys(df["file"])) if "file" in df.columns else "the summary"
            raise PlotError(
                f"{files}: no {name} values (column '{col}'; a summary.csv written before {name}: "
                "run rpg-eval summarize again)"
            )
    return df


# --------------------------------------------------------------------------- CLI


def _split_label(item: str) -> tuple[str | None, str]:
    """``LABEL=PATH`` -> (LABEL, PATH); a plain path -> (None, PATH)."""
    if "=" in item and not Path(item).exists():
        label, path = item.split("=", 1)
        return label.strip() or None, path
    return None, item


def load_tb(items: Sequence[str]) -> dict[str, dict[str, pd.DataFrame]]:
    """The scalars of every run of ``--tb [LABEL=]DIR ...``: run name -> tag -> series."""
    runs: dict[str, dict[str, pd.DataFrame]] = {}
    for item in items:
        label, path = _split_label(item)
        for name, d in discover_runs(path, label).items():
            if name in runs:
                raise PlotError(f"two TensorBoard runs named {name!r}; name them with LABEL=DIR")
            runs[name] = load_scalars(d)
    return runs


def _parse_aliases(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    aliases = dict(METRIC_ALIASES)
    for item in items:
        if "=" not in item:
            raise PlotError(f"--alias expects METRIC=TAG[,TAG...], got {item!r}")
        metric, tags = item.split("=", 1)
        metric = metric.strip()
        if metric not in aliases:
            raise PlotError(f"--alias: unknown metric {metric!r}; known: {', '.join(aliases)}")
        aliases[metric] = tuple(t.strip() for t in tags.split(",") if t.strip()) + aliases[metric]
    return aliases


def _build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="rpg-eval plot",
        description="Plot training curves (TensorBoard) and eval scores (summary.csv) against step.",
    )
    p.add_argument("--tb", nargs="+", default=[], metavar="[LABEL=]DIR", help="TensorBoard folders of runs")
    p.add_argument("--summary", nargs="+", default=[], help="eval summary.csv files")
    p.add_argument("--out", default="results/plots", help="output folder (default: results/plots)")
    p.add_argument("--label", action="append", default=[], help="RUN=LABEL for a summary.csv run")
    p.add_argument("--panels", default=None, help=f"comma-separated subset of {','.join(PANELS)}")
    p.add_argument("--alias", action="append", default=[], help="METRIC=TAG[,TAG]: look for these tags first")
    p.add_argument("--grader", default=None, help="eval grader to plot (default: all, one line each)")
    p.add_argument("--benchmarks", default=None, help="comma-separated benchmarks of eval.png (default: all)")
    p.add_argument("--smooth", type=float_in(0, 1, high_open=True), default=0.0, help="EMA weight in [0, 1)")
    p.add_argument("--formats", default="png,pdf", help="png,pdf (default both)")
    p.add_argument("--dpi", type=int_in(1, MAX_DPI), default=120, help=f"1..{MAX_DPI} (default 120)")
    p.add_argument(
        "--metric", default=None, help=f"eval.png: subset of {','.join(SCORES)} (default {DEFAULT})"
    )
    return p


def _plot(a: argparse.Namespace) -> None:
    """Everything ``rpg-eval plot`` draws; options and inputs are read before anything is written."""
    if not a.tb and not a.summary:
        raise PlotError("nothing to plot: give --tb TensorBoard folders and/or --summary summary.csv files")
    formats = split_list(a.formats, FORMATS, "--formats")
    panels = split_list(a.panels, list(PANELS), "--panels", list(PANELS))
    metrics = split_list(a.metric, list(SCORES), "--metric", [DEFAULT])
    aliases, labels = _parse_aliases(a.alias), key_values(a.label, "--label", "RUN=LABEL")
    runs = load_tb(a.tb)
    summary = load_summary(a.summary) if a.summary else None
    shown = list(runs) + ([labels.get(r, r) for r in summary["run"]] if summary is not None else [])
    colors = run_colors(shown)  # one colour per method in every figure below
    with claim(a.out, PLOT) as out:  # the inputs are read: the folder is made and marked now
        for name, sc in runs.items():
            res = plot_run(name, sc, out, panels, aliases, formats, a.smooth, a.dpi)
            for panel, series in res.series.items():
                print(f"{name}: {panel}: {', '.join(series)}")
            print(f"wrote {', '.join(map(str, res.paths))}")
        figures = overlay_figures(runs, panels, aliases, a.smooth, colors) if len(runs) > 1 else {}
        if summary is not None:
            benches = [b.strip().lower() for b in a.benchmarks.split(",")] if a.benchmarks else None
            figures["eval"] = eval_figure(summary, labels, a.grader, benches, metrics, colors)
        for panel, (fig, _) in figures.items():
            name = "eval" if panel == "eval" else f"overlay_{panel}"
            print(f"wrote {', '.join(map(str, _save(fig, out, name, formats, a.dpi)))}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rpg-eval plot`` (and ``python -m rpg_eval.report.plots``): one line and exit 2
    on any failure (a PlotError, a bad --label, an --out that names a file, an unreadable input)."""
    return report_errors("rpg-eval plot", _main, argv)


def _main(argv: list[str]) -> int:
    a = _build_parser().parse_args(argv)
    out = Path(a.out)
    existed = out.exists()
    try:
        check_claimable(out, PLOT)  # a folder plot did not make or mark, or a link in it: refused now
        _plot(a)
    except BaseException:
        if not existed and out.is_dir() and {p.name for p in out.iterdir()} <= {OWNER_FILE}:
            (out / OWNER_FILE).unlink(missing_ok=True)  # made for this call and left without a figure:
            out.rmdir()  # do not leave it behind
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
