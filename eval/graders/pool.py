"""``grade_many`` and the grader's process pool (the grading itself: rpg_eval.graders.answers, rpg_eval.graders.math_check).

Answers are extracted in the calling process; repeated (gold, answer) pairs are checked once and
memoized; integers and small exact values take the fast paths; what is left is checked either in
this process (under the signal deadline of ``math_check._mv_check``) or in a pool of worker processes
that kills a worker whose item overruns its time limit (a C-level loop can ignore the signal), so
every item ends within ``timeout + 1`` seconds.

Workers are plain ``python -c`` subprocesses talking over two os pipes: unlike multiprocessing's
spawn/forkserver they never re-import the caller's ``__main__`` (no ``if __name__ == "__main__"``
guard needed), and unlike fork they are safe when the parent runs threads (torch, ray).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import wait as mp_wait

from . import math_check as M
from .answers import GRADERS, Verdict, grade_paper
from .math_check import DEFAULT_TIMEOUT, check_timeout

Job = tuple[str, str, str]  # (gold, pred, kind)


def grade_many(
    responses: Sequence[str],
    golds: Sequence[str],
    grader: str = "math_verify",
    processes: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    allow_fallback: bool = False,
    progress: bool = False,
) -> list[Verdict]:
    """Grade many responses; verdicts equal ``grade`` item by item.

    Answers are extracted in this process, repeated (gold, answer) pairs are checked once
    (and memoized across calls).  ``processes``: 0 = in this process; None = in this
    process for small batches in the main thread, else a pool of ``os.cpu_count()``
    workers; n >= 1 = a pool of n workers.  Each item is bounded by ``timeout`` (+1 s).
    """
    if len(responses) != len(golds):
        raise ValueError(f"responses ({len(responses)}) and golds ({len(golds)}) differ in length")
    check_timeout(timeout)
    if grader == "paper":
        return [grade_paper(r, g) for r, g in zip(responses, golds)]
    if grader != "math_verify":
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    out: list[Verdict | None] = [None] * len(responses)
    todo = _without_work(responses, golds, allow_fallback, out)
    jobs = sorted(todo, key=lambda j: (j[1], j[2]))  # same answers together: a timeout skips its repeats
    if jobs:
        for job, res in zip(jobs, _check(jobs, processes, timeout, progress)):
            M._cache_put(job, res)
            v = Verdict(res[0], res[1], "math_verify", res[2])
            for i in todo[job]:
                out[i] = v
    return out  # type: ignore[return-value]


def _without_work(
    responses: Sequence[str], golds: Sequence[str], allow_fallback: bool, out: list[Verdict | None]
) -> dict[Job, list[int]]:
    """Fill ``out`` where no math-verify work is needed (no answer, memoized, fast path); the
    remaining jobs and the positions each decides."""
    todo: dict[Job, list[int]] = {}
    for i, (r, g) in enumerate(zip(responses, golds)):
        job = M._mv_job(r, g, allow_fallback)
        if isinstance(job, Verdict):
            out[i] = job
            continue
        hit = M._cached(job)
        if hit is None and job not in todo:
            hit = M._fast_path(*job)
            if hit is not None:
                M._cache_put(job, hit)
        if hit is not None:
            out[i] = Verdict(hit[0], hit[1], "math_verify", hit[2])
        else:
            todo.setdefault(job, []).append(i)
    return todo


def _check(jobs: list[Job], processes: int | None, timeout: float, progress: bool) -> list:
    """Results of ``jobs``, in this process or in the pool (see grade_many's ``processes``)."""
    main = M._in_main_thread()
    in_process = main and (processes == 0 or (processes is None and len(jobs) <= 64))
    if in_process:
        return [M._mv_check(*job, timeout) for job in _maybe_tqdm(jobs, progress)]
    return _get_pool(processes or os.cpu_count() or 1).run(jobs, timeout, progress)


def _maybe_tqdm(items: list | None, progress: bool, **kwargs):
    """``items`` (None: nothing), with a progress bar over the answers checked when ``progress``."""
    if not progress:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="grading", unit="answer", **kwargs)


# --------------------------------------------------------------------------- workers


def _worker_main(rfd: int, wfd: int) -> None:
    """Worker loop: receive [(idx, gold, pred, kind, timeout)], send (idx, result) per item."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    rconn, wconn = Connection(rfd, writable=False), Connection(wfd, readable=False)
    M._math_verify()  # imports and warms up: the first real item must not spend its time limit so
    wconn.send(("ready", None))
    while True:
        try:
            batch = rconn.recv()
        except EOFError:  # the parent closed its end (shutdown_pool) or died
            return
        for idx, gold, pred, kind, timeout in batch:
            wconn.send((idx, M._mv_check(gold, pred, kind, timeout)))


class _Worker:
    """One worker subprocess and the parent's ends of its pipes."""

    def __init__(self) -> None:
        from multiprocessing.connection import Connection

        c_r, p_w = os.pipe()  # parent -> child
        p_r, c_w = os.pipe()  # child -> parent
        code = f"from rpg_eval.graders.pool import _worker_main; _worker_main({c_r}, {c_w})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(c_r, c_w))
        os.close(c_r)
        os.close(c_w)
        self.recv = Connection(p_r, writable=False)
        self.send = Connection(p_w, readable=False)
        self.ready = False
        self.batch: list[int] = []  # job ids sent and not yet answered, in the worker's order
        self.since = 0.0  # when the worker started its current item

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.recv.close()
        self.send.close()


class _Batch:
    """One call of _Pool.run: the jobs, their results and the queue of chunks not yet sent."""

    def __init__(self, jobs: list[Job], timeout: float, progress: bool, n_workers: int) -> None:
        self.jobs, self.timeout = jobs, timeout
        self.results: list = [None] * len(jobs)
        self.done = 0
        chunk = max(1, min(256, len(jobs) // (n_workers * 4)))
        self.queue = [list(range(s, min(s + chunk, len(jobs)))) for s in range(0, len(jobs), chunk)]
        self.queue.reverse()
        self.bar = _maybe_tqdm(None, progress, total=len(jobs))

    def finish(self, idx: int, res: tuple) -> None:
        self.results[idx] = res
        self.done += 1
        if self.bar:
            self.bar.update(1)

    def feed(self, w: _Worker) -> None:
        """Give an idle, ready worker the next chunk."""
        if w.ready and not w.batch and self.queue:
            w.batch = self.queue.pop()
            w.since = time.monotonic()
            with contextlib.suppress(OSError):  # died meanwhile: found by the loop, batch requeued
                w.send.send([(i, *self.jobs[i], self.timeout) for i in w.batch])

    def receive(self, w: _Worker) -> None:
        """Take every answer the worker has sent."""
        try:
            while w.recv.poll():
                idx, res = w.recv.recv()
                if idx == "ready":
                    w.ready, w.since = True, time.monotonic()
                elif w.batch and idx == w.batch[0]:
                    w.batch.pop(0)
                    w.since = time.monotonic()
                    self.finish(idx, res)
        except (EOFError, OSError):
            pass  # the worker died; _Pool._reap handles it

    def fail_current(self, w: _Worker, overrun: bool) -> None:
        """The item that hung or crashed worker ``w`` (and, on a hang, its repeats): a verdict each;
        the rest of its chunk goes back to the queue."""
        idx = w.batch.pop(0)
        job = self.jobs[idx]
        if not overrun:
            self.finish(idx, (False, M._pred_or_none(job), "worker died"))
        else:  # a C-level loop ignored the signal: the answer's check hung, against any gold
            same = [idx] + [i for i in w.batch if self.jobs[i][1:] == job[1:]]
            for i in same:
                self.finish(i, M._timed_out(self.jobs[i][1], self.jobs[i][2]))
            w.batch = [i for i in w.batch if i not in same]
        if w.batch:
            self.queue.append(w.batch)


class _Pool:
    """A minimal process pool with per-item hard deadlines (kill + respawn on overrun).

    The parent knows each worker's batch order, so the item in progress is the first
    unanswered one and it started when the previous answer arrived: no shared memory.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.workers = [_Worker() for _ in range(n)]
        self.lock = threading.Lock()  # one batch at a time (grade() may come from threads)

    def run(self, jobs: list[Job], timeout: float, progress: bool) -> list:
        """Check ``jobs`` (gold, pred, kind); results in job order."""
        with self.lock:
            b = _Batch(jobs, timeout, progress, self.n)
            # A worker that died while idle (OOM killer, a stray kill) is replaced before it gets
            # work: its items would otherwise come back as "worker died".
            self._reap(b)
            for w in self.workers:
                b.feed(w)
            while b.done < len(jobs):
                by_conn = {w.recv: w for w in self.workers}
                for conn in mp_wait(list(by_conn), timeout=0.05):
                    b.receive(by_conn[conn])
                    b.feed(by_conn[conn])
                self._reap(b)
            if b.bar:
                b.bar.close()
            return b.results

    def _reap(self, b: _Batch) -> None:
        """Replace workers that died or overran their item's deadline."""
        now = time.monotonic()
        for k, w in enumerate(self.workers):
            dead = w.proc.poll() is not None
            overrun = w.ready and w.batch and now - w.since > b.timeout + 0.5
            if not (dead or overrun):
                continue
            if w.batch:
                b.fail_current(w, bool(overrun))
            w.kill()
            self.workers[k] = _Worker()

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        self.workers = []


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool(n: int) -> _Pool:
    """The persistent worker pool (start-up costs ~1 s: reuse it across calls, and a
    larger pool serves a request for fewer workers)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.n < n:
            if _pool is not None:
                _pool.close()
            _pool = _Pool(n)
        return _pool


def shutdown_pool() -> None:
    """Stop the worker processes (also registered at exit)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close()
            _pool = None


atexit.register(shutdown_pool)
