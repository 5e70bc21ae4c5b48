"""A rollout engine's vLLM engine-core process that ended abnormally is named, with its signal or exit
status, in the error of the request it failed (rpg_openrlhf/cpu_backend/engine_exit.py); its owner
still reaps it and sees the same status. That the engine actor finds the real engine core by vLLM's
handles and names its SIGKILL: tests/test_vllm_engine.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from rpg_openrlhf.cpu_backend.engine_exit import EngineCoreWatch, fail_pending_calls
from rpg_openrlhf.cpu_backend.engines import ENGINE_PROCESS_ENV, use_engine_process_env

CASES = [
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL, "was killed by SIGKILL"),
    ("import sys; sys.exit(3)", 3, "exited with status 3"),
    ("pass", 0, None),
]


@pytest.mark.parametrize("owner_first", [False, True], ids=["watcher-reads", "owner-reaped-first"])
@pytest.mark.parametrize(("code", "returncode", "how"), CASES)
def test_a_failed_request_names_how_the_process_ended(
    code: str, returncode: int, how: str | None, owner_first
) -> None:
    """vLLM's monitor may reap its engine core before the watcher reads it (under load in CI): the watcher
    then finds no child (nothing known without the owner's handle), and the status comes from the handle."""
    child = subprocess.Popen([sys.executable, "-c", code])
    if owner_first:
        assert child.wait(timeout=60) == returncode  # reaped before any watcher
        if how is not None:
            assert EngineCoreWatch([child.pid]).annotate(RuntimeError(), settle_s=5) == []
        watch = EngineCoreWatch([child.pid], {child.pid: child})
    else:
        watch = EngineCoreWatch([child.pid])
        # ended, not reaped (Popen.poll would reap it: a watcher not yet waiting would then find no child)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    exc = RuntimeError("EngineDeadError")
    lines = watch.annotate(exc, settle_s=30)
    assert child.wait(timeout=60) == returncode  # the owner still reads the status
    if how is None:
        assert lines == [] and not hasattr(exc, "__notes__")
    else:
        assert lines == [f"[vLLM-CPU] ERROR: the vLLM engine-core process (pid {child.pid}) {how}"]
        assert exc.__notes__ == lines


def test_a_process_still_running_adds_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        exc = RuntimeError("a request that failed for another reason")
        assert EngineCoreWatch([child.pid]).annotate(exc, settle_s=0.2) == []
        assert not hasattr(exc, "__notes__")
    finally:
        child.kill()
        child.wait()


def test_no_engine_core_found_is_said(capsys) -> None:
    """Nothing to watch is printed as a warning with the children seen, never passed over in silence."""
    import multiprocessing

    plain = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,), name="Other")
    plain.start()
    try:
        assert EngineCoreWatch.of_this_process().pids == []
        err = capsys.readouterr().err
        assert "[vLLM-CPU] WARNING: no vLLM engine-core process found" in err and str(plain.pid) in err, err
    finally:
        plain.kill()
        plain.join(timeout=60)


def _spawned_abort() -> int | None:
    """The exit code of an abort (what a C++ ``terminate`` ends in) in a process started as vLLM starts
    its engine core (multiprocessing's spawn: a fresh interpreter)."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=os.abort)
    child.start()
    child.join(timeout=120)
    return child.exitcode


def test_an_abort_in_the_engine_core_prints_its_python_stack(monkeypatch, capfd) -> None:
    """The engine actor's environment (ENGINE_PROCESS_ENV, set before vLLM starts its engine core) turns
    Python's faulthandler on in the engine core: an abort or another fatal signal prints the Python stack
    where it happened. Without it the same abort printed nothing (Ray enables faulthandler in its workers
    only). (A SIGSEGV in the real engine core is taken by the handler of tvm_ffi, which vLLM imports: it
    prints a native stack under "Segfault encountered".)"""
    for name in ENGINE_PROCESS_ENV:
        monkeypatch.delenv(name, raising=False)
    capfd.readouterr()
    assert _spawned_abort() == -signal.SIGABRT
    assert "Fatal Python error" not in capfd.readouterr().err  # the default: no trace at all
    use_engine_process_env()  # what CPURolloutEngine.__init__ does first
    assert _spawned_abort() == -signal.SIGABRT
    err = capfd.readouterr().err
    assert "Fatal Python error: Aborted" in err and "multiprocessing/process.py" in err, err


def test_an_end_fails_the_calls_waiting_for_the_processs_answer() -> None:
    """vLLM's client awaits a utility call (the first request's get_supported_tasks, a sync's collective_rpc)
    on a future only the engine core's answer resolves: once the process has ended, the watcher fails it
    (a SIGSEGV at the first request left a pipeline waiting until its 600 s limit)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answered, waiting = loop.create_future(), loop.create_future()
        answered.set_result("tasks")
        futures = {1: answered, 2: waiting}  # as vLLM's utility_results: call id -> future
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
        EngineCoreWatch(
            [child.pid],
            on_end=lambda: loop.call_soon_threadsafe(fail_pending_calls, futures, lambda: EOFError("dead")),
        )
        with pytest.raises(EOFError, match="dead"):
            await asyncio.wait_for(waiting, timeout=60)
        assert futures == {} and answered.result() == "tasks"
        assert child.wait(timeout=60) == 0  # its owner still reaps it

    asyncio.run(main())
