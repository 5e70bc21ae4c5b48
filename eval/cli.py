"""rpg-eval: run | score | summarize | compare | table | plot | report (see docs/eval.md).

Every numeric option is checked when the command line is parsed; every failure is one line
``rpg-eval: error: ...`` and exit status 2 (``--debug`` or ``RPG_DEBUG=1``: the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import fields

from rpg_openrlhf.common.cliutil import OneLineParser, float_in, int_at_least, int_in, nonblank, report_errors

from .data import BENCHMARKS
from .limits import MAX_ITERS, MAX_N, MAX_TIMEOUT, MIN_TEMPERATURE
from .options import key_values
from .run.prompts import PROMPT_STYLES
from .stats.heldout import HELDOUT_BY

POSITIVE = int_at_least(1)
NON_NEGATIVE = int_at_least(0)


def _model_args(items: Sequence[str] | None) -> dict:
    out: dict = {}
    for k, v in key_values(items, "--model-arg").items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (subcommands run, score, summarize; table/plot are dispatched)."""
    p = OneLineParser(prog="rpg-eval", description=__doc__)
    # Taken off the command line (anywhere) before parsing, see cliutil.pop_debug; listed for --help.
    p.add_argument("--debug", action="store_true", help="print the traceback of a failure (also RPG_DEBUG=1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    _add_run(sub.add_parser("run", help="evaluate checkpoints through lm-eval (resumable)"))
    _add_score(sub.add_parser("score", help="re-score lm-eval sample logs or jsonl responses offline"))
    _add_summarize(sub.add_parser("summarize", help="summary.csv / last_best.csv from samples.jsonl"))
    sub.add_parser("compare", help="two runs on the same problems: paired differences (rpg_eval.stats.compare)",
                   add_help=False)  # fmt: skip
    sub.add_parser("table", help="paper-style tables (rpg_eval.report.tables)", add_help=False)
    sub.add_parser("plot", help="plots (rpg_eval.report.plots)", add_help=False)
    sub.add_parser("report", help="one self-contained HTML page (rpg_eval.report.page)", add_help=False)
    return p


def _add_run(r: argparse.ArgumentParser) -> None:
    r.add_argument("--checkpoints", required=True, help="checkpoint dir (or dir of them) or a glob")
    r.add_argument("--out", required=True, help="output dir: samples.jsonl, summary.csv, last_best.csv")
    r.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARKS),
        help="comma list of aime24,aime25,amc23 and/or custom names given a file with --data NAME=FILE",
    )
    r.add_argument(
        "--n", type=int_in(1, MAX_N), default=32, help=f"samples per problem, 1..{MAX_N} (paper: 32)"
    )
    r.add_argument("--backend", choices=("hf", "vllm"), default="vllm")
    r.add_argument(
        "--data-dir", help="dir with aime24.jsonl etc. or the paper's parquet files (default: hub)"
    )
    r.add_argument(
        "--data",
        action="append",
        metavar="BENCH=PATH",
        help="one benchmark's file (repeatable); any name with a file is a custom benchmark (id/problem/answer)",
    )
    r.add_argument("--limit", type=POSITIVE, help="first N problems of each benchmark")
    r.add_argument(
        "--max-tokens", type=POSITIVE, default=4096, help="max new tokens (paper: training response length)"
    )
    r.add_argument(
        "--temperature",
        type=float_in(0),
        default=1.0,
        help=f"0 or >= {MIN_TEMPERATURE:g}: smaller ones overflow the sampling probabilities (paper: 1.0)",
    )
    r.add_argument("--top-p", type=float_in(0, 1, low_open=True), default=1.0, help="in (0, 1] (paper: 1.0)")
    r.add_argument("--seed", type=NON_NEGATIVE, default=0)
    r.add_argument(
        "--prompt-style",
        choices=PROMPT_STYLES,
        default="boxed",
        help="boxed | dapo (under the chat template) | plain (problem text verbatim, no chat template)",
    )
    r.add_argument(
        "--grader", choices=("math_verify", "paper"), default="math_verify", help="headline grader"
    )
    r.add_argument("--run", type=nonblank, help="run name in the records (default: the checkpoints dir name)")
    r.add_argument(
        "--chunk", type=POSITIVE, default=8, help="problems per lm-eval call (records are saved per chunk)"
    )
    r.add_argument("--ray", action="store_true", help="one Ray task (one GPU) per checkpoint")
    r.add_argument(
        "--device", help="hf backend device: cpu, cuda or cuda:N (default cuda if available, else cpu)"
    )
    r.add_argument(
        "--final-step", type=NON_NEGATIVE, help="step of a checkpoint dir without a step in its name"
    )
    r.add_argument("--exclude-step0", action="store_true", help="leave step 0 out of Best")
    r.add_argument("--model-arg", action="append", metavar="KEY=VALUE", help="extra lm-eval model arg")
    r.add_argument("--no-summary", action="store_true")
    r.add_argument(
        "--allow-fallback",
        action="store_true",
        help="math-verify anchor-free fallback (bare-number answers; risky on real benchmarks)",
    )


def _add_score(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "samples", nargs="+", help="samples_*.jsonl of lm-eval, our samples.jsonl, or {response, gold} jsonl"
    )
    s.add_argument(
        "--out", help="write scored records (jsonl) here (not an input, not inside a run directory)"
    )
    s.add_argument("--allow-fallback", action="store_true", help="math-verify anchor-free fallback (risky)")
    s.add_argument(
        "--timeout",
        type=float_in(0, MAX_TIMEOUT, low_open=True),
        default=5,
        help=f"seconds of math-verify work per answer, in (0, {MAX_TIMEOUT:g}]",
    )


def _add_summarize(m: argparse.ArgumentParser) -> None:
    m.add_argument("samples", nargs="+", help="samples.jsonl files or run dirs")
    m.add_argument("--out", help="output dir (default: the first input's dir)")
    m.add_argument("--exclude-step0", action="store_true")
    m.add_argument(
        "--heldout-by",
        choices=HELDOUT_BY,
        default="samples",
        help="held-out Best: choose the checkpoint on the first half of each problem's samples and score it on "
        "the other half (samples), or choose it on the run's other benchmarks (benchmarks)",
    )
    m.add_argument("--seed", type=NON_NEGATIVE, default=0, help="bootstrap seed")
    m.add_argument(
        "--iters", type=int_in(1, MAX_ITERS), default=2000, help=f"bootstrap resamples, 1..{MAX_ITERS}"
    )
    m.add_argument(
        "--grader", choices=("math_verify", "paper"), default="math_verify", help="headline grader"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the rpg-eval console script: one line and exit 2 on any failure."""
    return report_errors("rpg-eval", _main, argv)


def _main(argv: list[str]) -> int:
    owned = {
        "compare": ".stats.compare",
        "table": ".report.tables",
        "plot": ".report.plots",
        "report": ".report.page",
    }
    if argv and argv[0] in owned:  # owned by other modules; they parse their own arguments
        return int(importlib.import_module(owned[argv[0]], __package__).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return {"run": _run, "score": _score, "summarize": _summarize}[args.cmd](args)


def _run(args: argparse.Namespace) -> int:
    from rpg_openrlhf.common.versions import check

    from .run.patches import CHECKED_VERSIONS

    for warning in check(CHECKED_VERSIONS, "rpg-eval"):  # before anything runs
        print(f"rpg-eval: {warning}", file=sys.stderr)
    from .run.runner import RunConfig, run

    same = {f.name for f in fields(RunConfig)} & vars(args).keys() - {"benchmarks"}  # flag = field
    cfg = RunConfig(
        **{k: getattr(args, k) for k in same},
        benchmarks=[b.strip() for b in args.benchmarks.split(",") if b.strip()],
        data_files=key_values(args.data, "--data", "NAME=FILE"),
        model_args=_model_args(args.model_arg),
        summarize=not args.no_summary,
    )
    res = run(cfg)
    print(f"[rpg-eval] {len(res['checkpoints'])} checkpoints, {res['written']} new records in {args.out}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from .stats.rescore import score

    res = score(args.samples, out=args.out, allow_fallback=args.allow_fallback, timeout=args.timeout)
    print(json.dumps(res, indent=1, ensure_ascii=False))
    return 0


def _summarize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .outputs import check_summary_dir, summary_dir
    from .stats.summary import load_records, print_headline, summary_tables, write_summary

    first = Path(args.samples[0])
    out = args.out or (first if first.is_dir() else first.parent)
    records = load_records(args.samples)
    check_summary_dir(out, args.samples)  # before the bootstrap; nothing changes on a refusal
    result = summary_tables(records, args.exclude_step0, args.seed, args.iters, args.heldout_by)
    with summary_dir(out, args.samples) as d:
        write_summary(d, result)
    print_headline(result, args.grader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
