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


# --------------------------------------------------------------------------- the new writers (issue #41)

VICTIM = b"someone else's file\n"


def _runs(tmp_path: Path) -> list[str]:
    from test_eval_compare import A, B, write_run

    return [str(write_run(tmp_path / "rpg", "rpg", A)), str(write_run(tmp_path / "grpo", "grpo", B))]


def _refused_or_replaced(rc: int, err: str, path: Path, victim: Path) -> None:
    """The file a link pointed to is unchanged; the command either refused in one line or put a
    file of its own at the name (never writing through the link)."""
    assert victim.read_bytes() == VICTIM
    lines = [x for x in err.splitlines() if x.strip()]
    assert (rc == 2 and len(lines) == 1 and "error:" in lines[0]) or (rc == 0 and not path.is_symlink()), (
        rc,
        err,
    )


def test_report_and_compare_never_write_through_a_link(tmp_path: Path, capsys) -> None:
    from rpg_eval.cli import main

    runs = _runs(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    page = tmp_path / "report.html"
    page.symlink_to(victim)
    rc = main(["report", str(page), "--runs", *runs, "--iters", "20"])
    _refused_or_replaced(rc, capsys.readouterr().err, page, victim)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.csv").symlink_to(victim)
    rc = main(["compare", *runs, "--iters", "20", "--out", str(out)])
    _refused_or_replaced(rc, capsys.readouterr().err, out / "compare.csv", victim)


def test_report_and_compare_refuse_a_fifo_at_their_output(tmp_path: Path, capsys) -> None:
    import os
    import stat

    from rpg_eval.cli import main

    runs = _runs(tmp_path)
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    assert main(["report", str(fifo), "--runs", *runs, "--iters", "20"]) == 2
    out = tmp_path / "cmp"
    out.mkdir()
    (out / ".rpg-owner").write_text("rpg-eval compare\n")  # a folder compare wrote before
    os.mkfifo(out / "compare.md")
    assert main(["compare", *runs, "--iters", "20", "--out", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 2 and all("FIFO" in x or "not a regular file" in x for x in err), err
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISFIFO((out / "compare.md").stat().st_mode)
    assert not (out / "compare.csv").exists()  # refused before anything was written


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_data_dir_holding_a_device_under_a_benchmark_name_says_what_it_is(
    tmp_path: Path, kind: str
) -> None:
    """Issue 38: --data-dir with aime24.jsonl a device (a link to /dev/null), FIFO or directory was
    reported as 'no file for benchmark' (the file is there; it is not a regular file)."""
    import os

    from rpg_eval.data import DataError, load_benchmark

    planted = tmp_path / "aime24.jsonl"
    {"device": lambda: planted.symlink_to("/dev/null"), "fifo": lambda: os.mkfifo(planted),
     "directory": planted.mkdir}[kind]()  # fmt: skip
    with pytest.raises(DataError) as e:
        load_benchmark(tmp_path, "aime24")
    message = str(e.value)
    assert "aime24.jsonl" in message and "no file for benchmark" not in message and "\n" not in message
    assert {"device": "device", "fifo": "FIFO", "directory": "directory"}[kind] in message, message
