"""rpg_eval.graders (and its worker pool, rpg_eval.graders.pool) under hostile model output.

Every adversarial response (one of each kind: megabyte strings, an exponent tower, unbalanced
braces, null bytes, deep nesting, ...) must be scored within timeout + 1 s (plus a small allowance
for answer extraction in the caller), without raising, with a Verdict of the documented shape, and
without leaking grader worker processes (checked with psutil before/after, and after the caller is
SIGKILLed); a worker killed idle or mid-item, and grading from a thread, keep every verdict bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

TIMEOUT = 1.0
SLACK = 1.0  # answer extraction of a 1 MB response runs in the caller, outside the deadline
MB = 1 << 20


def adversarial_cases() -> list[tuple[str, str, str]]:
    """(label, response, gold) triples: one of each kind of hostile output."""
    cases: list[tuple[str, str]] = [
        ("1MB random-ish text", ("lorem ipsum 12 dolor " * (MB // 21 + 1))[:MB]),
        ("1MB open braces", "{" * MB),
        ("1MB of boxes", "\\boxed{1}" * (MB // 9)),
        ("tower 9^9^9^9^9", "\\boxed{9^{9^{9^{9^{9}}}}}"),
        ("1e999999", "Answer: 1e999999"),
        ("begin without end", "\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4}"),
        ("1000 null bytes", "\x00" * 1000 + "\\boxed{7}"),
        ("lone surrogate", "\\boxed{7\ud800}"),
        ("parentheses 10000 deep", "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}"),
        ("sympy injection", "\\boxed{Symbol('x').__class__.__mro__}"),
        ("empty response", ""),
    ]
    golds = ["7", "\\frac{1}{2}", "1"]
    return [(label, resp, golds[i % len(golds)]) for i, (label, resp) in enumerate(cases)]


CASES = adversarial_cases()


def _children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE}


def test_grade_many_pool_bounds_every_item_and_leaks_no_worker() -> None:
    """Each hostile item through the 2-worker pool: <= timeout + 1 s (+ extraction slack)."""
    from rpg_eval import graders as G

    G.shutdown_pool()
    G.clear_caches()
    before = _children()
    G.grade_many(["\\boxed{\\frac{\\pi}{2}}"] * 2, ["\\pi/2"] * 2, processes=2)  # start-up not timed
    G.clear_caches()
    slow = []
    for label, resp, gold in CASES:
        t0 = time.monotonic()
        (v,) = G.grade_many([resp], [gold], processes=2, timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
        assert isinstance(v, G.Verdict) and isinstance(v.correct, bool) and v.grader == "math_verify", label
        assert all(x is None or isinstance(x, str) for x in (v.extracted, v.error)), label
        t0 = time.monotonic()
        assert isinstance(G.grade(resp, gold, grader="paper").correct, bool), label  # regexes, never a stall
        elapsed = max(elapsed, time.monotonic() - t0)
        if elapsed > TIMEOUT + 1 + SLACK:
            slow.append((label, round(elapsed, 2)))
        # respawned workers must not pile up: at most the pool's 2 live workers
        assert len(_children() - before) <= 2, label
    assert not slow, f"items over timeout + 1 s: {slow}"
    G.shutdown_pool()
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (_children() - before), "grader workers left running after shutdown_pool()"


def test_workers_exit_when_the_caller_is_killed(tmp_path: Path) -> None:
    """SIGKILL the process that owns the pool: its workers must not outlive it."""
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time, psutil
            from rpg_eval import graders as G
            G.grade_many(["\\\\boxed{\\\\frac{1}{2}}", "\\\\boxed{9^{9^{9^{9}}}}"], ["1/2", "1"],
                         processes=2, timeout=1)
            print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)
            time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert workers, "the pool started no worker"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [
            p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        time.sleep(0.2)
    for p in alive:  # clean up before failing
        os.kill(p, signal.SIGKILL)
    assert not alive, f"grader workers {alive} outlived their SIGKILLed owner"


# --------------------------------------------------------------------------- cost bounds (issue #14, item 8)

FIFTY_MB = 50 * MB


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{" + "1" * FIFTY_MB + "}",
        "Answer: " + "2" * FIFTY_MB,
        "\\boxed{" + "\\frac{1}{2}+" * (FIFTY_MB // 12),
    ],
    ids=["50MB-box", "50MB-answer-line", "50MB-unterminated-box"],
)
def test_huge_answer_is_bounded_before_math_verify(response: str) -> None:
    """A 50 MB final answer: refused without parsing ("answer too long"), within timeout + 1 s, and
    the stored extracted answer is short (records stay small)."""
    from rpg_eval import graders as G

    G.clear_caches()
    for call in (lambda: G.grade(response, "1", timeout=TIMEOUT),
                 lambda: G.grade_many([response], ["1"], processes=1, timeout=TIMEOUT)[0]):  # fmt: skip
        t0 = time.monotonic()
        v = call()
        elapsed = time.monotonic() - t0
        assert elapsed <= TIMEOUT + 1, f"{elapsed:.1f}s"
        assert (v.correct, v.error) == (False, "answer too long"), v.error
        assert v.extracted is not None and len(v.extracted) <= 1000


def test_timeouts_are_cached_per_pair_and_per_answer() -> None:
    """A model stuck on one pathological answer pays the time limit once, not once per problem, and a
    repeated pathological pair is answered from the cache (pool and in-process paths)."""
    from rpg_eval import graders as G

    golds = [str(g) for g in range(1, 7)]
    for processes, tower in ((1, "\\boxed{7^{7^{7^{7^{7}}}}}"), (0, "\\boxed{6^{6^{6^{6^{6}}}}}")):
        G.clear_caches()
        G.grade_many(
            ["\\boxed{\\frac{\\pi}{2}}"], ["1"], processes=max(processes, 1)
        )  # pool start-up not timed
        t0 = time.monotonic()
        first = G.grade_many([tower] * len(golds), golds, processes=processes, timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
        assert [v.error for v in first] == ["timeout"] * len(golds)
        # Uncached, 6 distinct pairs cost 6 time limits; cached, the first one alone.
        assert elapsed < 2 * (TIMEOUT + 1), f"{elapsed:.1f}s for {len(golds)} pairs of one answer"
        t0 = time.monotonic()
        again = [G.grade(tower, "1", timeout=TIMEOUT), *G.grade_many([tower], ["99"], processes=processes)]
        assert time.monotonic() - t0 < 0.5
        assert [v.error for v in again] == ["timeout", "timeout"]
    G.shutdown_pool()


def test_pool_replaces_a_worker_killed_idle_or_mid_item() -> None:
    """A pool worker killed between calls (OOM killer) is replaced before it gets work: no verdict
    lost. One killed mid-item costs that item only ("worker died", or its own timeout); the rest finish."""
    from rpg_eval import graders as G

    G.shutdown_pool()
    G.clear_caches()
    G.grade_many(["\\boxed{\\frac{\\pi}{3}}"], ["1"], processes=2)  # pi: reaches the pool
    victim = G._pool.workers[0].proc  # noqa: SLF001 - the test needs the process handle
    victim.kill()
    victim.wait()
    texts = [f"\\boxed{{\\frac{{{i}\\pi}}{{7}}}}" for i in range(1, 30)]  # pi: no fast path
    golds = ["\\frac{3\\pi}{7}"] * len(texts)
    out = G.grade_many(texts[:8], golds[:8], processes=2)
    assert [(v.correct, v.error) for v in out] == [(i == 3, None) for i in range(1, 9)]
    G.clear_caches()
    pool = G._get_pool(2)  # noqa: SLF001
    killer = threading.Timer(1.0, pool.workers[0].proc.kill)
    killer.start()
    slow = "\\boxed{8^{8^{8^{8^{8}}}}}"  # not graded before: no worker has it memoized as a timeout
    out = G.grade_many([slow] * 2 + texts, ["1", "1"] + golds, processes=2, timeout=3)
    killer.join()
    assert len(out) == len(texts) + 2 and all(v is not None for v in out)
    assert [v.correct for v in out[2:]] == [i == 3 for i in range(1, 30)]
    assert {out[0].error, out[1].error} <= {"timeout", "worker died"}
    G.shutdown_pool()


def test_grade_from_a_thread_uses_the_pool() -> None:
    """Signals only work in the main thread: grade() from a thread must still honour timeouts."""
    from rpg_eval import graders as G
    from rpg_eval.graders import grade

    G.grade_many(["\\boxed{\\frac{\\pi}{5}}"], ["1"], processes=1)  # pool start-up not timed
    result: list = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: result.append(grade("\\boxed{(10^{100000})!}", "5", timeout=1)))
    th.start()
    th.join(timeout=20)
    assert result and result[0].correct is False and result[0].error == "timeout"
    assert time.monotonic() - t0 < 10  # timeout + 1 s, with room for a loaded machine
    th = threading.Thread(target=lambda: result.append(grade("\\boxed{\\frac{2}{4}}", "\\frac12")))
    th.start()
    th.join(timeout=20)
    assert result[1].correct is True
