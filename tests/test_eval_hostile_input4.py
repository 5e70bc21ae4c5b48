"""Hostile input to rpg-eval, issue #38's eval side: steps are ASCII digits (a checkpoint named
``global_step٣_hf`` was read as step 3 and became Last; ``rpg-eval table`` took step 10.5), and
``rpg-eval table``'s default ``--paper`` is the repository's file wherever the command runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from rpg_eval.report.tables import TableError, load_runs
from rpg_eval.report.tables import main as table_main
from rpg_eval.run.checkpoints import CheckpointNameError, find_checkpoints

REPO = Path(__file__).resolve().parents[1]


def _model_dirs(root: Path, names: list[str]) -> Path:
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "config.json").write_text("{}")
    return root


@pytest.mark.parametrize("bad", ["global_step٣_hf", "checkpoint-٣", "step_١٠", "global_step1٣_hf"])
def test_a_step_in_other_digits_is_refused_not_read_as_a_number(tmp_path: Path, bad: str) -> None:
    # "٣" is an Arabic-Indic three: int() reads it as 3, and global_step٣_hf became Last above step 2
    root = _model_dirs(tmp_path / "run", ["global_step2_hf", bad])
    with pytest.raises(CheckpointNameError, match="not a number") as e:
        find_checkpoints(root)
    assert bad in str(e.value)


def _write(path: Path, head: list[str], rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head)
        w.writeheader()
        w.writerows(rows)
    return path


LAST_BEST = ["run", "benchmark", "grader", "last", "last_step", "best", "best_step"]
ROW = {"run": "a", "benchmark": "aime24", "grader": "math_verify", "last": 0.3, "last_step": 10, "best": 0.4,
       "best_step": 5}  # fmt: skip


@pytest.mark.parametrize("column,value", [("last_step", "10.5"), ("best_step", "-1"), ("last_step", "٣"),
                                          ("best_step", "1e3")])  # fmt: skip
def test_table_refuses_a_step_that_is_not_ascii_digits(tmp_path: Path, column: str, value: str) -> None:
    assert len(load_runs([_write(tmp_path / "good.csv", LAST_BEST, [ROW])])) == 1
    f = _write(tmp_path / "last_best.csv", LAST_BEST, [ROW, {**ROW, "run": "b", column: value}])
    with pytest.raises(TableError, match=f"column '{column}' row 3 .*not a checkpoint step") as e:
        load_runs([f])
    assert str(f) in str(e.value)


def test_table_refuses_a_summary_step_that_is_not_ascii_digits(tmp_path: Path) -> None:
    head = ["run", "checkpoint", "step", "benchmark", "grader", "mean"]
    rows = [{"run": "a", "checkpoint": "c1", "step": "1", "benchmark": "aime24", "grader": "g", "mean": 0.2},
            {"run": "a", "checkpoint": "c2", "step": "٣", "benchmark": "aime24", "grader": "g", "mean": 0.3}]  # fmt: skip
    with pytest.raises(TableError, match=r"column 'step' row 3 .*not a checkpoint step"):
        load_runs([_write(tmp_path / "summary.csv", head, rows)])


def test_the_default_paper_file_is_the_repositorys_wherever_the_command_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # a results/paper/paper_tables.csv of the current directory (another project's) is not read
    (tmp_path / "results" / "paper").mkdir(parents=True)
    (tmp_path / "results" / "paper" / "paper_tables.csv").write_text("not,the,paper\n1,2,3\n")
    monkeypatch.chdir(tmp_path)
    assert table_main(["--table", "T3"]) == 0
    repo_rows = list(csv.DictReader((REPO / "results" / "paper" / "paper_tables.csv").open()))
    t3 = next(r for r in repo_rows if r["table"] == "T3")
    assert f"{float(t3['last']):.4f}" in capsys.readouterr().out
