"""Several runs of one method over training seeds (issue #41 item 2): the two-way bootstrap against its
variance formula, and ``rpg-eval table``'s seed rows against the mean and std of the seeds' means
computed by hand (and their refusal of seeds evaluated with other settings, or of one seed)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import numpy as np
import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.stats.seeds import hierarchical_bootstrap
from test_eval_compare import refuses, write_run


def test_the_two_way_bootstrap_adds_the_seed_and_the_problem_variance() -> None:
    """x[j, i] = a_j + b_i: a resample's mean is mean(a over drawn seeds) + mean(b over drawn problems),
    two independent means of draws with replacement, so its variance is var(a)/J + var(b)/n with the
    population (ddof = 0) variances."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.05, 5), rng.uniform(0, 1, 30)
    x = a[:, None] + b[None, :]
    means = hierarchical_bootstrap(x, iters=40000, seed=1)
    assert means.std() == pytest.approx(np.sqrt(a.var() / 5 + b.var() / 30), rel=0.02)
    assert means.mean() == pytest.approx(x.mean(), abs=3 * means.std() / np.sqrt(40000))
    # a single seed: only the problems vary, var(b)/n
    assert hierarchical_bootstrap(x[:1], iters=40000, seed=2).std() == pytest.approx(
        np.sqrt(b.var() / 30), rel=0.02
    )


LAYOUT = """
benchmarks: {addition: "a+b"}
tables:
  t:
    title: "seeds"
    paper_table: null
    benchmarks: [addition]
    rows:
      - {seeds: [rpg-s0, rpg-s1, rpg-s2], label: "RPG (3 seeds)"}
"""


def _seed_runs(tmp_path: Path, **other_sampling) -> tuple[list[str], dict[str, dict]]:
    rng = np.random.default_rng(5)
    rights = {
        f"rpg-s{j}": {(s, f"p{i}"): [int(v) for v in rng.random(4) < 0.2 + 0.1 * i + 0.1 * j] for s in (0, 5) for i in range(6)}
        for j in range(3)
    }  # fmt: skip
    dirs = [
        str(write_run(tmp_path / r, r, right, **(other_sampling if r == "rpg-s2" else {})))
        for r, right in rights.items()
    ]
    (tmp_path / "layout.yaml").write_text(LAYOUT)
    return dirs, rights


def test_table_shows_a_methods_seed_runs_as_one_row(tmp_path: Path) -> None:
    dirs, rights = _seed_runs(tmp_path)
    out = tmp_path / "t"
    assert cli_main(["table", "--layout", str(tmp_path / "layout.yaml"), "--samples", *dirs, "--grader", "math_verify",
                     "--formats", "md,csv", "--out", str(out)]) == 0  # fmt: skip
    row = next(csv.DictReader((out / "t.csv").open()))
    last = [
        np.mean([np.mean(v) for (s, _), v in right.items() if s == 5]) for right in rights.values()
    ]  # by hand
    assert float(row["last"]) == pytest.approx(np.mean(last), abs=1e-4)
    assert float(row["last_std"]) == pytest.approx(statistics.stdev(last), abs=1e-5)
    assert float(row["last_ci_low"]) <= float(row["last"]) <= float(row["last_ci_high"])
    assert row["seeds"] == "rpg-s0 rpg-s1 rpg-s2" and row["source"] == "seeds"
    assert "mean ± std over 3 seeds" in (out / "t.md").read_text()


def test_seed_rows_without_samples_of_other_settings_or_of_one_seed_are_refused(
    tmp_path: Path, capsys
) -> None:
    """Each one line, naming what is wrong; one seed has no spread across seeds: not shown as
    "0.5000 ± 0.000" but refused, naming the row, and nothing is written."""
    dirs, _ = _seed_runs(tmp_path, temperature=0.6)
    table = [
        "table",
        "--layout",
        str(tmp_path / "layout.yaml"),
        "--grader",
        "math_verify",
        "--out",
        str(tmp_path / "t"),
    ]
    refuses(
        capsys,
        [*table, "--samples", *dirs],
        "sampling.temperature 1.0 in the first seed and 0.6 in another",
        tmp_path,
    )
    refuses(capsys, table, "needs the seed runs' samples", tmp_path)
    (tmp_path / "layout.yaml").write_text(LAYOUT.replace("[rpg-s0, rpg-s1, rpg-s2]", "[rpg-s0]"))
    said = "row 'RPG (3 seeds)' (seeds rpg-s0)"
    assert "needs two seeds or more" in refuses(capsys, [*table, "--samples", dirs[0]], said, tmp_path)
