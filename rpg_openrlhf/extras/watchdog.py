"""A dead Ray actor ends the run with one line, instead of a hang (driver side, stock and RPG runs).

A worker that dies mid-step (killed for memory, its node gone) can leave its peers blocked in a
collective and the trainer in a ``ray.get`` forever. :func:`start` (after Ray is up) runs a thread that
reads this job's actor table every ``interval`` seconds (``ray._private.state.actors``: the GCS itself);
on the first actor that died for any reason but an intended exit it interrupts the main thread, again
every ``interval`` until the run has reported it. :func:`reporting` (around the run) then prints one
line naming the actor, where it ran and why it died, and the last complete checkpoint, and exits with
status 1. A run that failed otherwise with a dead actor behind it is reported the same way.

Independent of how the process was started: ``cmd &``, ``nohup`` or a batch script inherit SIGINT
*ignored*, and ``_thread.interrupt_main`` then does nothing; so :meth:`Watchdog.start` installs a SIGINT
handler that raises ``KeyboardInterrupt`` once an actor has died and otherwise does what the inherited
disposition did. If the death is still unreported ``grace`` seconds (15) after it was seen (a library
took SIGINT over, code swallows the interrupt), the thread prints the line itself, shuts Ray down
(bounded) and exits with status 1. The kill is seen within ``interval`` (1 s) plus one table read.

A stop asked for ends the same way: SIGTERM (a batch scheduler's stop; Ray's own handler made it a
SIGABRT while the workers committed one more step) and Ctrl-C raise ``KeyboardInterrupt``;
:func:`reporting` first releases the run's lock (``extras.checkpoint``: no further commit), then prints
one line with the last complete checkpoint and exits with 128 + the signal's number (143, 130).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

INTERVAL = 1.0
#: Seconds from a death seen to the watchdog ending the process itself, if the run has not reported it.
GRACE = 15.0
#: Actor deaths that are part of a normal run (a handle dropped, ``ray.kill``, ``exit_actor``).
INTENDED = ("OUT_OF_SCOPE", "REF_DELETED", "RAY_KILL", "INTENDED_USER_EXIT")
#: Class name fragments -> what the actor is in OpenRLHF's pipeline.
ROLES = (
    ("PolicyModelActor", "policy worker"),
    ("ReferenceModelActor", "reference worker"),
    ("CriticModelActor", "critic worker"),
    ("RewardModelActor", "reward worker"),
    ("Rollout", "rollout engine"),
    ("PPOTrainer", "trainer"),
)


def _death(info: dict[str, Any]) -> tuple[str, str]:
    """(reason, message) of a dead actor's ``DeathCause`` (a protobuf ``ActorDeathCause``)."""
    cause = info.get("DeathCause")
    if cause is None or not hasattr(cause, "WhichOneof"):
        return "UNSPECIFIED", ""
    kind = cause.WhichOneof("context")
    context = getattr(cause, kind) if kind else None
    if kind == "actor_died_error_context":
        reason = type(context).Reason.Name(context.reason)
        return reason, context.error_message
    if kind == "oom_context":
        return "OUT_OF_MEMORY", context.error_message
    return (kind or "UNSPECIFIED").upper(), getattr(context, "error_message", "") if context else ""


def describe(info: dict[str, Any]) -> str:
    """One line for a dead actor of Ray's actor table: role, class, pid, node, reason, first sentence."""
    name = (info.get("ActorClassName") or "actor").rsplit(".", 1)[-1]  # a class made in a function: its name
    role = next((r for fragment, r in ROLES if fragment in name), "Ray actor")
    address = info.get("Address") or {}
    reason, message = _death(info)
    first = " ".join(message.split()).split(". ")[0].rstrip(".")
    where = f"pid {info.get('Pid')}" + (f" on {address['IPAddress']}" if address.get("IPAddress") else "")
    return f"the {role} {name} ({where}) died: {reason}" + (f" ({first})" if first else "")


def dead_actors() -> list[dict[str, Any]]:
    """Actors of this job that died for another reason than an intended exit (Ray must be up)."""
    import ray
    from ray._private import state  # seam ray_actor_table

    job = ray.get_runtime_context().get_job_id()
    table = state.actors(job_id=ray.JobID.from_hex(job), actor_state_name="DEAD")
    return [info for info in table.values() if _death(info)[0] not in INTENDED]


class Watchdog:
    """The polling thread (daemon); ``died`` is the first dead actor's line, or None."""

    def __init__(
        self,
        interval: float = INTERVAL,
        poll: Callable[[], list[dict]] = dead_actors,
        last_checkpoint: Callable[[], str | None] = lambda: None,
        grace: float = GRACE,
        prog: str = "rpg-train",
    ) -> None:
        self.interval, self.poll, self.last_checkpoint = interval, poll, last_checkpoint
        self.grace, self.prog = grace, prog
        self.died: str | None = None
        #: The signal that asked the run to stop (SIGTERM; SIGINT: Ctrl-C), or None.
        self.stopped_by: signal.Signals | None = None
        self._ending = False  # the thread's last resort is under way (it prints the line)
        self.gcs_address: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no interrupt once stopped (the run ended, Ray shuts down)
        self._thread = threading.Thread(target=self._run, name="rpg-watchdog", daemon=True)

    def start(self) -> Watchdog:
        ray = sys.modules.get("ray")  # the cluster whose orphans a death leaves (never starts one)
        if ray is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                self.gcs_address = ray.get_runtime_context().gcs_address
        if threading.current_thread() is threading.main_thread():
            self._handle_sigint()
            signal.signal(signal.SIGTERM, self._on_sigterm)  # replaces Ray's (sys.exit in ray.get: SIGABRT)
        self._thread.start()
        return self

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A stop asked for (a batch scheduler's SIGTERM): as Ctrl-C, reported by :func:`reporting`."""
        self.stopped_by = signal.SIGTERM
        raise KeyboardInterrupt

    def _handle_sigint(self) -> None:
        """Make SIGINT a Python handler, whatever was inherited, so that ``interrupt_main`` reaches the
        main thread: after a death it raises ``KeyboardInterrupt``; before, it does what was there."""
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            if self.died is not None:
                raise KeyboardInterrupt
            if callable(previous):
                self.stopped_by = signal.SIGINT  # Ctrl-C (Python's handler raises KeyboardInterrupt)
                previous(signum, frame)
            elif previous == signal.SIG_DFL:  # the default disposition: the process ends
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            # SIG_IGN (a background or nohup start): a real Ctrl-C stays ignored

        signal.signal(signal.SIGINT, on_sigint)

    def stop(self) -> None:
        with self._lock:
            self._stop.set()

    def check(self) -> str | None:
        """Read the table now; the first dead actor's line (also kept in ``died``)."""
        if self.died is None:
            with contextlib.suppress(Exception):  # Ray already shut down: nothing to learn
                dead = self.poll()
                if dead:
                    self.died = describe(dead[0])
        return self.died

    def _run(self) -> None:
        # the driver blocks in ray.get: KeyboardInterrupt there, repeated until _report stops us
        seen: float | None = None
        while not self._stop.wait(self.interval):
            if self.check():
                seen = time.monotonic() if seen is None else seen
                with self._lock:
                    if self._stop.is_set():
                        return
                    if time.monotonic() - seen < self.grace:
                        _thread.interrupt_main(signal.SIGINT)
                        continue
                    self._ending = True  # the main thread never reported it: end the process from here
                    self._stop.set()
                self._end_process()
                return

    def _end_process(self) -> None:
        """The last resort: the run's one line, Ray shut down (at most 30 s), exit status 1."""
        print_death(self.prog, self)
        reap_engine_orphans(self.gcs_address)
        done = threading.Event()

        def shutdown() -> None:
            with contextlib.suppress(Exception):
                import ray

                ray.shutdown()
            done.set()

        threading.Thread(target=shutdown, daemon=True).start()
        done.wait(30)
        sys.stderr.flush()
        os._exit(1)


_current: Watchdog | None = None


def start(
    interval: float = INTERVAL,
    last_checkpoint: Callable[[], str | None] = lambda: None,
    prog: str = "rpg-train",
    grace: float = GRACE,
) -> Watchdog:
    """Start the driver's watchdog (once Ray is up, from the main thread); :func:`reporting` reports
    what it saw, with ``last_checkpoint()`` (the directory a resume would load, or None)."""
    global _current
    if _current is None:
        _current = Watchdog(interval, last_checkpoint=last_checkpoint, grace=grace, prog=prog).start()
    return _current


@contextlib.contextmanager
def reporting(prog: str) -> Iterator[None]:
    """Around the run: the watchdog's interrupt, or a failure with a dead actor behind it, becomes one
    line ``PROG: error: ...`` and exit status 1; anything else (Ctrl-C included) propagates unchanged."""
    try:
        yield
    except KeyboardInterrupt:
        if _current is None:
            raise  # before Ray: Python's own Ctrl-C
        if _current.died is None:
            _stopped(prog, _current)  # SIGTERM or Ctrl-C
        _report(prog, _current)
    except Exception as exc:
        if _current is None:
            raise
        if _current.check() is None:
            engine = engine_death(exc)
            if engine is None:
                raise
            _current.died = engine  # the engine actor lives on; its vLLM engine process did not
        _report(prog, _current, exc)
    finally:
        if _current is not None:
            _current.stop()


def engine_death(exc: BaseException) -> str | None:
    """The line for a failure caused by a rollout engine's dead vLLM engine process (``EngineDeadError``,
    e.g. its ``VLLM::EngineCore`` killed for memory), found anywhere in the chain; else None."""
    from rpg_openrlhf.common.cliutil import causes

    if any(cls.__name__ == "EngineDeadError" for e in causes(exc) for cls in type(e).__mro__):
        return "a rollout engine's vLLM engine process (VLLM::EngineCore) died: EngineDeadError"
    return None


def reap_engine_orphans(gcs_address: str | None) -> list[int]:
    """SIGKILL this machine's vLLM processes (``VLLM::EngineCore``, ``VLLM::Worker``) of the run's cluster.

    vLLM spawns them from the engine actor with ``RAY_ADDRESS`` set to the cluster's GCS address; when the
    actor is killed they are orphaned and nothing tells them (they held 2.5 GB for over a minute after
    the driver exited). Ray's shutdown does not know them. Only processes titled ``VLLM::`` whose
    environment names this cluster are touched; other nodes' are out of reach (their engines' own
    processes there). Returns the pids killed."""
    if not gcs_address:
        return []
    mark, killed = f"RAY_ADDRESS={gcs_address}".encode(), []
    for proc in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if not (proc / "cmdline").read_bytes().startswith(b"VLLM::"):
                continue
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def _resume_hint(watchdog: Watchdog) -> str:
    where = watchdog.last_checkpoint()
    resume = f"last complete checkpoint: {where}" if where else "no complete checkpoint yet"
    return f"{resume}; run the same command with --ckpt.load_enable to resume"


def print_death(prog: str, watchdog: Watchdog) -> None:
    """The run's one line about the dead actor and where a resume would start."""
    print(
        f"{prog}: error: {watchdog.died}; the run stopped ({_resume_hint(watchdog)})",
        file=sys.stderr,
        flush=True,
    )


def _stopped(prog: str, watchdog: Watchdog) -> None:
    """A stop asked for: the run's lock released first (its trainer commits no further step), one line,
    exit 128 + the signal (SIGTERM 143, Ctrl-C 130)."""
    from rpg_openrlhf.extras import checkpoint

    checkpoint.release_all()
    watchdog.stop()
    sig = watchdog.stopped_by or signal.SIGINT
    how = "Ctrl-C" if sig == signal.SIGINT else sig.name
    print(f"{prog}: stopped by {how} ({_resume_hint(watchdog)})", file=sys.stderr, flush=True)
    reap_engine_orphans(watchdog.gcs_address)
    raise SystemExit(128 + sig)


def _report(prog: str, watchdog: Watchdog, cause: BaseException | None = None) -> None:
    with watchdog._lock:  # the thread's last resort and this report never both print
        ending = watchdog._ending
        watchdog._stop.set()
    if ending:
        threading.Event().wait()  # the watchdog thread prints the line and ends the process
    print_death(prog, watchdog)
    reap_engine_orphans(watchdog.gcs_address)
    raise SystemExit(1) from cause
