"""One step per checkpoint and a held-out Best that says what it left out (issue 50 items 2, 3):
records of one checkpoint at two steps (one edited record, or two passes over a checkpoint that
changed) are refused naming both places; the duplicate key holds the step; ``--heldout-by
benchmarks`` names the steps it could not choose."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rpg_eval.cli import main as cli_main
from test_eval_summary import _error_line, _record


def _write(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _unit(step: int, ckpt_step: int | None = None, bench: str = "aime24", right: int = 1) -> list[dict]:
    """Two problems x 2 samples of checkpoint global_step{step}_hf, recorded at ``ckpt_step``."""
    out = []
    for pid in ("p1", "p2"):
        for j in range(2):
            r = _record(step, pid, "5", j, "\\boxed{5}" if j < right else "\\boxed{4}", sampling={"n": 2})
            r.update(step=step if ckpt_step is None else ckpt_step, benchmark=bench)
            out.append(r)
    return out


def test_a_record_at_another_step_than_its_checkpoint_is_refused(tmp_path: Path, capsys) -> None:
    """One record of global_step1_hf says step 9: not a phantom unit at step 9 (Last = 0.25 there)
    but refused at its line, naming both steps and where the first was seen."""
    records = _unit(1)
    records[3]["step"] = 9
    run = _write(tmp_path / "run", records)
    assert cli_main(["summarize", str(run), "--out", str(tmp_path / "sum")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"{run / 'samples.jsonl'}:4: run 'r', checkpoint 'global_step1_hf' is at step 9 here" in line
    assert f"at step 1 at {run / 'samples.jsonl'}:1" in line and not (tmp_path / "sum").exists()


def test_two_passes_that_give_one_checkpoint_two_steps_are_refused(tmp_path: Path, capsys) -> None:
    """A `final` checkpoint at step 2 in one pass and step 3 in the other: refused naming one record
    of each pass (before, the second pass's records were dropped as duplicates: the key had no step)."""
    first = [dict(r, checkpoint="final") for r in _unit(2)]
    second = [dict(r, checkpoint="final", step=3) for r in _unit(2, right=2)]
    a, b = _write(tmp_path / "pass1", first), _write(tmp_path / "pass2", second)
    both = tmp_path / "both"
    _write(both, first + second)
    assert cli_main(["summarize", str(both), "--out", str(tmp_path / "sum")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert (
        f"{both / 'samples.jsonl'}:5: run 'r', checkpoint 'final' is at step 3 here and at step 2 at " in line
    )
    assert f"{both / 'samples.jsonl'}:1" in line
    assert cli_main(["summarize", str(a), str(b), "--out", str(tmp_path / "sum")]) == 2
    line = _error_line(capsys.readouterr().err)
    assert f"{b / 'samples.jsonl'}:1:" in line and f"at step 2 at {a / 'samples.jsonl'}:1" in line


def test_the_duplicate_key_holds_the_step() -> None:
    from rpg_eval.stats.summary import record_key

    r = _unit(2)[0]
    assert record_key(r) != record_key(dict(r, step=3)) and record_key(r) == record_key(dict(r))


def test_heldout_by_benchmarks_names_the_steps_it_left_out(tmp_path: Path, capsys) -> None:
    """b1 scored at steps 1, 2, 3, b2 only at step 1: b1's held-out Best can only be step 1, and
    summarize says steps 2 and 3 were left out."""
    records = _unit(1, bench="b1", right=0) + _unit(2, bench="b1", right=1) + _unit(3, bench="b1", right=2)
    records += _unit(1, bench="b2")
    run = _write(tmp_path / "run", records)
    assert (
        cli_main(["summarize", str(run), "--out", str(tmp_path / "sum"), "--heldout-by", "benchmarks"]) == 0
    )
    err = capsys.readouterr().err
    assert (
        "r b1: held-out Best by benchmarks chooses among the steps every benchmark scored; left out step(s) 2, 3"
        in err
    )
    rows = {
        (r["benchmark"], r["grader"]): r for r in csv.DictReader((tmp_path / "sum" / "last_best.csv").open())
    }
    assert (
        rows[("b1", "math_verify")]["heldout_best_step"] == "1"
        and rows[("b1", "math_verify")]["best_step"] == "3"
    )
    assert "r b2:" not in err
