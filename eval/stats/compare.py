"""``rpg-eval compare A B``: two runs scored on the same problems, and whether they differ.

For every benchmark both runs were evaluated on, every score (mean@k, maj@k) and three points --
Last (each run's latest checkpoint), Best (each run's checkpoint with the highest score on these
same problems: the paper's Best, selected on the test problems) and the held-out Best (chosen on
the first half of each problem's samples, scored on the other half; ``heldout.py``) -- it reports
A - B with the exact sign-flip p-value and the 95% interval of shifts that test does not reject
(``paired.py``); "A higher" / "B higher" only where the test rejects at 5%.

The runs must be comparable: the same problems, the same gold answers and the same sampling
settings (prompt style, n, temperature, top-p, top-k, max tokens, backend), and, where both
directories hold a ``run.json``, the same grading options. Otherwise the command refuses with one
line naming the benchmark, what differs and both values.

Usage::

    rpg-eval compare A B [--grader math_verify] [--metric mean,maj] [--iters 2000] [--seed 0]
                         [--exclude-step0] [--out DIR]

A and B: run directories (holding samples.jsonl) or samples.jsonl files, one run each.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least, int_in, report_errors

from ..limits import MAX_ITERS
from .paired import PairedDifference, paired_difference
from .problems import GRADER_NAMES, CheckpointScores, RunScores, run_scores
from .scores import SCORES

POINTS = {"last": "Last", "best": "Best", "heldout": "held-out Best"}
COLUMNS = ("benchmark", "grader", "score", "point", "run_a", "run_b", "step_a", "step_b", "a", "b", "diff",
           "ci_low", "ci_high", "p_value", "p_exact", "n_problems", "differ")  # fmt: skip


class CompareError(ValueError):
    """Two runs that cannot be compared (the message names what differs and where)."""


def load_run(path: str | Path) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """(run name, records, grading options of its run.json or {}) of one input holding one run."""
    from .summary import load_records

    p = Path(path)
    records = load_records([p])
    if not records:
        raise CompareError(f"{p}: no records")
    runs = sorted({r["run"] for r in records})
    if len(runs) > 1:
        raise CompareError(
            f"{p}: holds several runs ({', '.join(runs)}); give the samples of one run on each side"
        )
    return runs[0], records, _grading(p if p.is_dir() else p.parent)


def _grading(directory: Path) -> dict[str, Any]:
    """The grading options a run directory's run.json records ({}: none, or an older format)."""
    from ..outdir import read_run_json

    try:
        data = read_run_json(directory)
    except ValueError:
        return {}
    keep = ("allow_fallback", "grader_version")
    return {} if data is None else {k: data["grading"][k] for k in keep if k in data["grading"]}


def check_comparable(a: RunScores, b: RunScores, name_a: str = "A", name_b: str = "B") -> None:
    """Refuse (CompareError) two runs of one benchmark whose problems, golds or settings differ."""
    where = f"{a.benchmark}: {name_a} ({a.run}) and {name_b} ({b.run})"
    only_a, only_b = sorted(set(a.golds) - set(b.golds)), sorted(set(b.golds) - set(a.golds))
    if only_a or only_b:
        pid, side = (only_a[0], name_a) if only_a else (only_b[0], name_b)
        raise CompareError(
            f"{where} were not scored on the same problems: problem {pid!r} is only in {side} "
            f"({len(only_a)} only in {name_a}, {len(only_b)} only in {name_b}); compare runs of one benchmark file"
        )
    for pid in sorted(a.golds):
        if a.golds[pid] != b.golds[pid]:
            raise CompareError(
                f"{where} have other golds: problem {pid!r} is {a.golds[pid]!r} in {name_a} and {b.golds[pid]!r} "
                f"in {name_b}; compare runs of one benchmark file"
            )
    for key in sorted(set(a.settings) | set(b.settings)):
        va, vb = a.settings.get(key), b.settings.get(key)
        if va != vb:
            raise CompareError(
                f"{where} were sampled differently: {key} {va!r} in {name_a} and {vb!r} in {name_b}; a "
                "difference would mix the methods with the settings"
            )


def _pair(
    a: RunScores, b: RunScores, point: str, exclude_step0: bool
) -> tuple[CheckpointScores, CheckpointScores, str]:
    """The two checkpoints compared at ``point`` and the part of their samples that scores them."""
    if point == "last":
        return a.last(), b.last(), "full"
    if point == "best":
        return a.best("full", exclude_step0), b.best("full", exclude_step0), "full"
    return a.best("sel", exclude_step0), b.best("sel", exclude_step0), "held"


def compare_point(
    a: RunScores, b: RunScores, point: str, iters: int = 2000, seed: int = 0, exclude_step0: bool = False
) -> tuple[CheckpointScores, CheckpointScores, PairedDifference]:
    """A - B at ``point`` ("last", "best", "heldout") on the same problems (``iters``: unused, the
    interval is the sign-flip test's own)."""
    ca, cb, part = _pair(a, b, point, exclude_step0)
    if ca.problem_ids != cb.problem_ids:
        missing = sorted(set(ca.problem_ids) ^ set(cb.problem_ids))
        raise CompareError(
            f"{a.benchmark}: {ca.checkpoint} of {a.run} and {cb.checkpoint} of {b.run} hold other complete "
            f"problems (e.g. {missing[0]!r}: an interrupted run?); finish both runs (rpg-eval run resumes)"
        )
    if ca.k != cb.k:
        raise CompareError(f"{a.benchmark}: {a.run} has {ca.k} samples per problem and {b.run} {cb.k}")
    den = ca.denominator(a.score, part)
    return ca, cb, paired_difference(ca.part(part), cb.part(part), den, seed=seed)


def compare(
    path_a: str | Path,
    path_b: str | Path,
    graders: Sequence[str] = ("math_verify",),
    metrics: Sequence[str] = tuple(SCORES),
    seed: int = 0,
    exclude_step0: bool = False,
) -> list[dict[str, Any]]:
    """Load two runs and compare them (see the module docstring): one row per (benchmark, grader,
    score, point) both runs have (see COLUMNS)."""
    run_a, records_a, grading_a = load_run(path_a)
    run_b, records_b, grading_b = load_run(path_b)
    for key in sorted(set(grading_a) & set(grading_b)):
        if grading_a[key] != grading_b[key]:
            raise CompareError(
                f"{path_a} and {path_b} were graded with other options: {key} {grading_a[key]!r} in A and "
                f"{grading_b[key]!r} in B (run.json); re-score one (rpg-eval score) or compare like with like"
            )
    scores_a = run_scores(records_a, graders=tuple(graders), scores=tuple(metrics), warn=False)
    scores_b = run_scores(records_b, graders=tuple(graders), scores=tuple(metrics), warn=False)
    benches_a, benches_b = sorted({k[1] for k in scores_a}), sorted({k[1] for k in scores_b})
    if not set(benches_a) & set(benches_b):
        raise CompareError(
            f"no benchmark in common: A has {', '.join(benches_a)}, B has {', '.join(benches_b)}"
        )
    rows = []
    for bench in sorted(set(benches_a) & set(benches_b)):
        for g in graders:
            for m in metrics:
                a, b = scores_a[(run_a, bench, g, m)], scores_b[(run_b, bench, g, m)]
                check_comparable(a, b)
                for point in POINTS:
                    if point == "heldout" and a.last().sel is None:
                        continue  # one sample per problem: no halves
                    ca, cb, d = compare_point(a, b, point, seed=seed, exclude_step0=exclude_step0)
                    part = "held" if point == "heldout" else "full"
                    rows.append({
                        "benchmark": bench, "grader": g, "score": m, "point": point, "run_a": a.run, "run_b": b.run,
                        "step_a": ca.step, "step_b": cb.step, "a": float(ca.part(part).mean()),
                        "b": float(cb.part(part).mean()), "diff": d.diff, "ci_low": d.ci_low, "ci_high": d.ci_high,
                        "p_value": d.p_value, "p_exact": d.exact, "n_problems": d.n_problems,
                        "differ": d.excludes_zero,
                    })  # fmt: skip
    return rows


def _signed(x: float, digits: int = 4) -> str:
    return f"{x:+.{digits}f}"


def to_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a Markdown table with a legend."""
    if not rows:
        return "(nothing to compare)\n"
    a, b = rows[0]["run_a"], rows[0]["run_b"]
    lines = [
        f"### {a} (A) against {b} (B)",
        "",
        "| benchmark | grader | score | at | A (step) | B (step) | A − B [95% interval] | p (sign-flip) | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = ("A higher" if r["diff"] > 0 else "B higher") if r["differ"] else "no difference shown"
        p = f"{r['p_value']:.3g}" + ("" if r["p_exact"] else " (MC)")
        lines.append(
            f"| {r['benchmark']} | {r['grader']} | {SCORES[r['score']].name} | {POINTS[r['point']]} "
            f"| {r['a']:.4f} ({r['step_a']}) | {r['b']:.4f} ({r['step_b']}) "
            f"| {_signed(r['diff'])} [{_signed(r['ci_low'], 3)}, {_signed(r['ci_high'], 3)}] | {p} | {verdict} |"
        )
    n = rows[0]["n_problems"]
    lines += [
        "",
        f"A − B over the same {n} problems: the mean of the per-problem differences. p: the exact two-sided "
        "sign-flip test (each problem's difference as likely negated); the interval: the shifts of A − B that "
        "test does not reject at 5%. Best: each run's checkpoint with the highest score on these same problems "
        "(selected on the test problems, as in the paper); held-out Best: chosen on the first half of each "
        "problem's samples, scored on the other half. A difference is shown only when p <= 0.05 (the interval "
        "then excludes 0).",
    ]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v) for k, v in r.items()}
        )
    return buf.getvalue()


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="rpg-eval compare", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="run A: a run directory or its samples.jsonl (one run)")
    p.add_argument("b", help="run B: a run directory or its samples.jsonl (one run)")
    p.add_argument(
        "--grader", default="math_verify", help="comma list of math_verify,paper (default math_verify)"
    )
    p.add_argument(
        "--metric", default=",".join(SCORES), help=f"comma list of {','.join(SCORES)} (default: both)"
    )
    p.add_argument(
        "--iters",
        type=int_in(1, MAX_ITERS),
        default=2000,
        help=f"accepted for scripts; unused (the interval is the sign-flip test's own), 1..{MAX_ITERS}",
    )
    p.add_argument(
        "--seed", type=int_at_least(0), default=0, help="seed of the Monte Carlo test (large runs)"
    )
    p.add_argument("--exclude-step0", action="store_true", help="leave step 0 out of Best and held-out Best")
    p.add_argument("--out", help="also write compare.md and compare.csv into this directory")
    return p


def _choices(text: str, known: Sequence[str], flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in known]
    if bad or not items:
        raise CompareError(f"{flag}: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(known)}")
    return items


OUTPUTS = ("compare.md", "compare.csv")


def _main(argv: list[str]) -> int:
    from ..outputs import COMPARE, check_claimable, claim, write_files

    a = build_parser().parse_args(argv)
    graders = _choices(a.grader, GRADER_NAMES, "--grader")
    metrics = _choices(a.metric, tuple(SCORES), "--metric")
    if a.out:  # a directory compare did not make or mark, or a FIFO, link or device at a name: refused now
        check_claimable(a.out, COMPARE, names=OUTPUTS)
    rows = compare(a.a, a.b, graders, metrics, a.seed, a.exclude_step0)
    text = to_markdown(rows)
    print(text, end="")
    if a.out:
        with claim(a.out, COMPARE, names=OUTPUTS) as out:
            write_files(out, dict(zip(OUTPUTS, (text, to_csv(rows)))))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpg-eval compare`` (one line and exit 2 on any failure)."""
    return report_errors("rpg-eval compare", _main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
