"""pass@k, summary tables (Last / Best; the bootstrap's draws: test_eval_hostile_input), checkpoint
discovery, offline scoring."""

from __future__ import annotations

import csv
import json
import random
from math import comb
from pathlib import Path

import pytest
from rpg_eval.run.checkpoints import find_checkpoints, parse_step
from rpg_eval.run.runner import default_run_name
from rpg_eval.stats.metrics import ks_for, pass_at_k
from rpg_eval.stats.rescore import score
from rpg_eval.stats.summary import last_best_rows, summarize, summary_rows
from test_eval_compare import write_run


def test_pass_at_k_is_the_closed_form() -> None:
    for n, c in [(4, 0), (4, 1), (4, 4), (10, 3), (32, 5), (32, 31), (7, 2)]:
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
        assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    for bad in ((4, 5, 1), (4, 1, 5)):  # c > n, k > n
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    assert ks_for(32) == [1, 2, 4, 8, 16, 32] and ks_for(6) == [1, 2, 4, 6]


def _records(tmp_path: Path) -> list[dict]:
    """tmp_path/run/samples.jsonl: 3 checkpoints (step 0 the best) x 2 benchmarks x 5 problems x 4 samples."""
    rng = random.Random(0)
    right = {(b, step, f"{b}-{i}"): [int(rng.random() < p_ok) for _ in range(4)]
             for step, p_ok in ((0, 0.9), (10, 0.3), (20, 0.6)) for b in ("aime24", "amc23") for i in range(5)}  # fmt: skip
    run = write_run(tmp_path / "run", "r", right)
    return [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]


def test_summary_and_last_best_recomputed(tmp_path: Path) -> None:
    records = _records(tmp_path)
    res = summarize([tmp_path / "run"], tmp_path, iters=500)
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert len(rows) == 3 * 2 * 2
    # the columns of docs/contracts.md, written out by hand (maj@k after the contract's pass@k)
    held = ["_sel", "_held", "_held_ci_low", "_held_ci_high"]
    assert list(rows[0]) == ["run", "checkpoint", "step", "benchmark", "grader", "prompt_style", "n_problems",
                             "n_samples", "mean", "ci_low", "ci_high", *("mean" + x for x in held), "pass@1",
                             "pass@2", "pass@4", "maj", "maj_ci_low", "maj_ci_high", *("maj" + x for x in held)]  # fmt: skip
    means = {}
    for r in rows:
        sel = [x for x in records if (x["checkpoint"], x["benchmark"]) == (r["checkpoint"], r["benchmark"])]
        per = {}
        for x in sel:
            per.setdefault(x["problem_id"], []).append(x["correct"][r["grader"]])
        mean = sum(sum(v) / len(v) for v in per.values()) / len(per)
        assert float(r["mean"]) == pytest.approx(mean)
        assert float(r["pass@4"]) == pytest.approx(sum(any(v) for v in per.values()) / len(per))
        assert float(r["ci_low"]) <= mean <= float(r["ci_high"])
        means[(r["benchmark"], r["grader"], int(r["step"]))] = mean
    lb = list(csv.DictReader((tmp_path / "last_best.csv").open()))
    assert len(lb) == 4 and list(lb[0]) == [
        "run", "benchmark", "grader", "last", "last_step", "last_ci_low", "last_ci_high", "best", "best_step",
        "best_ci_low", "best_ci_high", "heldout_best", "heldout_best_step", "heldout_best_ci_low",
        "heldout_best_ci_high", "last_maj", "last_maj_ci_low", "last_maj_ci_high", "best_maj", "best_maj_step",
        "best_maj_ci_low", "best_maj_ci_high", "heldout_best_maj", "heldout_best_maj_step",
        "heldout_best_maj_ci_low", "heldout_best_maj_ci_high", "heldout_by"
    ]  # fmt: skip
    for r in lb:
        m = {s: v for (b, g, s), v in means.items() if (b, g) == (r["benchmark"], r["grader"])}
        assert int(r["last_step"]) == 20 and float(r["last"]) == pytest.approx(m[20])
        best_step = max(sorted(m), key=lambda s: (m[s], -s))
        assert int(r["best_step"]) == best_step and float(r["best"]) == pytest.approx(m[best_step])
    # Step 0 is the best here; excluding it picks among 10 and 20.
    ex = last_best_rows(res["summary"], exclude_step0=True)
    assert all(r["best_step"] in (10, 20) for r in ex)
    # Reproducible: same seed, same intervals.
    again = summary_rows(records, iters=500)
    assert [r["ci_low"] for r in again] == [float(r["ci_low"]) for r in rows]
    dis = res["disagreements"]
    assert dis["n_disagree"] == sum(x["correct"]["math_verify"] != x["correct"]["paper"] for x in records) > 0


def test_incomplete_problems_left_out(tmp_path: Path) -> None:
    records = [
        r for r in _records(tmp_path) if not (r["problem_id"] == "aime24-0" and r["sample_index"] == 3)
    ]
    rows = summary_rows(records, iters=100, warn=False)
    assert {r["n_problems"] for r in rows if r["benchmark"] == "aime24"} == {4}
    assert {r["n_problems"] for r in rows if r["benchmark"] == "amc23"} == {5}


def test_checkpoint_discovery(tmp_path: Path) -> None:
    for name in ("global_step10_hf", "global_step200_hf", "global_step30_hf", "final"):
        (tmp_path / "exp" / name).mkdir(parents=True)
        (tmp_path / "exp" / name / "config.json").write_text("{}")
    (tmp_path / "exp" / "logs").mkdir()
    cks = find_checkpoints(tmp_path / "exp")
    assert [(c.name, c.step) for c in cks] == [
        ("global_step10_hf", 10),
        ("global_step30_hf", 30),
        ("global_step200_hf", 200),
        ("final", 201),
    ]
    assert [c.step for c in find_checkpoints(str(tmp_path / "exp" / "global_step*_hf"))] == [10, 30, 200]
    assert find_checkpoints(tmp_path / "exp" / "final")[0].step == 0
    assert find_checkpoints(tmp_path / "exp", final_step=400)[-1].step == 400
    assert (
        parse_step("checkpoint-500") == 500 and parse_step("model_step_7") == 7 and parse_step("base") is None
    )
    with pytest.raises(FileNotFoundError):
        find_checkpoints(tmp_path / "exp" / "logs")
    assert default_run_name(str(tmp_path / "exp" / "global_step*_hf")) == "exp"
    assert default_run_name(str(tmp_path / "exp")) == "exp"


def test_score_offline(tmp_path: Path) -> None:
    lm_eval_log = {
        "doc_id": 0,
        "doc": {"id": "p1", "answer": "25"},
        "target": "25",
        "filtered_resps": [["so \\boxed{025}", "Answer: 25", "nothing", "Answer: 24"]],
    }
    plain = {"problem_id": "p2", "gold": "7", "response": "Answer: 7"}
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps(lm_eval_log) + "\n" + json.dumps(plain) + "\n")
    res = score([f], out=tmp_path / "scored.jsonl")
    assert res["n_samples"] == 5 and res["n_problems"] == 2
    assert res["mean_math_verify"] == pytest.approx((2 / 4 + 1) / 2)
    assert res["mean_paper"] == pytest.approx((1 / 4 + 1) / 2)
    assert res["disagreements"]["math_verify_only"] == 1
    scored = [json.loads(x) for x in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert scored[0]["extracted"] == {"math_verify": "025", "paper": None}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"response": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: no gold"):
        score([bad])
