"""A NaN on one data-parallel rank stops every rank with the same error (no hang).

Two real gloo ranks (spawned processes) run the policy actor's RPG loss and a DDP backward; only
rank 1's advantages hold a NaN (tests/helpers/nonfinite_worker.py). Without the agreement both would not
report: rank 1 raises alone and rank 0 waits in DDP's gradient all-reduce until the timeout here.
"""

from __future__ import annotations

import queue
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rpg_openrlhf.plugin import finite

WORLD = 2
TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_nan_on_one_rank_stops_every_rank_with_the_same_error() -> None:
    import nonfinite_worker

    ctx = mp.get_context("spawn")
    results, release = ctx.Queue(), ctx.Event()
    port = _free_port()
    procs = [
        ctx.Process(target=nonfinite_worker.run, args=(r, WORLD, port, results, release))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, str]] = {}
    try:
        while len(got) < WORLD:
            try:
                rank, kind, message = results.get(timeout=TIMEOUT_S)
            except queue.Empty:
                break
            got[rank] = (kind, message)
    finally:
        release.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    assert sorted(got) == [0, 1], f"ranks that reported within {TIMEOUT_S} s: {got} (the others hang)"
    assert got[0] == got[1], got
    kind, message = got[0]
    assert kind == "NonFiniteInputError"
    assert "rank 1: advantages" in message and "rank 0" not in message
    assert "all 2 data-parallel rank(s) stop" in message


def test_single_process_check_names_the_input() -> None:
    ok = torch.zeros(2, 3)
    finite.agree_finite({"logp": ok, "old_logp": ok, "advantages": ok, "ref_logp": None})
    for bad_value in (float("nan"), float("inf"), -float("inf")):
        bad = ok.clone()
        bad[1, 2] = bad_value
        with pytest.raises(finite.NonFiniteInputError, match=r"rank 0: old_logp, ref_logp\)"):
            finite.agree_finite({"logp": ok, "old_logp": bad, "advantages": ok, "ref_logp": bad})


def test_flags_mark_exactly_the_non_finite_inputs() -> None:
    x = torch.randn(4, 5)
    y = x.clone()
    y[0, 0] = float("nan")
    flags = finite.nonfinite_flags({"a": x, "b": y, "c": None, "d": x * float("inf")}, torch.device("cpu"))
    assert flags.tolist() == [0.0, 1.0, 0.0, 1.0]
