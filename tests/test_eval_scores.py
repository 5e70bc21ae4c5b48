"""rpg_eval.stats.scores: the one list of scores; its columns are the files' contract (docs/contracts.md),
written out here by hand."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from rpg_eval.stats.scores import SCORES, last_best_score_columns, mean_per_problem, summary_score_columns


def test_columns_are_the_contracts() -> None:
    assert list(SCORES) == ["mean", "maj"]
    assert summary_score_columns() == [
        "mean", "ci_low", "ci_high", "mean_sel", "mean_held", "mean_held_ci_low", "mean_held_ci_high",
        "maj", "maj_ci_low", "maj_ci_high", "maj_sel", "maj_held", "maj_held_ci_low", "maj_held_ci_high"
    ]  # fmt: skip
    assert last_best_score_columns() == [
        "last", "last_step", "last_ci_low", "last_ci_high", "best", "best_step", "best_ci_low", "best_ci_high",
        "heldout_best", "heldout_best_step", "heldout_best_ci_low", "heldout_best_ci_high",
        "last_maj", "last_maj_ci_low", "last_maj_ci_high", "best_maj", "best_maj_step", "best_maj_ci_low",
        "best_maj_ci_high", "heldout_best_maj", "heldout_best_maj_step", "heldout_best_maj_ci_low",
        "heldout_best_maj_ci_high"
    ]  # fmt: skip


def test_mean_per_problem_is_the_share_right() -> None:
    def sample(ok: bool) -> dict:
        return {"correct": {"math_verify": ok, "paper": not ok}}

    unit = ("run", "ckpt", 10, "aime24")
    problems = [[sample(True), sample(False), sample(False), sample(True)], [sample(False)] * 4]
    assert mean_per_problem({unit: problems}, "math_verify") == {unit: [0.5, 0.0]}
    assert mean_per_problem({unit: problems}, "paper") == {unit: [0.5, 1.0]}


def _records(path: Path) -> dict[tuple[int, str], list[bool]]:
    """A run's samples.jsonl: 2 checkpoints x 3 problems x 4 samples; returns what is right where."""
    right = {(0, "p0"): [1, 1, 1, 1], (0, "p1"): [1, 0, 1, 1], (0, "p2"): [0, 0, 0, 0],
             (10, "p0"): [1, 1, 1, 1], (10, "p1"): [1, 1, 1, 1], (10, "p2"): [0, 1, 0, 0]}  # fmt: skip
    lines = []
    for (step, pid), oks in right.items():
        for j, ok in enumerate(oks):
            lines.append({
                "benchmark": "addition", "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c",
                "correct": {"math_verify": bool(ok), "paper": False}, "error_math_verify": None,
                "extracted": {"math_verify": "5" if ok else str(6 + j), "paper": None}, "gold": "5",
                "problem_id": pid, "problem_index": int(pid[1]), "prompt_hash": "0" * 64, "prompt_style": "plain",
                "response": "5" if ok else str(6 + j), "run": "toy", "sample_index": j,
                "sampling": {"backend": "hf", "max_tokens": 5, "n": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
                "seed": 0, "step": step, "task": "rpg_addition_plain"
            })  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return {k: [bool(v) for v in oks] for k, oks in right.items()}


# A score added in one place: every problem's samples all right ("all@k"), then summarize, table, plot.
ADD_A_SCORE = """
import sys
from rpg_eval.stats import scores
def all_right(units, grader):
    return {u: [float(all(r["correct"][grader] for r in s)) for s in ps] for u, ps in units.items()}
scores.SCORES["all"] = scores.Score("all", "all@k", "all", ("all_ci_low", "all_ci_high"), "last_all",
                                    "best_all", "best_all_step", all_right, legend="Runs' cells: all@k.")
from rpg_eval.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_score_added_in_scores_reaches_summary_table_and_plot(tmp_path: Path) -> None:
    right = _records(tmp_path / "samples.jsonl")
    out = tmp_path / "out"

    def rpg_eval(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", ADD_A_SCORE, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    rpg_eval("summarize", str(tmp_path / "samples.jsonl"), "--out", str(out))
    with open(out / "summary.csv") as f:
        summary = {(int(r["step"]), r["grader"]): r for r in csv.DictReader(f)}
    for step in (0, 10):  # all@k by hand: the share of problems whose 4 samples are all right
        expected = sum(all(oks) for (s, _), oks in right.items() if s == step) / 3
        assert float(summary[(step, "math_verify")]["all"]) == expected
    with open(out / "last_best.csv") as f:
        lb = {r["grader"]: r for r in csv.DictReader(f)}["math_verify"]
    assert (float(lb["last_all"]), float(lb["best_all"]), lb["best_all_step"]) == (2 / 3, 2 / 3, "10")

    layout = tmp_path / "layout.yaml"
    layout.write_text("tables:\n  toy:\n    paper_table: null\n    benchmarks: [addition]\n")
    rpg_eval("table", "--layout", str(layout), "--runs", str(out / "last_best.csv"), "--grader", "math_verify",
             "--metric", "all", "--formats", "csv,md", "--out", str(tmp_path / "table"))  # fmt: skip
    with open(tmp_path / "table" / "toy.csv") as f:
        (cell,) = list(csv.DictReader(f))
    assert (cell["last"], cell["best"], cell["best_step"]) == ("0.6667", "0.6667", "10")
    assert "Runs' cells: all@k." in (tmp_path / "table" / "toy.md").read_text()

    shown = rpg_eval("plot", "--summary", str(out / "summary.csv"), "--grader", "math_verify", "--metric",
                     "mean,all", "--formats", "png", "--out", str(tmp_path / "plots"))  # fmt: skip
    assert (tmp_path / "plots" / "eval.png").is_file(), shown
