"""Benchmark 4: batch-eval overhead per checkpoint, excluding generation.

Runs `rpg-eval run` (rpg_eval.run.runner.run, hf backend, CPU) in this process on tiny random
Qwen2 checkpoints (rpg_openrlhf.tinymodel.build_tiny_model) and times it from outside with
wrappers around the runner's own functions (nothing in rpg_eval is modified on disk):

  generation  HFLM.generate_until (tokenize, model.generate, decode: the part a faster
              model or vLLM changes)
  loading     rpg_eval.run.lm_models.make_lm (model + tokenizer load per checkpoint)
  scoring     rpg_eval.run.tasks.utils.grade_responses (both graders, per problem)
  writing     rpg_eval.records.append (one atomic append + fsync per chunk)
  discovery   find_checkpoints + load_problems + task yaml writing (once per run)
  summary     rpg_eval.stats.summary.summarize (once per run)
  lm-eval     the rest of evaluate_checkpoint (simple_evaluate's task building, filters,
              metric aggregation) = evaluate_checkpoint - generation - loading - scoring - writing

overhead per checkpoint = (run wall - generation) / checkpoints; target <= 5% of generation.

    .venv/bin/python bench/eval_overhead.py                          # 2 checkpoints, 3 benchmarks
    .venv/bin/python bench/eval_overhead.py --max-tokens 512 --n 8 --limit 10
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchlib import REPO, environment, fmt_table, write_json

SHARED = REPO.parent / "shared" / "data"


class Timers:
    """Accumulated seconds per label, split by the checkpoint being evaluated."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.depth: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        """Replace owner.attr by a timing wrapper (re-entrant calls are counted once)."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth[label]:
                return fn(*args, **kwargs)
            self.depth[label] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] += time.perf_counter() - t0
                self.calls[label] += 1
                self.depth[label] -= 1

        setattr(owner, attr, timed)


def install_timers(t: Timers) -> None:
    """Wrap the runner's functions where it looks them up (module attributes)."""
    from lm_eval.models.huggingface import HFLM
    from rpg_eval import records
    from rpg_eval.run import lm_models, runner, taskgen
    from rpg_eval.run.tasks import utils as task_utils
    from rpg_eval.stats import summary

    t.wrap(HFLM, "generate_until", "generation")
    t.wrap(lm_models, "make_lm", "loading")
    t.wrap(task_utils, "grade_responses", "scoring")
    t.wrap(records, "append", "writing")
    t.wrap(runner, "find_checkpoints", "discovery")
    t.wrap(runner, "load_problems", "discovery")
    t.wrap(runner, "write_tasks", "discovery")
    t.wrap(runner, "evaluate_checkpoint", "evaluate_checkpoint")
    t.wrap(summary, "summarize", "summary")
    del taskgen  # imported so that the module exists before wrapping runner.write_tasks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build checkpoints, run the batch eval with timers, print the breakdown."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", default=None, help="existing checkpoints (default: 2 tiny models)")
    p.add_argument("--n-checkpoints", type=int, default=2)
    p.add_argument("--benchmarks", default="aime24,aime25,amc23")
    p.add_argument("--n", type=int, default=4, help="samples per problem")
    p.add_argument("--limit", type=int, default=5, help="problems per benchmark")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64, help="tiny model width")
    p.add_argument("--data-dir", default=str(SHARED))
    p.add_argument(
        "--skip-env-info",
        action="store_true",
        help="make lm-eval's add_env_info / get_git_commit_hash no-ops for the whole process (torch's "
        "collect_env and git subprocesses on every simple_evaluate call); the runner now does this "
        "itself around simple_evaluate, so this only matters for older runners",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # steadier on a shared 2-core machine
    from rpg_eval.run.runner import RunConfig, run

    from rpg_openrlhf.tinymodel import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="rpg_eval_overhead_"))
    if args.checkpoints is None:
        ckdir = tmp / "ckpts"
        for i in range(args.n_checkpoints):
            build_tiny_model(ckdir / f"global_step{i + 1}_hf", seed=i, hidden=args.hidden)
        checkpoints = str(ckdir)
    else:
        checkpoints = args.checkpoints
    timers = Timers()
    install_timers(timers)
    if args.skip_env_info:
        import lm_eval.evaluator as ev

        ev.add_env_info = lambda storage: None
        ev.get_git_commit_hash = lambda: None
    cfg = RunConfig(
        checkpoints=checkpoints, out=str(tmp / "out"), benchmarks=args.benchmarks.split(","), n=args.n,
        backend="hf", data_dir=args.data_dir, limit=args.limit, max_tokens=args.max_tokens, chunk=args.chunk,
        device="cpu",
    )  # fmt: skip
    t0 = time.perf_counter()
    res = run(cfg)
    wall = time.perf_counter() - t0
    k = len(res["checkpoints"])
    tt = timers.total
    gen = tt["generation"]
    lm_eval_rest = tt["evaluate_checkpoint"] - gen - tt["loading"] - tt["scoring"] - tt["writing"]
    other = wall - tt["evaluate_checkpoint"] - tt["discovery"] - tt["summary"]
    rows: list[dict[str, Any]] = []
    parts: list[tuple[str, float]] = [
        ("generation", gen), ("loading", tt["loading"]), ("scoring", tt["scoring"]),
        ("writing", tt["writing"]), ("lm-eval (simple_evaluate)", lm_eval_rest), ("discovery", tt["discovery"]),
        ("summary", tt["summary"]), ("other", other),
    ]  # fmt: skip
    for name, s in parts:
        rows.append({"part": name, "s_total": s, "s_per_ckpt": s / k, "pct_of_generation": 100 * s / gen})
    overhead = (wall - gen) / k
    result = {
        "args": vars(args),
        "env": environment(),
        "checkpoints": k,
        "records": res["written"],
        "wall_s": wall,
        "generation_s": gen,
        "overhead_per_checkpoint_s": overhead,
        "overhead_pct_of_generation": 100 * (wall - gen) / gen,
        "rows": rows,
        "calls": dict(timers.calls),
    }
    print(
        f"batch eval: {k} checkpoints x {args.benchmarks} x {args.limit} problems x {args.n} samples, "
        f"max_tokens {args.max_tokens}, chunk {args.chunk}, hf backend on CPU; {res['written']} records; "
        f"wall {wall:.1f} s; load {result['env']['loadavg_1m']:.1f}"
        + ("; lm-eval env info skipped (suggested fix)" if args.skip_env_info else "")
    )
    print(fmt_table(rows, ["part", "s_total", "s_per_ckpt", "pct_of_generation"]))
    print(
        f"overhead per checkpoint (everything but generation): {overhead:.2f} s = "
        f"{result['overhead_pct_of_generation']:.1f}% of generation time (target <= 5%)"
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
