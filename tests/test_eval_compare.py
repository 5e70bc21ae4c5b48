"""Paired differences of two runs (issue #41 item 1): the sign-flip p-value against an enumeration
of every sign pattern and a binomial formula, the interval (the inverted sign-flip test) against the
normal formula and an enumeration over shifts, a case where the runs' own intervals overlap yet the
paired one excludes 0 and the reverse, and ``rpg-eval compare`` end to end with its refusals."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.stats.metrics import bootstrap_ci
from rpg_eval.stats.paired import paired_difference, sign_flip_p


def enumerated_p(m: list[int]) -> float:
    """P(|sum s_i m_i| >= |sum m_i|) over all 2^n sign patterns, counted one by one."""
    observed = abs(sum(m))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, m))) >= observed
        for signs in itertools.product((1, -1), repeat=len(m))
    )
    return hits / 2 ** len(m)


@pytest.mark.parametrize("seed", range(12))
def test_sign_flip_p_is_the_enumerated_distribution(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = [int(x) for x in rng.integers(-8, 9, size=int(rng.integers(1, 13)))]
    p, exact = sign_flip_p(m)
    assert exact and p == pytest.approx(enumerated_p(m), abs=1e-12), m


def test_sign_flip_p_edge_cases() -> None:
    assert sign_flip_p([0, 0, 0]) == (1.0, True)  # no difference anywhere
    assert sign_flip_p([3])[0] == 1.0  # one problem: both signs are as extreme
    assert sign_flip_p([1] * 10)[0] == pytest.approx(2 / 2**10)  # all ten the same way: 2 of 1024 patterns


def test_paired_interval_is_the_normal_formula_on_many_problems() -> None:
    """For many problems the sign-flip statistic at shift delta is close to normal with variance
    (1/n^2) sum (d_i - delta)^2, so the shifts it does not reject are about D +- 1.96 se with the
    plug-in se of a mean (Monte Carlo here: 400 problems are past the exact bound)."""
    rng = np.random.default_rng(1)
    n, k = 400, 16
    a = rng.binomial(k, rng.uniform(0.2, 0.9, n)) / k
    b = np.clip(a + rng.integers(-3, 3, n) / k, 0, 1)
    d = paired_difference(a, b, k, seed=0)
    se = math.sqrt(np.mean((a - b - np.mean(a - b)) ** 2) / n)
    assert d.diff == pytest.approx(np.mean(a - b))
    assert d.ci_low == pytest.approx(d.diff - 1.96 * se, abs=0.1 * se)
    assert d.ci_high == pytest.approx(d.diff + 1.96 * se, abs=0.1 * se)


@pytest.mark.parametrize("seed", range(3))
def test_paired_interval_is_the_enumerated_test_inverted(seed: int) -> None:
    """The interval's ends against the shifts an enumeration of all 2^n sign patterns of
    d_i - delta does not reject (p > 0.05), on a grid of shifts of step 1/4000."""
    rng = np.random.default_rng(seed)
    n, k = 9, 4
    a, b = rng.binomial(k, 0.7, n) / k, rng.binomial(k, 0.3, n) / k
    d = paired_difference(a, b, k)
    signs = np.array(list(itertools.product((1, -1), repeat=n)))
    grid = np.arange(-4000, 4001) / 4000
    x = (a - b)[None, :] - grid[:, None]  # [shift, problem]
    p = (np.abs(x @ signs.T) >= np.abs(x.sum(1))[:, None] - 1e-12).mean(1)
    accepted = grid[p > 0.05]
    assert d.ci_low == pytest.approx(accepted.min(), abs=1 / 4000)
    assert d.ci_high == pytest.approx(accepted.max(), abs=1 / 4000)


def _unpaired_difference_interval(a: np.ndarray, b: np.ndarray, iters: int = 20000) -> tuple[float, float]:
    """The interval of mean(a) - mean(b) if the runs had been scored on independent problem draws."""
    rng = np.random.default_rng(7)
    diffs = a[rng.integers(0, a.size, (iters, a.size))].mean(1) - b[
        rng.integers(0, b.size, (iters, b.size))
    ].mean(1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return float(lo), float(hi)


def test_overlapping_intervals_yet_the_paired_one_excludes_zero() -> None:
    """Problems of every difficulty, A one sample better than B on 15 of 40: each run's own interval
    is wide (problem difficulty) and they overlap; the paired differences are 0 or +1/8 and their
    interval excludes 0. The p-value: 2 of the 2^15 sign patterns of the 15 nonzero differences."""
    k = 8
    b = np.array([c / k for c in [0, 1, 2, 3, 4, 5, 6, 7] * 5])
    a = b.copy()
    a[:15] += 1 / k
    lo_a, hi_a = bootstrap_ci(a, iters=20000, seed=0)
    lo_b, hi_b = bootstrap_ci(b, iters=20000, seed=0)
    assert lo_a < hi_b and lo_b < hi_a  # the runs' own intervals overlap
    d = paired_difference(a, b, k, seed=0)
    assert d.ci_low > 0 and d.excludes_zero and d.direction == 1
    assert d.p_value == pytest.approx(enumerated_p([1] * 15)) == pytest.approx(2 / 2**15)


def test_an_unpaired_difference_excludes_zero_yet_the_paired_one_does_not() -> None:
    """The reverse: A solves what B misses and the other way round (negatively correlated problems),
    mean difference 0.2 over 40 problems. Scored as if on independent problems the difference's
    interval excludes 0; paired (the same problems), the differences +1.0 and -0.6 vary so much that
    it holds 0, and the sign-flip p is well above 0.05: with m = 10 d (k = 10), X and Y independent
    Binomial(20, 1/2), sum s_i m_i = 10 (2X - 20) + 6 (2Y - 20), so p = P(|10(2X-20) + 6(2Y-20)| >= 80)."""
    k = 10
    a = np.array([1.0, 0.2] * 20)
    b = np.array([0.0, 0.8] * 20)
    lo, hi = _unpaired_difference_interval(a, b)
    assert lo > 0  # unpaired: "a difference"
    d = paired_difference(a, b, k, seed=0)
    assert d.diff == pytest.approx(0.2) and d.ci_low < 0 < d.ci_high and not d.excludes_zero
    formula = sum(
        math.comb(20, x) * math.comb(20, y) / 2**40
        for x in range(21)
        for y in range(21)
        if abs(10 * (2 * x - 20) + 6 * (2 * y - 20)) >= 80
    )
    assert d.p_value == pytest.approx(formula, rel=1e-9) and d.p_value > 0.05


# --------------------------------------------------------------------------- rpg-eval compare


def write_run(
    path: Path, run: str, right: dict[tuple[int, str], list[int]], gold: str = "5", **sampling
) -> Path:
    path.mkdir(parents=True)
    lines = []
    for (step, pid), oks in right.items():
        for j, ok in enumerate(oks):
            lines.append({
                "run": run, "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c", "step": step,
                "benchmark": "addition", "task": "t", "problem_id": pid, "problem_index": 0, "sample_index": j,
                "prompt_style": "plain", "prompt_hash": "0" * 64, "gold": gold, "response": "5" if ok else "7",
                "extracted": {"math_verify": "5" if ok else "7", "paper": None},
                "correct": {"math_verify": bool(ok), "paper": False}, "error_math_verify": None, "seed": 0,
                "sampling": {"backend": "hf", "max_tokens": 5, "n": 4, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                             **sampling}
            })  # fmt: skip
    (path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


A = {(0, "p0"): [1, 0, 0, 0], (0, "p1"): [0, 0, 0, 0], (0, "p2"): [1, 1, 0, 0],
     (5, "p0"): [1, 1, 1, 1], (5, "p1"): [1, 1, 0, 1], (5, "p2"): [1, 1, 1, 0]}  # fmt: skip
B = {(0, "p0"): [1, 0, 0, 0], (0, "p1"): [0, 0, 0, 0], (0, "p2"): [1, 1, 0, 0],
     (5, "p0"): [1, 0, 1, 0], (5, "p1"): [0, 0, 0, 1], (5, "p2"): [1, 1, 0, 0]}  # fmt: skip


def test_compare_reports_the_paired_difference_at_last(tmp_path: Path, capsys) -> None:
    a, b = write_run(tmp_path / "a", "rpg", A), write_run(tmp_path / "b", "grpo", B)
    assert cli_main(["compare", str(a), str(b), "--metric", "mean", "--out", str(tmp_path / "cmp")]) == 0
    assert "rpg (A) against grpo (B)" in capsys.readouterr().out
    rows = {r["point"]: r for r in csv.DictReader((tmp_path / "cmp" / "compare.csv").open())}
    d = [np.mean(A[(5, p)]) - np.mean(B[(5, p)]) for p in ("p0", "p1", "p2")]  # by hand: Last is step 5
    assert float(rows["last"]["diff"]) == pytest.approx(np.mean(d))
    assert float(rows["last"]["p_value"]) == pytest.approx(enumerated_p([round(4 * x) for x in d]))
    assert rows["last"]["step_a"] == rows["last"]["step_b"] == "5" and set(rows) == {
        "last",
        "best",
        "heldout",
    }
    assert (tmp_path / "cmp" / "compare.md").read_text().startswith("### rpg (A) against grpo (B)")


@pytest.mark.parametrize(
    "b_kwargs,message",
    [({"gold": "6"}, "have other golds: problem 'p0' is '5' in A and '6' in B"),
     ({"max_tokens": 8}, "sampled differently: sampling.max_tokens 5 in A and 8 in B"),
     ({"right": {**B, (0, "p9"): [0] * 4, (5, "p9"): [1] * 4}}, "not scored on the same problems: problem 'p9' is only in B")]
)  # fmt: skip
def test_compare_refuses_runs_of_other_problems_golds_or_settings(
    tmp_path: Path, capsys, b_kwargs: dict, message: str
) -> None:
    a = write_run(tmp_path / "a", "rpg", A)
    right = b_kwargs.pop("right", B)
    b = write_run(tmp_path / "b", "grpo", right, **b_kwargs)
    assert cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpg-eval compare: error: addition: A (rpg) and B (grpo)"), err
    assert message in err[0] and not (tmp_path / "cmp").exists()


def test_compare_refuses_an_input_of_several_runs(tmp_path: Path, capsys) -> None:
    a, b = write_run(tmp_path / "a", "rpg", A), write_run(tmp_path / "b", "grpo", B)
    both = tmp_path / "both.jsonl"
    both.write_text((a / "samples.jsonl").read_text() + (b / "samples.jsonl").read_text())
    assert cli_main(["compare", str(both), str(b)]) == 2
    assert "holds several runs (grpo, rpg)" in capsys.readouterr().err


# --------------------------------------------------------------------------- rpg-eval table --baseline

LAYOUT = """
benchmarks: {addition: "a+b"}
tables:
  t:
    title: "runs"
    paper_table: null
    benchmarks: [addition]
    rows:
      - {run: rpg, label: "RPG"}
      - {run: flat, label: "flat"}
      - {run: grpo, label: "GRPO"}
"""


def _summarized(tmp_path: Path, runs: dict[str, dict]) -> tuple[list[str], Path]:
    dirs = [str(write_run(tmp_path / name, name, right)) for name, right in runs.items()]
    assert cli_main(["summarize", *dirs, "--out", str(tmp_path / "sum"), "--iters", "200"]) == 0
    return dirs, tmp_path / "sum" / "last_best.csv"


def test_table_marks_the_cells_whose_paired_difference_to_the_baseline_excludes_zero(
    tmp_path: Path, capsys
) -> None:
    # 12 problems, 4 samples: RPG one sample better than GRPO on 8 problems at Last; "flat" equal to GRPO
    grpo = {(s, f"p{i:02d}"): [1] * (i % 4) + [0] * (4 - i % 4) for s in (0, 5) for i in range(12)}
    rpg = {(s, p): ([1] + v[:-1]) if s == 5 and int(p[1:]) % 3 else v for (s, p), v in grpo.items()}
    dirs, last_best = _summarized(tmp_path, {"rpg": rpg, "flat": grpo, "grpo": grpo})
    (tmp_path / "layout.yaml").write_text(LAYOUT)
    args = [
        "table",
        "--layout",
        str(tmp_path / "layout.yaml"),
        "--runs",
        str(last_best),
        "--grader",
        "math_verify",
    ]
    capsys.readouterr()
    out = tmp_path / "t"
    assert (
        cli_main([*args, "--samples", *dirs, "--baseline", "grpo", "--formats", "md,csv", "--out", str(out)])
        == 0
    )
    rows = {r["run"]: r for r in csv.DictReader((out / "t.csv").open())}
    d = [np.mean(rpg[(5, f"p{i:02d}")]) - np.mean(grpo[(5, f"p{i:02d}")]) for i in range(12)]  # by hand
    assert float(rows["rpg"]["last_diff"]) == pytest.approx(np.mean(d), abs=1e-5)  # written with 6 digits
    assert float(rows["rpg"]["last_p"]) == pytest.approx(enumerated_p([round(4 * x) for x in d]), rel=1e-5)
    assert float(rows["rpg"]["last_diff_ci_low"]) > 0 and rows["rpg"]["baseline"] == "grpo"
    assert float(rows["flat"]["last_diff"]) == 0.0 and rows["grpo"]["last_diff"] == ""
    md = (out / "t.md").read_text()
    rpg_line = next(x for x in md.splitlines() if x.startswith("| RPG"))
    assert rpg_line.count("▲") == 2 and "▲" not in next(x for x in md.splitlines() if x.startswith("| flat"))
    assert f"RPG − GRPO, a+b: Last {np.mean(d):+.4f}" in md and "(differ)" in md and "flat − GRPO" in md
    # a baseline without the runs' samples, or a run whose samples are missing, is one line
    assert cli_main([*args, "--baseline", "grpo"]) == 2
    assert "needs the runs' samples" in capsys.readouterr().err
    assert cli_main([*args, "--samples", dirs[2], "--baseline", "grpo"]) == 2
    assert "no samples of run 'rpg'" in capsys.readouterr().err


def test_table_refuses_a_baseline_scored_on_other_settings(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "rpg", "rpg", A)
    b = write_run(tmp_path / "grpo", "grpo", B, max_tokens=8)
    assert cli_main(["summarize", str(a), str(b), "--out", str(tmp_path / "sum"), "--iters", "100"]) == 0
    layout = tmp_path / "layout.yaml"
    layout.write_text(LAYOUT.replace('      - {run: flat, label: "flat"}\n', ""))
    rc = cli_main(["table", "--layout", str(layout), "--runs", str(tmp_path / "sum" / "last_best.csv"), "--grader",
                   "math_verify", "--samples", str(a), str(b), "--baseline", "grpo"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sampling.max_tokens 5 in RPG and 8 in GRPO" in err[0], err
