"""The held-out Best (issue #41 item 3): chosen on one half of each problem's samples and scored on
the other, or chosen on the run's other benchmarks; values computed here from the verdicts by hand,
and the selection bias it removes shown on a simulation whose true accuracy is known."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.stats.heldout import by_samples
from rpg_eval.stats.scores import SCORES
from test_eval_compare import refuses, write_run

# (benchmark, step, problem) -> verdicts of its 4 samples, in sample order
RIGHT = {
    ("a", 0, "p0"): [1, 1, 0, 0], ("a", 0, "p1"): [1, 1, 0, 0], ("a", 0, "p2"): [1, 0, 0, 0],
    ("a", 10, "p0"): [0, 0, 1, 1], ("a", 10, "p1"): [0, 1, 1, 1], ("a", 10, "p2"): [0, 0, 1, 1],
    ("b", 0, "p0"): [1, 1, 1, 1], ("b", 0, "p1"): [0, 0, 0, 0], ("b", 0, "p2"): [0, 0, 0, 0],
    ("b", 10, "p0"): [0, 0, 0, 0], ("b", 10, "p1"): [0, 0, 0, 0], ("b", 10, "p2"): [0, 0, 0, 1]
}  # fmt: skip


def _summarized(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "out"
    samples = write_run(tmp_path / "toy", "toy", RIGHT)
    assert cli_main(["summarize", str(samples), "--out", str(out), "--iters", "200", *extra]) == 0
    return out


def _share(bench: str, step: int, samples: slice) -> float:
    """mean@k over problems of the verdicts in ``samples`` (by hand)."""
    per = [np.mean(v[samples]) for (b, s, _), v in RIGHT.items() if (b, s) == (bench, step)]
    return float(np.mean(per))


def _last_best(out: Path) -> dict[str, dict[str, str]]:
    with (out / "last_best.csv").open() as f:
        return {r["benchmark"]: r for r in csv.DictReader(f) if r["grader"] == "math_verify"}


def test_heldout_by_samples_is_chosen_on_the_first_half_and_scored_on_the_second(tmp_path: Path) -> None:
    out = _summarized(tmp_path)
    row = _last_best(out)["a"]
    # the highest first half, earliest on ties
    chosen = max((0, 10), key=lambda s: (_share("a", s, slice(0, 2)), -s))
    paper_best = max((0, 10), key=lambda s: (_share("a", s, slice(None)), -s))
    assert (chosen, paper_best) == (0, 10)  # the data make them differ
    assert int(row["heldout_best_step"]) == chosen and int(row["best_step"]) == paper_best
    assert float(row["heldout_best"]) == pytest.approx(_share("a", chosen, slice(2, 4)))
    assert float(row["best"]) == pytest.approx(_share("a", paper_best, slice(None)))
    low, value, high = (float(row[f"heldout_best{x}"]) for x in ("_ci_low", "", "_ci_high"))
    assert low <= value <= high
    assert row["heldout_by"] == "samples" and row["heldout_best_maj_step"] != ""
    for r in csv.DictReader((out / "summary.csv").open()):
        halves = [_share(r["benchmark"], int(r["step"]), s) for s in (slice(0, 2), slice(2, 4))]
        if r["grader"] == "math_verify":
            assert [float(r["mean_sel"]), float(r["mean_held"])] == pytest.approx(halves)


def test_heldout_by_benchmarks_is_chosen_on_the_other_benchmarks(tmp_path: Path) -> None:
    rows = _last_best(_summarized(tmp_path, "--heldout-by", "benchmarks"))
    for bench, other in (("a", "b"), ("b", "a")):
        chosen = max((0, 10), key=lambda s: (_share(other, s, slice(None)), -s))
        assert int(rows[bench]["heldout_best_step"]) == chosen, bench
        assert float(rows[bench]["heldout_best"]) == pytest.approx(_share(bench, chosen, slice(None)))
        assert rows[bench]["heldout_by"] == "benchmarks"
    assert (int(rows["a"]["heldout_best_step"]), int(rows["b"]["heldout_best_step"])) == (0, 10)


def test_the_papers_best_sits_above_the_true_accuracy_and_the_heldout_best_does_not() -> None:
    """20 checkpoints of one true accuracy p = 0.5 (30 problems x 8 samples, binomial): the paper's
    Best is the largest of 20 noisy means, above p on average (about 1.87 standard errors: the
    expected maximum of 20 normal draws); the held-out Best is one unselected mean, p on average."""
    rng = np.random.default_rng(0)
    s, p, reps, problems, k = SCORES["mean"], 0.5, 300, 30, 8
    paper, heldout = [], []
    for _ in range(reps):
        right = rng.random((20, problems, k)) < p
        rows = [{"step": c, "mean": right[c].mean(), "mean_sel": right[c, :, : k // 2].mean(),
                 "mean_held": right[c, :, k // 2 :].mean()} for c in range(20)]  # fmt: skip
        paper.append(max(r["mean"] for r in rows))
        heldout.append(by_samples(rows, s)["mean_held"])
    se = (p * (1 - p) / (problems * k)) ** 0.5
    assert np.mean(paper) - p == pytest.approx(1.87 * se, rel=0.15)
    assert abs(np.mean(heldout) - p) < 4 * (p * (1 - p) / (problems * k // 2) / reps) ** 0.5


def test_table_shows_the_heldout_best_and_refuses_a_file_written_before_it(tmp_path: Path, capsys) -> None:
    out = _summarized(tmp_path)
    layout = tmp_path / "layout.yaml"
    layout.write_text("tables:\n  t:\n    paper_table: null\n    benchmarks: [a, b]\n")
    args = ["table", "--layout", str(layout), "--grader", "math_verify", "--heldout", "--runs"]
    capsys.readouterr()
    assert cli_main([*args, str(out / "last_best.csv")]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| toy"))
    assert "(held-out" in row  # beside Last / Best
    old, lb = tmp_path / "old.csv", pd.read_csv(out / "last_best.csv")
    lb.drop(columns=[c for c in lb if c.startswith("heldout")]).to_csv(old, index=False)
    refuses(capsys, [*args, str(old)], "has no held-out Best", tmp_path)


def test_heldout_by_benchmarks_names_the_steps_it_left_out(tmp_path: Path, capsys) -> None:
    """b1 scored at steps 1, 2, 3, b2 only at step 1: b1's held-out Best can only be step 1, and
    summarize says steps 2 and 3 were left out."""
    right = {("b1", s, p): [int(j < s - 1) for j in range(2)] for s in (1, 2, 3) for p in ("p1", "p2")}
    run = write_run(tmp_path / "run", "r", {**right, ("b2", 1, "p1"): [1, 0], ("b2", 1, "p2"): [1, 0]})
    assert (
        cli_main(["summarize", str(run), "--out", str(tmp_path / "sum"), "--heldout-by", "benchmarks"]) == 0
    )
    err = capsys.readouterr().err
    left_out = (
        "held-out Best by benchmarks chooses among the steps every benchmark scored; left out step(s) 2, 3"
    )
    assert f"r b1: {left_out}" in err and "r b2:" not in err
    rows = _last_best(tmp_path / "sum")
    assert (rows["b1"]["heldout_best_step"], rows["b1"]["best_step"]) == ("1", "3")
