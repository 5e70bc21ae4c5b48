"""rpg_eval.stats.summary (its files' columns: test_eval_metrics.py): maj@k
(issue #19 item 12), summaries that refuse to mix two runs or two steps of a checkpoint under one name
(item 4, issue 50 item 2), and where ``rpg-eval score`` may not write (items 2 and 3).

maj@k is checked against a vote computed here from the records, with the answers' equivalence
classes written by hand (``\\frac12``, ``0.5`` and ``1/2`` are one answer), not by the module."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from rpg_eval.graders import grade
from test_eval_compare import refuses, write_run


def _record(step: int, pid: str, gold: str, j: int, response: str, run: str = "r", **extra) -> dict:
    """A record as the runner builds it: both graders' verdicts from rpg_eval.graders.grade."""
    mv, pa = grade(response, gold, "math_verify"), grade(response, gold, "paper")
    sampling = {"backend": "hf", "n": 5, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 64}
    sampling.update(extra.pop("sampling", {}))
    return {"run": run, "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/x", "step": step,
            "benchmark": "aime24", "task": "rpg_aime24", "problem_id": pid, "problem_index": 0,
            "sample_index": j, "prompt_style": "boxed", "prompt_hash": None, "gold": gold,
            "response": response, "extracted": {"math_verify": mv.extracted, "paper": pa.extracted},
            "correct": {"math_verify": mv.correct, "paper": pa.correct}, "error_math_verify": mv.error,
            "seed": 0, "sampling": sampling, **extra}  # fmt: skip


NONE = "I could not finish."  # no answer: does not vote
# (step, problem) -> (gold, [(response, hand-written class of its answer or None)]); class "gold" = correct.
SAMPLES = {
    (1, "p1"): ("1/2", [("\\boxed{3}", "3"), ("\\boxed{0.5}", "gold"), ("\\boxed{3}", "3"),
                        ("\\boxed{\\frac{1}{2}}", "gold"), ("\\boxed{1/2}", "gold")]),
    (1, "p2"): ("7", [("\\boxed{7}", "gold"), (NONE, None), (NONE, None), ("\\boxed{7}", "gold"), (NONE, None)]),
    (1, "p3"): ("5", [("\\boxed{4}", "4"), ("\\boxed{5}", "gold"), ("\\boxed{4}", "4"), ("\\boxed{5.0}", "gold"),
                      (NONE, None)]),
    (2, "p1"): ("1/2", [("\\boxed{3}", "3"), ("\\boxed{3}", "3"), ("\\boxed{0.5}", "gold"), ("\\boxed{3}", "3"),
                        ("\\boxed{\\dfrac12}", "gold")]),
    (2, "p2"): ("7", [("\\boxed{7}", "gold"), ("\\boxed{8}", "8"), ("\\boxed{8}", "8"), ("\\boxed{7}", "gold"),
                      ("\\boxed{8}", "8")]),
    (2, "p3"): ("5", [("\\boxed{5}", "gold"), ("\\boxed{4}", "4"), ("\\boxed{5}", "gold"), ("\\boxed{5}", "gold"),
                      ("\\boxed{5}", "gold")])
}  # fmt: skip


def _hand_vote(labels: list[str | None]) -> bool:
    """Majority vote over the answered samples: the largest class wins, a tie goes to the class
    seen first; right when the winner is the gold's class; no answer at all: wrong."""
    counts = Counter(x for x in labels if x is not None)
    if not counts:
        return False
    first = {c: labels.index(c) for c in counts}
    winner = min(counts, key=lambda c: (-counts[c], first[c]))
    return winner == "gold"


def _write_records(path: Path) -> list[dict]:
    recs = [
        _record(step, pid, gold, j, resp)
        for (step, pid), (gold, samples) in SAMPLES.items()
        for j, (resp, _) in enumerate(samples)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs


def test_maj_at_k_is_the_vote_over_equivalent_answers_and_can_choose_best(tmp_path: Path) -> None:
    """maj@k of each checkpoint from the hand-labelled classes; mean@k is highest at step 2 (8/15 vs
    7/15), maj@k at step 1 (2/3 vs 1/3), and last_best.csv's two Best follow."""
    from rpg_eval.stats.summary import summarize

    recs = _write_records(tmp_path / "samples.jsonl")
    summarize([tmp_path / "samples.jsonl"], tmp_path, iters=50)
    rows = {(int(r["step"]), r["grader"]): r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    maj = {s: [_hand_vote([c for _, c in SAMPLES[(s, p)][1]]) for p in ("p1", "p2", "p3")] for s in (1, 2)}
    # step 1: p1 right only by equivalence (strings: "3" twice, each correct form once), p2 right
    # because unanswered samples do not vote, p3 a 2-2 tie won by the earlier class "4".
    assert maj[1] == [True, True, False]
    for step in (1, 2):
        mv = rows[(step, "math_verify")]
        assert float(mv["maj"]) == pytest.approx(sum(maj[step]) / 3), step
        assert float(mv["maj_ci_low"]) <= float(mv["maj"]) <= float(mv["maj_ci_high"])
    # The paper grader votes on its own normalized answers (none here: no "Answer:" lines).
    assert all(r["extracted"]["paper"] is None for r in recs) and float(rows[(1, "paper")]["maj"]) == 0.0
    head = next(csv.reader((tmp_path / "summary.csv").open()))
    assert head.index("maj") > head.index("pass@4")  # after the contract's columns
    (row,) = [r for r in csv.DictReader((tmp_path / "last_best.csv").open()) if r["grader"] == "math_verify"]
    mean = {
        s: sum(c == "gold" for p in ("p1", "p2", "p3") for _, c in SAMPLES[(s, p)][1]) / 15 for s in (1, 2)
    }
    assert (int(row["best_step"]), float(row["best"])) == (2, pytest.approx(mean[2])) and mean[2] > mean[1]
    assert (int(row["best_maj_step"]), float(row["best_maj"])) == (1, pytest.approx(2 / 3))
    assert float(row["last_maj"]) == pytest.approx(sum(maj[2]) / 3)


# --------------------------------------------------------------------------- item 4: one name, two runs


def test_summarize_refuses_two_runs_with_one_name_and_other_settings(tmp_path: Path, capsys) -> None:
    """`--limit 2 --max-tokens 8` and `--limit 10 --max-tokens 256` under one --run name were mixed
    in every row (a warning only), and A's summary.csv overwritten."""
    a, b = (
        write_run(tmp_path / d, "r", {(1, "p1"): [1] * 5}, max_tokens=t) for d, t in (("A", 8), ("B", 256))
    )
    (a / "summary.csv").write_text("made before\n")  # kept: nothing under tmp_path changes
    line = refuses(capsys, ["summarize", str(a), str(b)], str(b / "samples.jsonl"), tmp_path)
    assert "max_tokens" in line and "8" in line and "256" in line


def _unit(step: int, recorded_step: int, right: int) -> list[dict]:
    """Two problems x 2 samples of checkpoint ``final`` at ``recorded_step``, ``right`` of each right."""
    return [
        dict(_record(step, p, "5", j, "\\boxed{5}" if j < right else "\\boxed{4}", sampling={"n": 2}),
             checkpoint="final", step=recorded_step)
        for p in ("p1", "p2")
        for j in range(2)
    ]  # fmt: skip


def test_one_checkpoint_at_two_steps_is_refused_naming_both_places(tmp_path: Path, capsys) -> None:
    """A `final` checkpoint at step 2 in one pass and step 3 in the other (or one edited record), in
    one file or two: refused naming one record of each (before, the second pass's records were
    dropped as duplicates), and nothing is written."""
    first, second = _unit(2, 2, 1), _unit(2, 3, 2)
    for d, recs in (("pass1", first), ("pass2", second), ("both", first + second)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    both, a, b = (tmp_path / d / "samples.jsonl" for d in ("both", "pass1", "pass2"))
    out = ["--out", str(tmp_path / "sum")]
    said = f"{both}:5: run 'r', checkpoint 'final' is at step 3 here and at step 2 at {both}:1"
    refuses(capsys, ["summarize", str(both), *out], said, tmp_path)
    assert (
        refuses(capsys, ["summarize", str(a), str(b), *out], f"at step 2 at {a}:1", tmp_path).find(f"{b}:1:")
        >= 0
    )


# --------------------------------------------------------------------------- items 2, 3: score's --out


def test_score_refuses_to_write_into_a_run_dir(tmp_path: Path, capsys) -> None:
    """`rpg-eval score RUN/samples.jsonl --out RUN/scored.jsonl` put records that lack run/checkpoint/step
    beside a run's own (--out = an input: tests/test_io_ownership.py's file writers)."""
    run = tmp_path / "run"
    run.mkdir()
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}
    (run / "run.json").write_text(json.dumps(meta))
    _write_records(run / "samples.jsonl")
    scored = run / "scored.jsonl"
    refuses(capsys, ["score", str(run / "samples.jsonl"), "--out", str(scored)],
            f"--out {scored}: is inside the run directory", tmp_path)  # fmt: skip
