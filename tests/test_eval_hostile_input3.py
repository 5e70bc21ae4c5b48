"""Careless input to rpg-eval: ``run --out`` inside a checkpoint, checkpoints added to or torn, step
names without a number, meaningless table scores, /dev/zero (run under a 2 GiB address-space limit
and a timeout, so a regression fails instead of filling the machine), NaN in a record, one colour per
method. (Golds empty after normalization, FIFOs as data: tests/test_eval_data.py.)"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.run.checkpoints import CheckpointNameError, find_checkpoints

from rpg_openrlhf.common import checkpoints as ck

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN_ARGS = ["--benchmarks", "aime24", "--backend", "hf", "--device", "cpu", "--limit", "1", "--n", "1",
            "--max-tokens", "4", "--no-summary"]  # fmt: skip


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    lines = [x for x in err.splitlines() if re.match(rf"{prog}( [a-z]+)?: error:", x)]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _committed(run: Path, step: int, extra: dict[str, str] | None = None) -> Path:
    """A committed global_step<step>_hf of a run that declares markers (config.json only)."""
    ck.declare(run)
    d = run / f"global_step{step}_hf"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    ck.write_marker(d, f"global_step{step}", step)
    for name, text in (extra or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    return d


def _limited(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` under a 2 GiB address-space limit (an unbounded read dies, not the machine)."""
    code = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        f"sys.argv = {argv!r}; runpy.run_module(sys.argv[0], run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} still running after {timeout} s (reading forever, or blocked on a FIFO)")


# --------------------------------------------------------------------------- item 2


def test_run_out_inside_a_checkpoint_is_refused_and_nothing_is_written(tmp_path: Path, capsys) -> None:
    run = tmp_path / "ckpt"
    d = _committed(run, 1)
    before = sorted(p.name for p in d.iterdir())
    out = d / "eval"
    rc = cli_main(["run", "--checkpoints", str(run), "--out", str(out), "--data-dir", str(DATA), *RUN_ARGS])
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and "inside the checkpoint" in line and str(d) in line, line
    assert sorted(p.name for p in d.iterdir()) == before and ck.is_complete(d)


def test_added_files_are_named_and_the_committed_checkpoint_is_still_evaluated(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    _committed(run, 1, {"README.md": "notes", "eval/summary.csv": "x"})
    skipped: list[Path] = []
    notes: list[str] = []
    assert [c.name for c in find_checkpoints(run, skipped=skipped, notes=notes)] == ["global_step1_hf"]
    assert skipped == [] and len(notes) == 1 and "README.md" in notes[0] and "eval/summary.csv" in notes[0]


def test_a_torn_checkpoint_with_a_marker_is_not_called_markerless(tmp_path: Path) -> None:
    run = tmp_path / "ckpt"
    d = _committed(run, 1)
    (d / "model.safetensors").write_bytes(b"\0" * 10)  # cut after the commit
    with pytest.raises(FileNotFoundError) as e:
        find_checkpoints(run)
    assert "model.safetensors" in str(e.value) and "no completeness marker" not in str(e.value), e.value


# --------------------------------------------------------------------------- item 7


def _model_dirs(root: Path, names: list[str]) -> Path:
    for n in names:
        (root / n).mkdir(parents=True)
        (root / n / "config.json").write_text("{}")
    return root


@pytest.mark.parametrize("bad", ["global_stepNaN"])
def test_a_step_name_without_a_step_number_is_refused(tmp_path: Path, bad: str) -> None:
    root = _model_dirs(tmp_path / "run", ["global_step2_hf", bad])
    with pytest.raises(CheckpointNameError, match="not a number") as e:
        find_checkpoints(root)
    assert bad in str(e.value)


def test_two_checkpoints_of_one_step_are_refused_naming_both(tmp_path: Path, capsys) -> None:
    root = _model_dirs(tmp_path / "run", ["global_step00010", "global_step10", "global_step20"])
    with pytest.raises(CheckpointNameError) as e:
        find_checkpoints(root)
    assert "global_step00010 and global_step10 are both step 10" in str(e.value)
    rc = cli_main(
        ["run", "--checkpoints", str(root), "--out", str(tmp_path / "o"), "--data-dir", str(DATA), *RUN_ARGS]
    )
    assert (
        rc == 2 and "both step 10" in _error_line(capsys.readouterr().err) and not (tmp_path / "o").exists()
    )
    # the final directory's step given by --final-step must not be another checkpoint's
    root2 = _model_dirs(tmp_path / "run2", ["global_step10_hf", "final"])
    with pytest.raises(CheckpointNameError, match="both step 10"):
        find_checkpoints(root2, final_step=10)
    # zero-padded names alone, and the same step in two runs' directories, stay accepted
    assert [
        c.step
        for c in find_checkpoints(_model_dirs(tmp_path / "run3", ["checkpoint-0005", "checkpoint-0010"]))
    ] == [5, 10]


# --------------------------------------------------------------------------- item 8


def _last_best(path: Path, rows: list[dict]) -> Path:
    head = ["run", "benchmark", "grader", "last", "last_step", "last_ci_low", "last_ci_high", "best", "best_step",
            "best_ci_low", "best_ci_high"]  # fmt: skip
    return _write(path, head, rows)


def _write(path: Path, head: list[str], rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize(
    "bad,what",
    [({"last": -0.2, "last_ci_low": -0.3, "last_ci_high": -0.1}, "'last' is negative"),
     ({"best": 0.4, "best_ci_low": 0.5}, "'best_ci_low' is above 'best'")]
)  # fmt: skip
def test_table_refuses_a_meaningless_score_naming_the_row(tmp_path: Path, bad: dict, what: str) -> None:
    from rpg_eval.report.tables import TableError, load_runs

    ok = {"run": "a", "benchmark": "aime24", "grader": "math_verify", "last": 0.3, "last_step": 10,
          "last_ci_low": 0.2, "last_ci_high": 0.4, "best": 0.35, "best_step": 5, "best_ci_low": 0.25,
          "best_ci_high": 0.45}  # fmt: skip
    f = _last_best(tmp_path / "last_best.csv", [ok, {**ok, "run": "b", **bad}])
    assert len(load_runs([_last_best(tmp_path / "good.csv", [ok])])) == 1
    with pytest.raises(TableError, match="row 3") as e:
        load_runs([f])
    assert what in str(e.value) and str(f) in str(e.value)


# --------------------------------------------------------------------------- bounded


def _record(**over) -> dict:
    r = {"run": "r", "checkpoint": "c", "step": 1, "benchmark": "b", "problem_id": "p", "sample_index": 0,
         "prompt_style": "boxed", "correct": {"math_verify": True, "paper": False}}  # fmt: skip
    r.update(over)
    return r


def test_a_jsonl_linked_to_dev_zero_is_refused_not_read(tmp_path: Path) -> None:
    link = tmp_path / "samples.jsonl"
    link.symlink_to("/dev/zero")
    res = _limited(["rpg_eval.cli", "summarize", str(link)])
    line = _error_line(res.stderr)
    assert res.returncode == 2 and "character device" in line and str(link) in line, res.stderr[-2000:]


def test_a_failed_summary_leaves_no_empty_out(tmp_path: Path, capsys) -> None:
    f = tmp_path / "samples.jsonl"
    f.write_text(json.dumps(_record(prompt_style="boxed")) + "\n"
                 + json.dumps(_record(prompt_style="dapo", sample_index=1)) + "\n")  # fmt: skip
    out = tmp_path / "new_out"
    assert cli_main(["summarize", str(f), "--out", str(out)]) == 2
    assert "mixes prompt styles" in _error_line(capsys.readouterr().err) and not out.exists()


def test_bootstrap_in_chunks_draws_the_numbers_of_one_draw() -> None:
    """The chunked bootstrap against the plain formula written here (one (iters, n) draw)."""
    import numpy as np
    from rpg_eval.stats import metrics

    x = np.linspace(0, 1, 37) ** 2
    rng = np.random.default_rng(3)
    means = x[rng.integers(0, x.size, size=(5000, x.size))].mean(axis=1)
    want = tuple(float(v) for v in np.quantile(means, [0.025, 0.975]))
    old = metrics._CHUNK_ELEMENTS
    try:
        metrics._CHUNK_ELEMENTS = 37 * 7  # 7 resamples per chunk
        assert metrics.bootstrap_ci(x, iters=5000, seed=3) == want
    finally:
        metrics._CHUNK_ELEMENTS = old
    with pytest.raises(ValueError, match="iters"):
        metrics.bootstrap_ci(x, iters=metrics.MAX_ITERS + 1)


# --------------------------------------------------------------------------- cosmetic


def test_nan_in_a_records_sampling_is_a_damaged_record_not_two_runs(tmp_path: Path, capsys) -> None:
    f = tmp_path / "samples.jsonl"
    f.write_text(json.dumps(_record(sampling={"temperature": math.nan, "n": 1})) + "\n")
    assert cli_main(["summarize", str(f), "--out", str(tmp_path / "o")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "samples.jsonl:1" in line and "sampling" in line and "finite" in line, line
    assert "two runs" not in line


def test_plot_shows_numbers_plainly(tmp_path: Path, capsys) -> None:
    from rpg_eval.report.plots import main as plot_main

    f = tmp_path / "summary.csv"
    f.write_text("run,step,benchmark,mean\nr,1,aime24,0.5\nr,2,aime24,nan\n")
    assert plot_main(["--summary", str(f), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "np.float64" not in err and "NaN" in err, err


def test_one_colour_per_method_in_every_figure(tmp_path: Path, monkeypatch) -> None:
    """Training curves and the eval plot meet the methods in other orders (TensorBoard: A then B;
    summary.csv: b then a): each method keeps one colour."""
    from rpg_eval.report import plots as P
    from torch.utils.tensorboard import SummaryWriter

    for name, scale in (("A", 1.0), ("B", 0.5)):
        w = SummaryWriter(log_dir=str(tmp_path / "tb" / name))
        for s in range(1, 6):
            w.add_scalar("train/reward", scale * s, s)
        w.close()
    summary = tmp_path / "summary.csv"
    summary.write_text(
        "run,step,benchmark,mean\nb,1,aime24,0.1\nb,2,aime24,0.2\na,1,aime24,0.3\na,2,aime24,0.4\n"
    )
    figures = []
    monkeypatch.setattr(P, "_save", lambda fig, out, name, formats, dpi: figures.append((name, fig)) or [])
    rc = P.main(["--tb", f"A={tmp_path / 'tb' / 'A'}", f"B={tmp_path / 'tb' / 'B'}", "--summary",
                 str(summary), "--label", "a=A", "--label", "b=B", "--panels", "reward", "--out", str(tmp_path / "p")])  # fmt: skip
    assert rc == 0
    seen: dict[str, set] = {"A": set(), "B": set()}
    kinds = set()
    for base, fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                method = line.get_label().split(":")[0]  # "A" or, on a panel of several metrics, "A: reward"
                if method in seen:
                    seen[method].add(line.get_color())
                    kinds.add(base)
    assert {"overlay_reward", "eval"} <= kinds, kinds
    assert len(seen["A"]) == 1 and len(seen["B"]) == 1 and seen["A"] != seen["B"], seen


# --------------------------------------------------------------------------- table steps

LAST_BEST = ["run", "benchmark", "grader", "last", "last_step", "best", "best_step"]
ROW = {"run": "a", "benchmark": "aime24", "grader": "math_verify", "last": 0.3, "last_step": 10, "best": 0.4,
       "best_step": 5}  # fmt: skip


@pytest.mark.parametrize("column,value", [("last_step", "10.5"), ("step", "1e3")])
def test_table_refuses_a_step_that_is_not_a_number(tmp_path: Path, column: str, value: str) -> None:
    from rpg_eval.report.tables import TableError, load_runs

    if column == "step":  # a summary.csv
        head = ["run", "checkpoint", "step", "benchmark", "grader", "mean"]
        row = {"run": "a", "checkpoint": "c1", "step": "1", "benchmark": "aime24", "grader": "g", "mean": 0.2}
    else:
        head, row = LAST_BEST, ROW
    assert len(load_runs([_write(tmp_path / "good.csv", head, [row])])) == 1
    bad = {**row, "run": "b", column: value, **({"checkpoint": "c2"} if "checkpoint" in row else {})}
    f = _write(tmp_path / "runs.csv", head, [row, bad])
    with pytest.raises(TableError, match=f"column '{column}' row 3 .*not a checkpoint step") as e:
        load_runs([f])
    assert str(f) in str(e.value)


def test_the_default_paper_file_is_the_repositorys_wherever_the_command_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from rpg_eval.report.tables import main as table_main

    # a results/paper/paper_tables.csv of the current directory (another project's) is not read
    (tmp_path / "results" / "paper").mkdir(parents=True)
    (tmp_path / "results" / "paper" / "paper_tables.csv").write_text("not,the,paper\n1,2,3\n")
    monkeypatch.chdir(tmp_path)
    assert table_main(["--table", "T3"]) == 0
    repo_rows = list(csv.DictReader((REPO / "results" / "paper" / "paper_tables.csv").open()))
    t3 = next(r for r in repo_rows if r["table"] == "T3")
    assert f"{float(t3['last']):.4f}" in capsys.readouterr().out
