"""``rpg-demo``: the whole RPG story on a CPU in a few minutes (``make demo``).

One command builds a tiny model, teaches it two-number addition briefly, RL-trains it with
RPG-REINFORCE-URKL (RPG-Style Clip, pi_ref = pi_old) and with GRPO through ``rpg-train`` on the
CPU backend, evaluates the saved checkpoints on held-out problems and writes a Last/Best table,
training plots and a README into ``--out``::

    rpg-demo                             # full demo into runs/demo (ignored by git; make demo)
    rpg-demo --out results/demo          # regenerate the committed copy (make results)
    rpg-demo --quick --out /tmp/demo     # same code path, fewer steps (CI)

Stages: (1) a tiny Qwen2-shaped model with a 17-symbol tokenizer; (2) a supervised warm-up with
OpenRLHF's own SFT trainer (``"a+b="`` -> ``"c"``), stopped early so RL has room to show a rise;
(3) ``rpg-train`` on the CPU backend twice, RPG-REINFORCE-URKL and GRPO, with an exact-answer reward;
(4) ``rpg-eval run`` over the SFT model (step 0) and every checkpoint on held-out problems, then
``summarize``; (5) ``rpg-eval table``, ``plot`` and ``report``, and ``README.md``. Each job has a
module: ``config``, ``processes``, ``training``, ``evaluate``, ``report``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rpg_openrlhf.common.atomic import output_dir, write_file

from .config import BENCHMARK, METHODS, DemoConfig, make_problems, write_jsonl
from .evaluate import checkpoints_of, eval_argv, eval_checkpoints, read_csv
from .processes import child_env, run_logged
from .report import COMMITTED_OUT, DEFAULT_OUT, reward_summary, short_arg, write_layout, write_readme
from .training import _step_printer, copy_tokenizer, parse_steps, pick_warmup, rl_argv, sft_argv


@dataclass
class _Stages:
    """Where a demo run writes (out, its work/ and logs/), the children's environment, and the
    wall time of each stage (printed as it starts, recorded as it ends)."""

    out: Path
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)
    t_all: float = field(default_factory=time.time)

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @contextlib.contextmanager
    def stage(self, key: str, message: str | None) -> Iterator[None]:
        t = time.time()
        if message:
            print(f"[rpg-demo] {time.time() - self.t_all:6.0f}s  {message}", flush=True)
        yield
        self.timings[key] = time.time() - t


CLI = [sys.executable, "-m", "rpg_eval.cli"]
#: The method the others are compared with, problem by problem (the table's marks, the README).
BASELINE = "grpo"


def run_demo(out: Path, cfg: DemoConfig, quick: bool = False) -> dict[str, Any]:
    """Run every stage; returns the numbers written to ``<out>/summary.json``."""
    out = out.resolve()
    for d in ("work", "logs", "eval", "plots", "runs", "tensorboard"):
        shutil.rmtree(out / d, ignore_errors=True)
    (out / "work").mkdir(parents=True, exist_ok=True)
    s = _Stages(out, child_env())
    base, train_rows, rl_rows = _model_and_data(s, cfg)
    sft, sft_step, probed = _sft_warmup(s, cfg, base, train_rows, rl_rows)
    runs = _rl_runs(s, cfg, sft)
    eval_commands, sft_accuracy = _evaluate(s, cfg, sft, runs)
    comparison = _table_and_plots(s, cfg)
    report = _report(s, cfg)
    s.timings["total"] = time.time() - s.t_all
    result = {
        "quick": quick,
        "config": asdict(cfg),
        "sft_accuracy": sft_accuracy,
        "sft_step": sft_step,
        "sft_probe": probed,
        "eval_commands": [" ".join(short_arg(a, out) for a in argv) for argv in eval_commands],
        "runs": runs,
        "comparison": comparison,
        "report": report,
        "timings": s.timings,
    }
    write_file(out / "summary.json", json.dumps(result, indent=1))
    write_readme(out, result, cfg, quick)
    return result


def _model_and_data(s: _Stages, cfg: DemoConfig) -> tuple[Path, list[dict], list[dict]]:
    """1. The tiny model and the SFT / RL / held-out data (work/data/*.jsonl)."""
    from rpg_openrlhf.tinymodel import ARITHMETIC_ALPHABET, build_tiny_model

    work = s.work
    with s.stage("model + data", "building the tiny model and the data"):
        base = build_tiny_model(
            work / "base", alphabet=ARITHMETIC_ALPHABET, hidden=128, layers=2, heads=4, kv_heads=2,
            intermediate=256, seed=cfg.seed, chat_template=False,
        )  # fmt: skip
        train_rows, heldout = make_problems(cfg.seed, cfg.heldout)
        write_jsonl(
            work / "data" / "sft.jsonl", [{"input": r["input"], "output": r["output"]} for r in train_rows]
        )
        rl_rows = list(train_rows)
        random.Random(cfg.seed + 1).shuffle(rl_rows)
        write_jsonl(work / "data" / "rl.jsonl", [{"input": r["input"], "label": r["label"]} for r in rl_rows])
        write_jsonl(
            work / "data" / "heldout.jsonl",
            [{"id": r["id"], "problem": r["input"], "answer": r["label"]} for r in heldout],
        )
    return base, train_rows, rl_rows


def _sft_warmup(
    s: _Stages, cfg: DemoConfig, base: Path, train_rows: list[dict], rl_rows: list[dict]
) -> tuple[Path, int, Any]:
    """2. SFT warm-up with OpenRLHF's SFT trainer, then the first checkpoint that reaches the target."""
    work = s.work
    with s.stage("SFT", f"SFT warm-up with OpenRLHF's train_sft ({cfg.sft_epochs} epochs)"):
        sft_final = work / "sft_final"
        steps_per_epoch = max(1, len(train_rows) // cfg.sft_batch)
        run_logged(
            [sys.executable, "-c", "from rpg_openrlhf.demo.training import sft_worker; sft_worker()",
             *sft_argv(cfg, base, work / "data" / "sft.jsonl", sft_final, save_steps=steps_per_epoch)],
            s.logs / "sft.log", s.env, timeout=1800, what="SFT (openrlhf.cli.train_sft)",
        )  # fmt: skip
    pick = f"picking the warm-up checkpoint (first with sampled accuracy >= {cfg.sft_target})"
    with s.stage("SFT checkpoint pick", pick):
        picked, sft_step, probed = pick_warmup(work / "sft_ckpt", rl_rows[: cfg.sft_probe], cfg)
        sft = work / "sft"
        shutil.copytree(picked, sft)
        copy_tokenizer(base, sft)
        shutil.rmtree(work / "sft_ckpt", ignore_errors=True)
        shutil.rmtree(sft_final, ignore_errors=True)  # the model after all epochs: not used
        print(f"[rpg-demo] warm-up: SFT step {sft_step} (probe accuracy by step: {probed})", flush=True)
    return sft, sft_step, probed


def _rl_runs(s: _Stages, cfg: DemoConfig, sft: Path) -> dict[str, dict[str, Any]]:
    """3. One rpg-train run per method; its training steps to runs/<method>/steps.jsonl."""
    runs: dict[str, dict[str, Any]] = {}
    for run in cfg.methods:
        with s.stage(f"RL {run}", f"RL: {METHODS[run][0]} via rpg-train, {cfg.rl_steps} steps"):
            run_dir = s.work / run
            text = run_logged(
                rl_argv(cfg, run, sft, s.work / "data" / "rl.jsonl", run_dir),
                s.logs / f"{run}.log",
                s.env,
                timeout=1800,
                what=f"rpg-train {run}",
                on_line=_step_printer(cfg.rl_steps),
            )
            steps = parse_steps(text)
            if not steps:
                raise RuntimeError(f"rpg-train {run}: no 'Global step' lines in {s.logs / f'{run}.log'}")
            write_jsonl(s.out / "runs" / run / "steps.jsonl", steps)
            runs[run] = {
                "reward": reward_summary(steps),
                "checkpoints": [c[0] for c in checkpoints_of(run_dir)],
            }
    return runs


def _evaluate(
    s: _Stages, cfg: DemoConfig, sft: Path, runs: dict[str, dict[str, Any]]
) -> tuple[list[list[str]], float]:
    """4. rpg-eval run per method (SFT model = step 0), then rpg-eval summarize; Last/Best into runs.
    Returns the eval command lines and the SFT model's held-out accuracy."""
    message = f"rpg-eval run: checkpoints on {cfg.heldout} held-out problems x {cfg.eval_n} samples"
    with s.stage("eval", message):
        eval_dir = s.out / "eval"
        eval_dir.mkdir(parents=True, exist_ok=True)
        eval_commands = []
        for run in cfg.methods:
            ckpts = eval_checkpoints(s.work / "eval_ckpts" / run, sft, checkpoints_of(s.work / run))
            argv = eval_argv(cfg, run, ckpts, s.work / "data" / "heldout.jsonl", eval_dir / run)
            eval_commands.append(argv)
            run_logged(argv, s.logs / f"eval_{run}.log", s.env, timeout=1800, what=f"rpg-eval run ({run})")
        run_logged(
            [*CLI, "summarize", *[str(eval_dir / r / "samples.jsonl") for r in cfg.methods],
             "--out", str(eval_dir), "--grader", "math_verify", "--seed", str(cfg.seed)],
            s.logs / "eval_summarize.log", s.env, timeout=600, what="rpg-eval summarize",
        )  # fmt: skip
        for row in read_csv(eval_dir / "last_best.csv"):
            if row["grader"] == "math_verify" and row["run"] in runs:
                runs[row["run"]]["eval"] = {
                    "last": float(row["last"]), "last_step": int(row["last_step"]),
                    "best": float(row["best"]), "best_step": int(row["best_step"]),
                    # chosen on the first half of each problem's samples, scored on the other half
                    "heldout_best": float(row["heldout_best"]), "heldout_best_step": int(row["heldout_best_step"]),
                    "heldout_best_ci": [float(row["heldout_best_ci_low"]), float(row["heldout_best_ci_high"])],
                }  # fmt: skip
        # Step 0 is the same SFT model in every method's run (same seed, same samples): take the first.
        step0 = [
            r for r in read_csv(eval_dir / "summary.csv")
            if r["grader"] == "math_verify" and int(r["step"]) == 0 and r["run"] == cfg.methods[0]
        ]  # fmt: skip
        sft_accuracy = float(step0[0]["mean"]) if step0 else float("nan")
    return eval_commands, sft_accuracy


def _baseline(cfg: DemoConfig) -> str:
    return BASELINE if BASELINE in cfg.methods else cfg.methods[-1]


def _curves(out: Path, cfg: DemoConfig) -> tuple[list[str], list[str]]:
    """rpg-eval's ``--tb NAME=DIR`` values and ``--label`` flags of the methods' TensorBoard logs."""
    short = {r: METHODS[r][0].split(" ")[0] for r in cfg.methods}
    return [f"{short[r]}={out / 'tensorboard' / r}" for r in cfg.methods], [
        f"--label={r}={short[r]}" for r in cfg.methods
    ]


def _table_and_plots(s: _Stages, cfg: DemoConfig) -> dict[str, Any]:
    """5. The Last/Best table (table.md, table.csv: each method's paired difference to GRPO, the
    held-out Best) and the training plots, by rpg-eval. Returns the paired differences."""
    out, eval_dir, baseline = s.out, s.out / "eval", _baseline(cfg)
    with s.stage("table + plots", "table and plots"):
        layout = write_layout(s.work / "layout.yaml", cfg.methods, cfg.eval_n)
        run_logged(
            [*CLI, "table", "--layout", str(layout), "--table", "demo", "--runs", str(eval_dir / "last_best.csv"),
             "--grader", "math_verify", "--samples", *[str(eval_dir / m) for m in cfg.methods],
             "--baseline", baseline, "--heldout", "--seed", str(cfg.seed), "--formats", "md,csv",
             "--out", str(s.work / "table")],
            s.logs / "table.log", s.env, timeout=300, what="rpg-eval table",
        )  # fmt: skip
        for fmt in ("md", "csv"):
            made = s.work / "table" / f"demo.{fmt}"
            if made.exists():
                shutil.copy2(made, out / f"table.{fmt}")
        comparison = {"baseline": baseline, "grader": "math_verify", "score": "mean@k", "methods": {}}
        for row in read_csv(out / "table.csv"):
            if row["baseline"]:
                comparison["methods"][row["run"]] = {
                    point: {"diff": float(row[f"{point}_diff"]), "p": float(row[f"{point}_p"]),
                            "ci": [float(row[f"{point}_diff_ci_low"]), float(row[f"{point}_diff_ci_high"])]}
                    for point in ("last", "best")
                }  # fmt: skip
        tb, labels = _curves(out, cfg)
        run_logged(
            [*CLI, "plot", "--tb", *tb, "--summary", str(eval_dir / "summary.csv"), *labels,
             "--grader", "math_verify", "--smooth", "0.6", "--formats", "png", "--out", str(out / "plots")],
            s.logs / "plot.log", s.env, timeout=300, what="rpg-eval plot",
        )  # fmt: skip
    return comparison


def _report(s: _Stages, cfg: DemoConfig) -> dict[str, Any]:
    """6. The HTML page (report.html: table, plots, every sample) by rpg-eval report, and a screenshot
    of it (report.png) when Chromium is installed."""
    out, eval_dir, baseline = s.out, s.out / "eval", _baseline(cfg)
    with s.stage("report", "HTML report"):
        tb, labels = _curves(out, cfg)
        run_logged(
            [*CLI, "report", str(out / "report.html"), "--runs", *[str(eval_dir / m) for m in cfg.methods],
             "--tb", *tb, *labels, "--baseline", baseline, "--data", f"{BENCHMARK}={s.work / 'data' / 'heldout.jsonl'}",
             "--title", "RPG CPU demo: held-out a+b", "--seed", str(cfg.seed)],
            s.logs / "report.log", s.env, timeout=300, what="rpg-eval report",
        )  # fmt: skip
        return {"html": "report.html", "screenshot": _screenshot(out / "report.html", out / "report.png")}


def _screenshot(page: Path, png: Path) -> str | None:
    """report.png: the top of the page in headless Chromium; None (said once) without Chromium."""
    from rpg_eval.report.browser import BrowserError, Chromium

    try:
        with Chromium() as browser:
            browser.open(page.as_uri())
            browser.screenshot(png, 1280, 1500)
    except BrowserError as e:
        print(f"[rpg-demo] no screenshot of the report ({e})", flush=True)
        return None
    return png.name


def build_parser() -> argparse.ArgumentParser:
    """rpg-demo's command line."""
    from rpg_openrlhf.common.cliutil import OneLineParser, int_at_least

    parser = OneLineParser(prog="rpg-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"output folder (default: {DEFAULT_OUT}, ignored by git; {COMMITTED_OUT} is the committed copy)",
    )
    parser.add_argument("--quick", action="store_true", help="same code path, fewer steps and problems (CI)")
    parser.add_argument(
        "--rl-steps", type=int_at_least(1), default=None, help="RL steps per method (override)"
    )
    parser.add_argument("--methods", default=None, help=f"comma list of {','.join(METHODS)} (default: both)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``rpg-demo``: every failure is one line ``rpg-demo: error: ...``, exit 2 (a
    failed stage: exit 1); SIGTERM stops the running stage's whole process group first."""
    from rpg_openrlhf.common.cliutil import report_errors

    signal.signal(signal.SIGTERM, _interrupt)
    return report_errors("rpg-demo", _main, argv)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # run_logged kills the stage's process group, then the demo ends


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    if args.rl_steps:
        cfg.rl_steps = args.rl_steps
    if args.methods:
        cfg.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in cfg.methods if m not in METHODS]
        if unknown:
            parser.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    out = Path(args.out)
    try:
        # a file, a link or a folder it did not make: refused now; the committed copy (no mark yet)
        # is known by its summary.json; one demo per folder
        with output_dir(out, "rpg-demo", marks=("summary.json",)):
            result = run_demo(out, cfg, quick=args.quick)
    except RuntimeError as e:
        print(f"rpg-demo: error: {e}", file=sys.stderr)
        return 1
    out = out.resolve()
    print(f"\n[rpg-demo] done in {result['timings']['total']:.0f}s")
    print(f"  SFT warm-up: step {result['sft_step']}, held-out sampled accuracy {result['sft_accuracy']:.3f}")
    for run, info in result["runs"].items():
        r, e = info["reward"], info.get("eval", {})
        print(
            f"  {METHODS[run][0]}: train reward {r.get('first_mean', float('nan')):.3f} -> "
            f"{r.get('last_mean', float('nan')):.3f} (mean of first/last {r.get('window')} steps); "
            f"eval Last {e.get('last', float('nan')):.3f} (step {e.get('last_step')}), "
            f"Best {e.get('best', float('nan')):.3f} (step {e.get('best_step')})"
        )
    print(f"  table:  {out / 'table.md'}")
    print(f"  plots:  {out / 'plots'}")
    print(f"  README: {out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
