"""rpg_eval.stats.summary: maj@k (issue #19 item 12), summaries that refuse to mix two runs under one
name (item 4), and the outputs of ``rpg-eval score`` (items 2 and 3).

maj@k is checked against a vote computed here from the records, with the answers' equivalence
classes written by hand (``\\frac12``, ``0.5`` and ``1/2`` are one answer), not by the module."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.graders import grade


def _error_line(err: str, prog: str = "rpg-eval") -> str:
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("[rpg-eval]")]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), err
    return lines[0]


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


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_maj_at_k_is_the_vote_over_equivalent_answers(tmp_path: Path) -> None:
    from rpg_eval.stats.summary import summarize

    recs = _write_records(tmp_path / "samples.jsonl")
    summarize([tmp_path / "samples.jsonl"], tmp_path, iters=50)
    rows = {(int(r["step"]), r["grader"]): r for r in _rows(tmp_path / "summary.csv")}
    for step in (1, 2):
        mv = rows[(step, "math_verify")]
        want = [_hand_vote([c for _, c in SAMPLES[(step, p)][1]]) for p in ("p1", "p2", "p3")]
        assert float(mv["maj"]) == pytest.approx(sum(want) / 3), (step, want)
        assert float(mv["maj_ci_low"]) <= float(mv["maj"]) <= float(mv["maj_ci_high"])
        # The paper grader votes on its own normalized answers (none here: no "Answer:" lines).
        paper = [
            [r["extracted"]["paper"] for r in recs if (r["step"], r["problem_id"]) == (step, p)]
            for p in ("p1", "p2", "p3")
        ]
        assert all(x is None for xs in paper for x in xs) and float(rows[(step, "paper")]["maj"]) == 0.0
    # step 1: p1 right only by equivalence (strings: "3" twice, each correct form once), p2 right
    # because unanswered samples do not vote, p3 a 2-2 tie won by the earlier class "4".
    assert [_hand_vote([c for _, c in SAMPLES[(1, p)][1]]) for p in ("p1", "p2", "p3")] == [True, True, False]
    head = next(csv.reader((tmp_path / "summary.csv").open()))
    assert head.index("maj") > head.index("pass@4")  # after the contract's columns


def test_best_can_be_chosen_by_maj_at_k(tmp_path: Path) -> None:
    """mean@k is highest at step 2 (8/15 vs 7/15), maj@k at step 1 (2/3 vs 1/3): computed here
    from the hand-labelled classes, then compared with last_best.csv."""
    from rpg_eval.stats.summary import summarize

    _write_records(tmp_path / "samples.jsonl")
    summarize([tmp_path / "samples.jsonl"], tmp_path, iters=50)
    (row,) = [r for r in _rows(tmp_path / "last_best.csv") if r["grader"] == "math_verify"]
    mean = {
        s: sum(c == "gold" for p in ("p1", "p2", "p3") for _, c in SAMPLES[(s, p)][1]) / 15 for s in (1, 2)
    }
    maj = {
        s: sum(_hand_vote([c for _, c in SAMPLES[(s, p)][1]]) for p in ("p1", "p2", "p3")) / 3 for s in (1, 2)
    }
    best_mean = max((1, 2), key=lambda s: (mean[s], -s))
    best_maj = max((1, 2), key=lambda s: (maj[s], -s))
    assert int(row["best_step"]) == best_mean and float(row["best"]) == pytest.approx(mean[best_mean])
    assert int(row["best_maj_step"]) == best_maj and float(row["best_maj"]) == pytest.approx(maj[best_maj])
    assert float(row["last_maj"]) == pytest.approx(maj[2])
    assert best_mean != best_maj  # the example is built so that the two choices differ


# --------------------------------------------------------------------------- item 4: one name, two runs


def _run_dir(root: Path, name: str, max_tokens: int) -> Path:
    d = root / name
    d.mkdir()
    recs = [
        _record(1, p, "7", j, "\\boxed{7}", sampling={"max_tokens": max_tokens})
        for p in ("p1", "p2")
        for j in range(5)
    ]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.csv").write_text("made before\n")
    return d


def test_summarize_refuses_two_runs_with_one_name_and_other_settings(tmp_path: Path, capsys) -> None:
    """`--limit 2 --max-tokens 8` and `--limit 10 --max-tokens 256` under one --run name were mixed
    in every row (a warning only), and A's summary.csv overwritten."""
    a, b = _run_dir(tmp_path, "A", 8), _run_dir(tmp_path, "B", 256)
    assert cli_main(["summarize", str(a), str(b)]) == 2
    line = _error_line(capsys.readouterr().err)
    assert "max_tokens" in line and "8" in line and "256" in line and str(b / "samples.jsonl") in line
    assert (a / "summary.csv").read_text() == "made before\n"


# --------------------------------------------------------------------------- items 2, 3: score's output


def test_score_refuses_to_overwrite_its_input_or_a_run_dir(tmp_path: Path, capsys) -> None:
    """`rpg-eval score RUN/samples.jsonl --out RUN/samples.jsonl` replaced a run's records with
    scored records that lack run/checkpoint/step."""
    run = tmp_path / "run"
    run.mkdir()
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {}, "data": {}, "checkpoints": {}}
    (run / "run.json").write_text(json.dumps(meta))
    samples = run / "samples.jsonl"
    _write_records(samples)
    before = samples.read_bytes()
    for out in (samples, run / "scored.jsonl"):
        assert cli_main(["score", str(samples), "--out", str(out)]) == 2
        line = _error_line(capsys.readouterr().err)
        assert "--out" in line and str(out) in line
    assert samples.read_bytes() == before and not (run / "scored.jsonl").exists()
