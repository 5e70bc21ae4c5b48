"""Keep or replace the grader's hand-written worker pool? rpg_eval.graders.pool._Pool against pebble's
ProcessPool (per-task timeout, worker kill and restart) doing the same jobs (issue #13).

Both run exactly what grade_many hands its pool: the (gold, answer, kind) jobs left after
extraction, the fast path and the memo, checked with graders._mv_check (signal deadline inside the
worker), a per-item hard limit of timeout + 0.5 s (kill, respawn). The pebble side schedules one
task per job (its timeout is per task; pebble's map() has a timeout per chunk only), forkserver
context (fork is unsafe beside torch/ray threads, spawn re-imports the caller's __main__).

  speed    grade_many(processes=2) on bench/grader_throughput.py's workloads, the pool swapped in,
           interleaved rounds, every cache cleared before each call; median wall time, ratio
           pebble / hand-written in the same round; verdicts compared item by item
  timeout  a power tower no check finishes (x 4 golds) + 8 ordinary items, timeout 1 s: wall
           time and verdicts
  kill     a worker SIGKILLed while it checks the tower: every item still gets a verdict?
  start    seconds to a 2-worker pool that has answered once

    .venv/bin/python bench/pool_choice.py [--rounds 5] [--json bench/results/pool_choice.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from benchlib import environment, interleaved_times, median, paired_ratio, write_json
from grader_throughput import dapo_workload, latex_workload

TOWER = "\\boxed{8^{8^{8^{8^{8}}}}}"


def _warm() -> None:
    """pebble initializer: the same warm-up as grader_pool._worker_main (sympy, the LaTeX parser)."""
    from rpg_eval import graders as G

    parse, verify, anchored, free, _ = G._math_verify()
    verify(parse("\\boxed{\\frac{1}{2}}", free), parse("\\boxed{\\sqrt{2}/2}", anchored))


class PebblePool:
    """grader_pool._Pool's interface (run(jobs, timeout, progress) -> results) on pebble.ProcessPool."""

    def __init__(self, n: int) -> None:
        import pebble

        self.n = n
        ctx = multiprocessing.get_context("forkserver")
        self.pool = pebble.ProcessPool(max_workers=n, initializer=_warm, context=ctx)

    def run(self, jobs: list[tuple[str, str, str]], timeout: float, progress: bool = False) -> list:
        import pebble
        from rpg_eval import graders as G

        futures = [
            self.pool.schedule(G._mv_check, args=(*job, timeout), timeout=timeout + 0.5) for job in jobs
        ]
        out = []
        for job, fut in zip(jobs, futures):
            try:
                out.append(fut.result())
            except concurrent.futures.TimeoutError:
                out.append(G._timed_out(job[1], job[2]))
            except pebble.ProcessExpired:
                out.append((False, G._pred_or_none(job), "worker died"))
        return out

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.pool._pool_manager.worker_manager.workers.values()]

    def close(self) -> None:
        self.pool.stop()
        self.pool.join()


def _use(kind: str, n: int = 2) -> Any:
    """Install a fresh pool of `kind` as grade_many's pool; return it."""
    from rpg_eval.graders import pool as P

    P.shutdown_pool()
    P._pool = PebblePool(n) if kind == "pebble" else P._Pool(n)
    return P._pool


def _pids(pool: Any) -> list[int]:
    return pool.worker_pids() if isinstance(pool, PebblePool) else [w.proc.pid for w in pool.workers]


def start_time(kind: str) -> float:
    from rpg_eval import graders as G

    G.clear_caches()
    t0 = time.perf_counter()
    _use(kind)
    G.grade_many(["\\boxed{\\frac{\\pi}{2}}"] * 2, ["\\pi/2"] * 2, processes=2, timeout=5)
    return time.perf_counter() - t0


def speed(name: str, responses: list[str], golds: list[str], rounds: int) -> dict[str, Any]:
    from rpg_eval import graders as G
    from rpg_eval.graders import pool as P

    pools = {"hand-written": _use("hand"), "pebble": None}
    P._pool = None
    pools["pebble"] = PebblePool(2)
    results: dict[str, list] = {}

    def path(kind: str):
        def run() -> None:
            G.clear_caches()
            P._pool = pools[kind]
            results[kind] = G.grade_many(responses, golds, processes=2, timeout=5)

        return run

    times = interleaved_times({k: path(k) for k in pools}, rounds, warmup=1)
    same = [(v.correct, v.extracted, v.error) for v in results["hand-written"]] == [
        (v.correct, v.extracted, v.error) for v in results["pebble"]
    ]
    for pool in pools.values():
        pool.close()
    P._pool = None
    row = {
        "workload": name,
        "items": len(responses),
        "hand_s": median(times["hand-written"]),
        "pebble_s": median(times["pebble"]),
        "pebble_over_hand": paired_ratio(times, "pebble", "hand-written"),
        "verdicts_identical": same,
    }
    print(row, flush=True)
    return row


def timeouts(kind: str) -> dict[str, Any]:
    from rpg_eval import graders as G

    G.clear_caches()
    _use(kind)
    golds = ["1", "2", "3", "4"] + [str(i) for i in range(8)]
    responses = [TOWER] * 4 + [f"\\boxed{{{i}}}" for i in range(8)]
    t0 = time.perf_counter()
    out = G.grade_many(responses, golds, processes=2, timeout=1)
    row = {"pool": kind, "wall_s": time.perf_counter() - t0, "errors": [v.error for v in out[:4]]}
    row["ordinary_correct"] = all(v.correct for v in out[4:])
    G.shutdown_pool()
    print(row, flush=True)
    return row


def kill(kind: str) -> dict[str, Any]:
    """SIGKILL one worker 1.5 s into a batch whose first items hang (timeout 3 s)."""
    from rpg_eval import graders as G

    G.clear_caches()
    pool = _use(kind)
    G.grade_many(["\\boxed{\\frac{\\pi}{2}}"] * 2, ["\\pi/2"] * 2, processes=2, timeout=3)  # both workers up
    G.clear_caches()
    victim = _pids(pool)[0]
    threading.Timer(1.5, lambda: os.kill(victim, signal.SIGKILL)).start()
    texts = [TOWER, "\\boxed{\\frac{1}{2}}", TOWER.replace("8", "9"), "\\boxed{\\sqrt{2}}"] * 3
    golds = ["5", "1/2", "6", "\\sqrt{2}"] * 3
    t0 = time.perf_counter()
    try:
        out = G.grade_many(texts, golds, processes=2, timeout=3)
        row = {
            "pool": kind,
            "wall_s": time.perf_counter() - t0,
            "errors": sorted({str(v.error) for v in out}),
        }
        row["all_answered"] = len(out) == len(texts) and all(v is not None for v in out)
    except Exception as e:  # noqa: BLE001 - recorded: how the pool fails is the measurement
        row = {"pool": kind, "wall_s": time.perf_counter() - t0, "raised": f"{type(e).__name__}: {e}"}
    G.shutdown_pool()
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    try:
        import pebble  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench/pool_choice.py: needs pebble, which the project does not use: pip install pebble"
        ) from None
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    env = environment()
    res: dict[str, Any] = {"args": vars(args), "env": env}
    res["start_s"] = {k: start_time(k) for k in ("hand", "pebble")}
    print("start", res["start_s"], flush=True)
    res["speed"] = [
        speed("latex", *latex_workload(30, 32), args.rounds),
        speed("dapo", *dapo_workload(32), args.rounds),
    ]
    res["timeout"] = [timeouts(k) for k in ("hand", "pebble")]
    res["kill"] = [kill(k) for k in ("hand", "pebble")]
    if args.json:
        write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
