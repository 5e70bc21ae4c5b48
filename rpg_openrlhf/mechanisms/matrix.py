"""The KL atlas and the conformance as matrices one can read (exp5_kl_atlas.png, exp6_conformance.png).

A row per option; a column per weight level and policy (on-policy, and off-policy at KL(pi_old ||
pi_theta) = 0.1 with a fixed pi_ref), grouped under a framework version for the conformance. A cell's
colour is the divergence whose gradient the option's expected update is nearest to (full colour: it is
that gradient exactly; pale: it is not, the number says how far), grey where it descends none, white
where it has no KL gradient at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from .report import save_figure  # noqa: E402

#: the divergence a target column stands for (normalized policies: UFKL = FKL, URKL = RKL in gradient)
FAMILY = {"fkl": "FKL", "ufkl": "FKL", "rkl": "RKL", "urkl": "RKL", "seq_fkl": "sequence FKL",
          "seq_rkl": "sequence RKL", "zero": "no KL gradient", "none": "no divergence"}  # fmt: skip
COLOURS = {"FKL": "#3b75af", "RKL": "#e1812c", "sequence RKL": "#8c61b4", "sequence FKL": "#3a923a",
           "no KL gradient": "#ffffff", "no divergence": "#c8c8c8",
           "equal": "#7cc47c", "equal to float32": "#cde8a6", "differs": "#e05555", "re-implementation": "#eeeeee"}  # fmt: skip
COLUMNS = ("token\non-policy", "token\nKL 0.1", "sequence\non-policy", "sequence\nKL 0.1")


@dataclass(frozen=True)
class Cell:
    key: str  # a COLOURS key
    text: str
    exact: bool = True  # False: pale colour (not that divergence's gradient exactly)


def _num(x: float) -> str:
    return "0" if x == 0 else f"{x:.0e}" if x < 1e-3 else f"{x:.2g}"


def reading_cells(row: pd.Series, exact: float) -> tuple[Cell, Cell]:
    """(on-policy, off-policy) cells of one summary row (atlas.summary / conformance_report.summary);
    exact: the distance below which a gradient is a divergence's (the summary's own threshold)."""
    a, worst = row["drift_fixed_ref@0.1"], row["worst_drift"]
    if row["target"] == "zero":
        return Cell(FAMILY["zero"], "no gradient"), Cell(FAMILY["zero"], f"{_num(a)} x |RKL|")
    family = FAMILY[row["target"]]
    if row["on_policy_descends"].startswith("no divergence"):
        near = row["on_policy_descends"].split(", ")[-1].removesuffix(" away)")
        return Cell(FAMILY["none"], f"none\n({family} {near})"), Cell(family, _num(a), exact=False)
    if row["exact_at_every_drift"]:
        return Cell(family, family), Cell(family, f"{family}\nevery drift")
    if a < exact:  # exact at this drift, not at every one (a clamp binds further out)
        return Cell(family, family), Cell(family, f"{family} here;\n{_num(worst)} at most", exact=False)
    return Cell(family, family), Cell(family, _num(a), exact=False)


def _colour(cell: Cell) -> tuple[float, float, float]:
    rgb = to_rgb(COLOURS[cell.key])
    return rgb if cell.exact else tuple(1 - 0.35 * (1 - c) for c in rgb)


def draw(rows: list[str], groups: list[tuple[str, list[str]]], cells: dict[tuple[int, int], Cell],
         path: Path, title: str, legend: list[str]) -> None:  # fmt: skip
    """A matrix: rows x (groups of sub-columns); cells[(row, column)] (absent: blank)."""
    ncols = sum(len(sub) for _, sub in groups)
    label_width = 0.075 * max(len(r) for r in rows)  # inches of the row labels at fontsize 7.5
    fig, ax = plt.subplots(figsize=(label_width + 0.4 + 1.05 * max(ncols, 6), 2.2 + 0.42 * len(rows)))
    for (i, j), cell in cells.items():
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor=_colour(cell), edgecolor="white", lw=1.5))
        dark = cell.exact and cell.key in ("FKL", "RKL", "sequence RKL", "sequence FKL", "differs")
        colour = "white" if dark else "black"
        ax.text(j + 0.5, i + 0.5, cell.text, ha="center", va="center", fontsize=6.5, color=colour)
    col = 0
    for label, sub in groups:
        ax.text(col + len(sub) / 2, -1.35, label, ha="center", va="center", fontsize=8.5, weight="bold")
        for k, name in enumerate(sub):
            ax.text(col + k + 0.5, -0.45, name, ha="center", va="center", fontsize=6.5)
        ax.axvline(col, color="black", lw=1.2)
        col += len(sub)
    ax.axvline(col, color="black", lw=1.2)
    ax.set_xlim(0, ncols)
    ax.set_ylim(len(rows), -1.8)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows, fontsize=7.5)
    ax.set_xticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)
    ax.set_title(title, fontsize=8.5, loc="left")
    handles = [Patch(facecolor=COLOURS[k], edgecolor="grey", label=k) for k in legend]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=min(len(handles), 5),
              fontsize=7, frameon=False)  # fmt: skip
    save_figure(fig, path, dpi=110)


DIVERGENCE_LEGEND = ["FKL", "RKL", "sequence RKL", "no divergence", "no KL gradient"]


def atlas_figure(summ: pd.DataFrame, path: Path, same: dict[str, list[str]], exact: float) -> None:
    """exp5: options x {token, sequence} x {on-policy, off-policy} (atlas.summary rows); same: an
    option -> its aliases."""
    options = list(dict.fromkeys(summ["option"]))
    labels = [o + (f" (= {', '.join(same[o])})" if o in same else "") for o in options]
    cells = {}
    for (option, level), row in summ.set_index(["option", "level"]).iterrows():
        on, off = reading_cells(row, exact)
        j = 0 if level == "token" else 2
        cells[(options.index(option), j)], cells[(options.index(option), j + 1)] = on, off
    draw(labels, [("", list(COLUMNS))], cells, path,
         "The KL atlas: the divergence each option's expected update descends\n(colour; pale: not exactly); "
         "off-policy: its distance to that gradient\nat KL(pi_old || pi_theta) = 0.1, fixed pi_ref (exp5_kl_atlas.md)",
         DIVERGENCE_LEGEND)  # fmt: skip


def _canonical(loss: str) -> str:
    """The registered function's first name (an alias -> the name it was registered under)."""
    from rpg_openrlhf.core.kl_options import ALIASES

    return ALIASES[loss][0][0] if loss in ALIASES else loss


def _agreement_cell(d: pd.DataFrame) -> Cell:
    if (d["implementation"] == "re-implementation").all():
        return Cell("re-implementation", "re-impl.")
    worst = float(d["agreement_max"].max())
    if not d["agrees"].all():
        return Cell("differs", f"differs\n{_num(worst)}")
    if worst <= 1e-12:
        return Cell("equal", f"equal\n{_num(worst)}")
    return Cell("equal to float32", f"equal to\nfloat32 {_num(worst)}")


def conformance_figure(summ: pd.DataFrame, path: Path, exact: dict[str, float]) -> None:
    """exp6: registered options x (framework version: {token, sequence} x {on-, off-policy} and the
    registered option against the framework's code). A framework with several options for one
    registered function (verl k3+, k1+, abs+) shows the first; the table lists every one. exact: the
    divergence threshold of each arithmetic (float64, float32)."""
    summ = summ.assign(row=summ["loss"].map(_canonical))
    rows = list(dict.fromkeys(summ["row"]))
    groups = [f"{f} {v}" if v != "re-implementation" else "re-implemented (not on PyPI)"
              for f, v in zip(summ["framework"], summ["version"])]  # fmt: skip
    summ = summ.assign(group=groups)
    group_names = list(dict.fromkeys(groups))
    cells, width = {}, len(COLUMNS) + 1
    for (row, group), d in summ.groupby(["row", "group"], sort=False):
        first = d[d["option"] == d["option"].iloc[0]].set_index("level")
        i, j0 = rows.index(row), group_names.index(group) * width
        for k, level in enumerate(("token", "sequence")):
            r = first.loc[level]
            cells[(i, j0 + 2 * k)], cells[(i, j0 + 2 * k + 1)] = reading_cells(r, exact[r["arithmetic"]])
        cells[(i, j0 + 4)] = _agreement_cell(d)
    sources = summ.groupby("row", sort=False)["framework"].apply(lambda s: ", ".join(dict.fromkeys(s)))
    labels = [f"{r} ({sources[r]})" for r in rows]
    draw(labels, [(g, [*COLUMNS, "vs\n--rpg.loss"]) for g in group_names], cells, path,
         "Conformance: what each framework's own code descends (colour; pale: not exactly; off-policy: distance at "
         "KL 0.1, fixed pi_ref)\nand whether the registered --rpg.loss equals it (exp6_conformance.md)",
         [*DIVERGENCE_LEGEND, "equal", "equal to float32", "differs", "re-implementation"])  # fmt: skip
