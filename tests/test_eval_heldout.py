"""The held-out Best (issue #41 item 3): chosen on one half of each problem's samples and scored on
the other, or chosen on the run's other benchmarks; values computed here from the verdicts by hand,
and the selection bias it removes shown on a simulation whose true accuracy is known."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.stats.heldout import by_samples
from rpg_eval.stats.scores import SCORES

# (benchmark, step, problem) -> verdicts of its 4 samples, in sample order
RIGHT = {
    ("a", 0, "p0"): [1, 1, 0, 0], ("a", 0, "p1"): [1, 1, 0, 0], ("a", 0, "p2"): [1, 0, 0, 0],
    ("a", 10, "p0"): [0, 0, 1, 1], ("a", 10, "p1"): [0, 1, 1, 1], ("a", 10, "p2"): [0, 0, 1, 1],
    ("b", 0, "p0"): [1, 1, 1, 1], ("b", 0, "p1"): [0, 0, 0, 0], ("b", 0, "p2"): [0, 0, 0, 0],
    ("b", 10, "p0"): [0, 0, 0, 0], ("b", 10, "p1"): [0, 0, 0, 0], ("b", 10, "p2"): [0, 0, 0, 1]
}  # fmt: skip


def _samples(path: Path) -> Path:
    lines = []
    for (bench, step, pid), oks in RIGHT.items():
        for j, ok in enumerate(oks):
            lines.append({
                "run": "toy", "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c", "step": step,
                "benchmark": bench, "task": "t", "problem_id": pid, "problem_index": int(pid[1]), "sample_index": j,
                "prompt_style": "plain", "prompt_hash": "0" * 64, "gold": "5", "response": "5" if ok else str(6 + j),
                "extracted": {"math_verify": "5" if ok else str(6 + j), "paper": None},
                "correct": {"math_verify": bool(ok), "paper": False}, "error_math_verify": None, "seed": 0,
                "sampling": {"backend": "hf", "max_tokens": 5, "n": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            })  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _share(bench: str, step: int, samples: slice) -> float:
    """mean@k over problems of the verdicts in ``samples`` (by hand)."""
    per = [np.mean(v[samples]) for (b, s, _), v in RIGHT.items() if (b, s) == (bench, step)]
    return float(np.mean(per))


def _last_best(out: Path) -> dict[str, dict[str, str]]:
    with (out / "last_best.csv").open() as f:
        return {r["benchmark"]: r for r in csv.DictReader(f) if r["grader"] == "math_verify"}


def test_heldout_by_samples_is_chosen_on_the_first_half_and_scored_on_the_second(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        cli_main(["summarize", str(_samples(tmp_path / "s.jsonl")), "--out", str(out), "--iters", "200"]) == 0
    )
    row = _last_best(out)["a"]
    chosen = max(
        (0, 10), key=lambda s: (_share("a", s, slice(0, 2)), -s)
    )  # highest first half, earliest on ties
    paper_best = max((0, 10), key=lambda s: (_share("a", s, slice(None)), -s))
    assert (chosen, paper_best) == (0, 10)  # the data make them differ
    assert int(row["heldout_best_step"]) == chosen and int(row["best_step"]) == paper_best
    assert float(row["heldout_best"]) == pytest.approx(_share("a", chosen, slice(2, 4)))
    assert float(row["best"]) == pytest.approx(_share("a", paper_best, slice(None)))
    assert (
        float(row["heldout_best_ci_low"]) <= float(row["heldout_best"]) <= float(row["heldout_best_ci_high"])
    )
    assert row["heldout_by"] == "samples" and row["heldout_best_maj_step"] != ""
    with (out / "summary.csv").open() as f:
        summary = {
            (r["benchmark"], int(r["step"])): r for r in csv.DictReader(f) if r["grader"] == "math_verify"
        }
    for (bench, step), r in summary.items():
        assert float(r["mean_sel"]) == pytest.approx(_share(bench, step, slice(0, 2)))
        assert float(r["mean_held"]) == pytest.approx(_share(bench, step, slice(2, 4)))


def test_heldout_by_benchmarks_is_chosen_on_the_other_benchmarks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["summarize", str(_samples(tmp_path / "s.jsonl")), "--out", str(out), "--iters", "200"]
    assert cli_main([*args, "--heldout-by", "benchmarks"]) == 0
    rows = _last_best(out)
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
    out = tmp_path / "out"
    assert (
        cli_main(["summarize", str(_samples(tmp_path / "s.jsonl")), "--out", str(out), "--iters", "200"]) == 0
    )
    layout = tmp_path / "layout.yaml"
    layout.write_text("tables:\n  t:\n    paper_table: null\n    benchmarks: [a, b]\n")
    args = ["table", "--layout", str(layout), "--grader", "math_verify", "--heldout", "--runs"]
    capsys.readouterr()
    assert cli_main([*args, str(out / "last_best.csv")]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| toy"))
    assert "(held-out" in row  # beside Last / Best
    old = tmp_path / "old.csv"
    with (out / "last_best.csv").open() as f:
        rows = list(csv.DictReader(f))
    keep = [c for c in rows[0] if not c.startswith("heldout")]
    with old.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    assert cli_main([*args, str(old)]) == 2
    assert "has no held-out Best" in capsys.readouterr().err
