"""How a rollout engine's vLLM engine-core process ended, named in the error of the request it failed.

vLLM's client only notices that its engine core is gone (``EngineDeadError``); a process ended by a
signal (a native crash, a C++ abort, the OOM killer, a ``kill``) leaves no Python traceback. The CPU
engine actor (:mod:`rpg_openrlhf.cpu_backend.engines`) watches it from the start (:class:`EngineCoreWatch`);
when a request fails, the line::

    [vLLM-CPU] ERROR: the vLLM engine-core process (pid 1234) was killed by SIGSEGV (core dumped)

is printed and added to the exception as a note (it reaches the driver inside Ray's traceback). An
end at shutdown (Ray kills its worker's children after the last request) is not reported.

A watcher waits with ``os.waitid(..., WEXITED | WNOWAIT)``, leaving the status for vLLM's own wait; if
vLLM's monitor reaps the process first, the status comes from vLLM's process handle (``exitcode``).
A dead engine core never answers the utility calls vLLM's client awaits (the first request's
``get_supported_tasks``, a sync's ``collective_rpc``): :func:`fail_pending_calls`, run when a watched
process ends, fails them, so the run does not hang there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

#: The name of vLLM's ``multiprocessing.Process`` for it (``CoreEngineProcManager``; ``EngineCore_DP<i>``
#: with data parallelism).
ENGINE_CORE_NAME = "EngineCore"
#: After a failed request, how long to wait for a watcher that has not yet read its process's end.
SETTLE_S = 1.0


def engine_core_handles() -> dict[int, Any]:
    """This process's engine-core processes from vLLM's own handles: ``{pid: multiprocessing.Process}``."""
    import multiprocessing

    return {
        p.pid: p
        for p in multiprocessing.active_children()
        if p.pid is not None and (p.name == ENGINE_CORE_NAME or p.name.startswith(ENGINE_CORE_NAME + "_DP"))
    }


def describe_returncode(code: int | None) -> str | None:
    """How a process ended, from a ``Popen.returncode`` / ``Process.exitcode`` (negative: a signal)."""
    if not code:
        return None
    if code > 0:
        return f"exited with status {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def describe_end(info: os.waitid_result) -> str | None:
    """How a process ended, from its ``waitid`` record; None for exit status 0."""
    how = describe_returncode(info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
    return how and how + (" (core dumped)" if info.si_code == os.CLD_DUMPED else "")


class EngineCoreWatch:
    """Child processes watched from daemon threads; ``ends`` maps each that ended abnormally to how."""

    def __init__(
        self, pids: list[int], handles: dict[int, Any] | None = None, on_end: Callable[[], None] | None = None
    ) -> None:
        self.pids = list(pids)
        self.ends: dict[int, str] = {}
        self.on_end = on_end  # called from the watcher's thread once a watched process has ended
        # the owner's handles (a multiprocessing.Process or subprocess.Popen per pid): their status once
        # the owner reaped the process before a watcher read it
        self.handles = dict(handles or {})
        self._threads = [
            threading.Thread(target=self._wait, args=(pid,), name=f"engine-core-{pid}-watch", daemon=True)
            for pid in self.pids
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def of_this_process(cls, on_end: Callable[[], None] | None = None) -> EngineCoreWatch:
        """Watch this process's engine-core processes (the engine actor, once its engine is up), as
        vLLM's own handles name them (its process title, read from /proc, was once missing in CI)."""
        handles = engine_core_handles()
        watch = cls(sorted(handles), handles, on_end)
        if watch.pids:
            pids = ", ".join(map(str, watch.pids))
            print(
                f"[vLLM-CPU] engine-core process {pids}: an abnormal end is reported with the request it fails",
                flush=True,
            )
        else:
            print(
                "[vLLM-CPU] WARNING: no vLLM engine-core process found among this process's children "
                f"({_children_seen()}): an abnormal end of it cannot be named in a failed request",
                file=sys.stderr,
                flush=True,
            )
        return watch

    def _wait(self, pid: int) -> None:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped by its owner before this thread waited: it saw the status
            info = None
        how = describe_end(info) if info is not None else None
        if how:
            self.ends[pid] = how
        if self.on_end is not None:
            self.on_end()

    def lines(self) -> list[str]:
        return [
            f"[vLLM-CPU] ERROR: the vLLM engine-core process (pid {pid}) {how}"
            for pid, how in self.ends.items()
        ]

    def annotate(self, exc: BaseException, settle_s: float = SETTLE_S) -> list[str]:
        """After a failed request: the lines of the processes that ended abnormally, printed to stderr and
        added to ``exc`` as notes (a process still running adds nothing, after ``settle_s`` at most)."""
        for thread in self._threads:
            thread.join(timeout=settle_s / max(len(self._threads), 1))
        for pid, handle in self.handles.items():  # reaped by its owner before a watcher read it
            how = None if pid in self.ends else describe_returncode(_returncode(handle))
            if how:
                self.ends[pid] = how
        found = self.lines()
        for line in found:
            exc.add_note(line)
            print(line, file=sys.stderr, flush=True)
        return found


def fail_pending_calls(futures: dict[Any, Any], error: Callable[[], BaseException]) -> int:
    """Fail every unresolved future of ``futures`` (vLLM's client's ``utility_results``) with ``error()``
    and forget them; returns how many. Run in the futures' event loop."""
    failed = 0
    for key, future in list(futures.items()):
        futures.pop(key, None)
        if not future.done():
            future.set_exception(error())
            failed += 1
    return failed


def _children_seen() -> str:
    """This process's children as ``pid title`` (what the engine-core search looked at)."""
    import psutil

    seen = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            seen.append(f"{child.pid} {' '.join(child.cmdline())[:60]!r}")
    return ", ".join(seen) or "none"


def _returncode(handle: Any) -> int | None:
    """A handle's status without blocking: ``Process.exitcode`` or ``Popen.poll()``."""
    with contextlib.suppress(Exception):
        return handle.exitcode if hasattr(handle, "exitcode") else handle.poll()
    return None
