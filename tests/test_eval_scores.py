"""rpg_eval.scores: the one list of scores; its columns are the files' contract (docs/contracts.md),
written out here by hand."""

from __future__ import annotations

from rpg_eval.scores import SCORES, last_best_score_columns, mean_per_problem, summary_score_columns


def test_columns_are_the_contracts() -> None:
    assert list(SCORES) == ["mean", "maj"]
    assert summary_score_columns() == ["mean", "ci_low", "ci_high", "maj", "maj_ci_low", "maj_ci_high"]
    assert last_best_score_columns() == [
        "last", "last_step", "last_ci_low", "last_ci_high", "best", "best_step", "best_ci_low", "best_ci_high",
        "last_maj", "last_maj_ci_low", "last_maj_ci_high", "best_maj", "best_maj_step", "best_maj_ci_low",
        "best_maj_ci_high",
    ]  # fmt: skip


def test_mean_per_problem_is_the_share_right() -> None:
    def sample(ok: bool) -> dict:
        return {"correct": {"math_verify": ok, "paper": not ok}}

    unit = ("run", "ckpt", 10, "aime24")
    problems = [[sample(True), sample(False), sample(False), sample(True)], [sample(False)] * 4]
    assert mean_per_problem({unit: problems}, "math_verify") == {unit: [0.5, 0.0]}
    assert mean_per_problem({unit: problems}, "paper") == {unit: [0.5, 1.0]}
