"""``python -m rpg_openrlhf.nodecheck [--gpus N|all] [--out DIR] [--seq-len N] [--steps N]``, or
``--report DIR`` to read an earlier check's directory again. Exit 0 when every check passes, 1 when one
fails, 2 on bad arguments or an unreadable ``--report`` directory (one ``rpg-nodecheck: error: ...``
line; ``--debug`` for the traceback)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rpg_openrlhf.common.atomic import output_dir
from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least, report_errors
from rpg_openrlhf.nodecheck.measure import Check

PROG = "rpg-nodecheck"
DESCRIPTION = (
    "The first command on a GPU node: the node's CUDA prerequisites, then a tiny RPG run in the 8K configs' "
    "shape (packed dynamic micro-batches, ZeRO-2, both sleeps) on N GPUs or all of them checks NCCL weight "
    "sync, flash-attention, bf16 engines against the actor, gradient accumulation across micro-batches and "
    "sleep mode, one line per check. Exit 0 when every check passes, "
    "1 when one fails, 2 on bad arguments; --report DIR reads an earlier check's directory again."
)


def gpus_arg(text: str) -> int | str:
    """``--gpus``: a count >= 1, or "all" (every visible GPU, counted once CUDA is checked)."""
    return "all" if text == "all" else int_at_least(1)(text)


def resolve_gpus(gpus: int | str) -> int:
    """ "all" -> the visible GPUs (at least 1: the environment line then names what is missing)."""
    if gpus != "all":
        return int(gpus)
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--gpus", type=gpus_arg, default=1, metavar="N|all",
                   help="GPUs the run uses (actor ranks = engines; NCCL across all of them); all: every visible GPU")  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=Path("runs/gpu-check"), help="where the run and report.json go"
    )
    p.add_argument("--seq-len", type=int_at_least(1), default=8192,
                   help="length of the long sequence of the engine-vs-actor check (and of the flash-attn check)")  # fmt: skip
    p.add_argument(
        "--steps", type=int_at_least(1), default=3, help="RL steps of the run (weight syncs = steps)"
    )
    p.add_argument("--timeout", type=int_at_least(1), default=1200, help="seconds before the run is killed")
    p.add_argument(
        "--report", type=Path, metavar="DIR", help="print the checks of an earlier run's DIR; run nothing"
    )
    return p


def _print(checks: list[Check]) -> int:
    for check in checks:
        print(check.line(), flush=True)
    failed = [c.name for c in checks if not c.ok]
    print(
        f"{len(checks) - len(failed)} passed, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def run_checks(args: argparse.Namespace) -> list[Check]:
    """Environment first (the rest needs it), then flash-attn, then the pipeline and what it measured."""
    from rpg_openrlhf.nodecheck import environment, measure, pipeline

    args.gpus = resolve_gpus(args.gpus)
    checks = [environment.check_environment(args.gpus)]
    if not checks[0].ok:  # nothing else can run
        return checks
    checks.append(environment.check_flash_attention(args.seq_len))
    print(
        f"[nodecheck] rpg-train on {args.gpus} GPU(s), {args.steps} steps; log: {args.out / 'log.txt'}",
        flush=True,
    )
    pipeline.run(args.out, args.gpus, args.seq_len, args.steps, args.timeout)
    checks += measure.analyse(args.out)
    measure.write(checks, args.out)
    return checks


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.report is not None:
        if not (args.report / "run.json").is_file():
            raise ValueError(f"--report {args.report}: no run.json there (not a node check's directory)")
        from rpg_openrlhf.nodecheck import measure

        return _print(measure.analyse(args.report))
    with output_dir(args.out, PROG):  # a file, a link or a folder it did not make: refused now
        return _print(run_checks(args))


def main(argv: Sequence[str] | None = None) -> None:
    """Every failure is one line ``rpg-nodecheck: error: ...``, exit 2."""
    sys.exit(report_errors(PROG, _main, argv))
