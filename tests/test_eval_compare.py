"""Paired differences of two runs (issue #41 item 1): the sign-flip p-value against an enumeration
of every sign pattern and binomial formulas, the interval (the inverted sign-flip test) against an
enumeration over shifts and the normal formula; one decision rule for "differ" (issue 50 item 1): the
test at 5%, with which the interval always agrees, its size (<= 5% without a true difference) and
power on simulated runs; ``rpg-eval compare`` / ``table --baseline`` end to end with their refusals.
``write_run`` is the record builder of the eval tests."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from rpg_eval.cli import main as cli_main
from rpg_eval.stats.paired import paired_difference, sign_flip_p
from rpg_eval.stats.simulate import differ_rate


def enumerated_p(m: list[int]) -> float:
    """P(|sum s_i m_i| >= |sum m_i|) over all 2^n sign patterns, counted one by one."""
    observed = abs(sum(m))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, m))) >= observed
        for signs in itertools.product((1, -1), repeat=len(m))
    )
    return hits / 2 ** len(m)


def _random_m(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(-8, 9, size=int(rng.integers(1, 13)))]


@pytest.mark.parametrize("m", [[0, 0, 0], [3], [1] * 10, *map(_random_m, range(12))])
def test_sign_flip_p_is_the_enumerated_distribution(m: list[int]) -> None:
    p, exact = sign_flip_p(m)
    assert exact and p == pytest.approx(enumerated_p(m), abs=1e-12), m


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


# --------------------------------------------------------------------------- the verdict


def binomial_p(pos: int, neg: int) -> float:
    """Two-sided sign test of pos:neg discordant problems (k = 1): 2 P(Binom(pos + neg, 1/2) >= max)."""
    n, top = pos + neg, max(pos, neg)
    return min(1.0, 2 * sum(math.comb(n, x) for x in range(top, n + 1)) / 2**n)


@pytest.mark.parametrize("n", [30, 40])
@pytest.mark.parametrize("pos,neg", [(4, 0), (5, 0), (7, 1), (9, 2), (11, 3), (6, 0), (10, 2), (12, 3)])
def test_discordant_cases_near_the_edge(n: int, pos: int, neg: int) -> None:
    """One sample per problem, A right and B wrong on ``pos`` problems, the reverse on ``neg``: p is
    the sign test's; the first five (p 0.125, 0.0625, 0.070, 0.065, 0.057) show no difference, and the
    interval holds 0 (a percentile bootstrap excluded it on all of them); the last three differ."""
    a, b = np.zeros(n), np.zeros(n)
    a[:pos] = 1.0
    b[pos : pos + neg] = 1.0
    d = paired_difference(a, b, 1)
    assert d.p_value == pytest.approx(binomial_p(pos, neg), rel=1e-12)
    assert d.diff == pytest.approx((pos - neg) / n)
    differ = d.p_value <= 0.05
    assert differ == ((pos, neg) in [(6, 0), (10, 2), (12, 3)])
    assert d.excludes_zero == differ and d.direction == int(differ) and (d.ci_low > 0) == differ
    assert d.ci_low <= 0 <= d.ci_high or differ


def test_the_interval_and_the_verdict_agree() -> None:
    """The interval excludes 0 exactly when p <= 0.05: random cases of several sizes, the 400-problem
    ones by Monte Carlo (past the exact bounds), so also where the two use different draws."""
    rng = np.random.default_rng(5)
    seen = set()
    for n in [5, 12, 30, 400] * 2 + [12, 30] * 8:
        k = int(rng.choice([1, 4, 8]))
        p = rng.beta(2, 2, n)
        a, b = rng.binomial(k, np.clip(p + rng.choice([0, 0.15]), 0, 1)) / k, rng.binomial(k, p) / k
        d = paired_difference(a, b, k)
        assert (d.ci_low > 0 or d.ci_high < 0) == (d.p_value <= 0.05), (n, k, d)
        assert d.ci_low <= d.diff <= d.ci_high
        seen.add(d.excludes_zero)
    assert seen == {True, False}


@pytest.mark.parametrize("n,k", [(30, 1), (30, 8), (40, 1), (40, 8)])
def test_without_a_true_difference_at_most_5_percent_differ(n: int, k: int) -> None:
    """800 pairs of runs with no true difference; the exact test's size is <= 5% (about 2.5-4.3% here,
    measured over 2000 pairs by ``python -m rpg_eval.stats.simulate``)."""
    rate = differ_rate(n, k, 0.0, 800, seed=n * 10 + k)
    assert rate <= 0.05, rate


def test_with_a_true_difference_the_verdict_finds_it() -> None:
    """Power: 40 problems x 8 samples, A 0.2 better on every problem: nearly every pair differs
    (so the rule is not "never differ"); 0.1 better: most do."""
    assert differ_rate(40, 8, 0.2, 100, seed=3) >= 0.95
    assert differ_rate(40, 8, 0.1, 200, seed=4) >= 0.6


# --------------------------------------------------------------------------- rpg-eval compare


def write_run(path: Path, run: str, right: dict[tuple, list[int]], gold: str = "5", **sampling) -> Path:
    """``path``/samples.jsonl of one run: ``right[(step, problem)]`` (benchmark "addition") or
    ``right[(benchmark, step, problem)]`` holds the verdicts of a problem's samples in order."""
    path.mkdir(parents=True)
    lines = []
    for key, oks in right.items():
        bench, step, pid = key if len(key) == 3 else ("addition", *key)
        for j, ok in enumerate(oks):
            lines.append({
                "run": run, "checkpoint": f"global_step{step}_hf", "checkpoint_path": "/c", "step": step,
                "benchmark": bench, "task": "t", "problem_id": pid, "problem_index": 0, "sample_index": j,
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


def test_compare_reports_the_paired_difference_and_its_tests_verdict(tmp_path: Path, capsys) -> None:
    a, b = write_run(tmp_path / "a", "rpg", A), write_run(tmp_path / "b", "grpo", B)
    assert cli_main(["compare", str(a), str(b), "--metric", "mean", "--out", str(tmp_path / "cmp")]) == 0
    shown = capsys.readouterr().out
    rows = {r["point"]: r for r in csv.DictReader((tmp_path / "cmp" / "compare.csv").open())}
    assert (
        set(rows) == {"last", "best", "heldout"} and rows["last"]["step_a"] == rows["last"]["step_b"] == "5"
    )
    d = [np.mean(A[(5, p)]) - np.mean(B[(5, p)]) for p in ("p0", "p1", "p2")]  # by hand: Last is step 5
    assert float(rows["last"]["diff"]) == pytest.approx(np.mean(d))
    assert float(rows["last"]["p_value"]) == pytest.approx(enumerated_p([round(4 * x) for x in d]))
    for r in rows.values():  # the verdict is the test's at 5%, and the interval holds 0 exactly then
        assert (r["differ"] == "True") == (float(r["p_value"]) <= 0.05) == (float(r["ci_low"]) > 0), r
    last = next(x for x in shown.splitlines() if "| Last |" in x)
    assert "| 0.25 |" in last and last.endswith("| no difference shown |"), last
    assert (tmp_path / "cmp" / "compare.md").read_text() == shown and shown.startswith(
        "### rpg (A) against grpo (B)"
    )


def snapshot(root: Path) -> dict[str, object]:
    """Everything under ``root``, links not followed: name -> link target, bytes, or the mode."""
    return {str(p.relative_to(root)): ("link", os.readlink(p)) if p.is_symlink() else
            p.read_bytes() if p.is_file() else p.stat().st_mode for p in root.rglob("*")}  # fmt: skip


def refuses(capsys: pytest.CaptureFixture[str], argv: list[str], said: str, root: Path, main=cli_main) -> str:
    """``main(argv)`` exits 2 with one line ``rpg-eval[ CMD]: error: ...`` that holds ``said`` (what is
    wrong and where), and nothing under ``root`` is made or changed; the line is returned."""
    capsys.readouterr()
    before = snapshot(root)
    rc = main(argv)
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip() and not x.startswith("[rpg-eval]")]
    assert rc == 2 and len(err) == 1 and re.match(r"rpg-eval( \w+)?: error: ", err[0]), (rc, err)
    assert said in err[0], err
    assert snapshot(root) == before
    return err[0]


def _graded(d: Path, fallback: bool) -> Path:
    meta = {"format": "rpg-eval run/2", "settings": {}, "grading": {"allow_fallback": fallback}, "data": {},
            "checkpoints": {}}  # fmt: skip
    (d / "run.json").write_text(json.dumps(meta))
    return d


def _both(a: Path, b: Path) -> list[Path]:
    (a.parent / "both.jsonl").write_text(
        (a / "samples.jsonl").read_text() + (b / "samples.jsonl").read_text()
    )
    return [a.parent / "both.jsonl", b]


AB = "addition: A (rpg) and B (grpo) "
# bad input -> (A and B from run A and the folder t, what the line says)
COMPARE_REFUSALS = {
    "other golds": (lambda a, t: [a, write_run(t, "grpo", B, gold="6")],
                    AB + "have other golds: problem 'p0' is '5' in A and '6' in B"),
    "other sampling": (lambda a, t: [a, write_run(t, "grpo", B, max_tokens=8)],
                       AB + "were sampled differently: sampling.max_tokens 5 in A and 8 in B"),
    "other problems": (lambda a, t: [a, write_run(t, "grpo", {**B, (0, "p9"): [0] * 4, (5, "p9"): [1] * 4})],
                       AB + "were not scored on the same problems: problem 'p9' is only in B"),
    "several runs in one": (lambda a, t: _both(a, write_run(t, "grpo", B)), "holds several runs (grpo, rpg)"),
    "no common benchmark": (lambda a, t: [a, write_run(t, "grpo", {("other", *k): v for k, v in B.items()})],
                            "no benchmark in common: A has addition, B has other"),
    "other grading": (lambda a, t: [_graded(a, False), _graded(write_run(t, "grpo", B), True)],
                      "graded with other options: allow_fallback False in A and True in B"),
}  # fmt: skip


@pytest.mark.parametrize("case", COMPARE_REFUSALS)
def test_compare_refuses_runs_that_are_not_comparable(tmp_path: Path, capsys, case: str) -> None:
    make, said = COMPARE_REFUSALS[case]
    runs = make(write_run(tmp_path / "a", "rpg", A), tmp_path / "b")
    refuses(capsys, ["compare", *map(str, runs), "--out", str(tmp_path / "cmp")], said, tmp_path)


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


def test_table_marks_the_cells_whose_paired_difference_to_the_baseline_excludes_zero(
    tmp_path: Path, capsys
) -> None:
    """12 problems x 4 samples, at Last: RPG one sample better than GRPO on 8 problems (it differs);
    "flat" one sample better on 4 (p = 2/16: no difference shown, although a percentile bootstrap of
    its differences, never below 0 and 0 only with none of the 4 drawn, (8/12)^12 < 2.5%, excludes 0)."""
    grpo = {(s, f"p{i:02d}"): [1] * (i % 4) + [0] * (4 - i % 4) for s in (0, 5) for i in range(12)}

    def better_on(problems: set[int]) -> dict:
        return {
            (s, p): ([1] + v[:-1]) if s == 5 and int(p[1:]) in problems else v for (s, p), v in grpo.items()
        }

    rpg, flat = better_on({i for i in range(12) if i % 3}), better_on({0, 1, 2, 4})
    dirs = [str(write_run(tmp_path / n, n, r)) for n, r in {"rpg": rpg, "flat": flat, "grpo": grpo}.items()]
    assert cli_main(["summarize", *dirs, "--out", str(tmp_path / "sum"), "--iters", "200"]) == 0
    (tmp_path / "layout.yaml").write_text(LAYOUT)
    args = ["table", "--layout", str(tmp_path / "layout.yaml"), "--runs", str(tmp_path / "sum" / "last_best.csv"),
            "--grader", "math_verify"]  # fmt: skip
    out = tmp_path / "t"
    assert (
        cli_main([*args, "--samples", *dirs, "--baseline", "grpo", "--formats", "md,csv", "--out", str(out)])
        == 0
    )
    rows = {r["run"]: r for r in csv.DictReader((out / "t.csv").open())}
    for name, right in (("rpg", rpg), ("flat", flat)):
        d = [np.mean(right[(5, f"p{i:02d}")]) - np.mean(grpo[(5, f"p{i:02d}")]) for i in range(12)]  # by hand
        assert float(rows[name]["last_diff"]) == pytest.approx(np.mean(d), abs=1e-5)  # written with 6 digits
        assert float(rows[name]["last_p"]) == pytest.approx(enumerated_p([round(4 * x) for x in d]), rel=1e-5)
    assert float(rows["rpg"]["last_diff_ci_low"]) > 0 and rows["rpg"]["baseline"] == "grpo"
    assert float(rows["flat"]["last_p"]) == 0.125 and float(rows["flat"]["last_diff_ci_low"]) <= 0
    assert rows["grpo"]["last_diff"] == ""
    md = (out / "t.md").read_text()
    rpg_line = next(x for x in md.splitlines() if x.startswith("| RPG"))
    assert rpg_line.count("▲") == 2 and "▲" not in next(x for x in md.splitlines() if x.startswith("| flat"))
    assert "RPG − GRPO, a+b: Last" in md and "(differ)" in md and "(no difference shown)" in md
    # a baseline without the runs' samples, a run whose samples are missing, or one scored otherwise
    other = str(write_run(tmp_path / "grpo8", "grpo", grpo, max_tokens=8))
    for extra, said in ((["--baseline", "grpo"], "needs the runs' samples"),
                        (["--samples", dirs[2], "--baseline", "grpo"], "no samples of run 'rpg'"),
                        (["--samples", *dirs[:2], other, "--baseline", "grpo"], "sampling.max_tokens 5 in RPG and 8 in GRPO")):  # fmt: skip
        refuses(capsys, [*args, *extra], said, tmp_path)
