"""A dead Ray actor ends the run with one line, instead of a hang (driver side, stock and RPG runs).

Without it, a worker that dies mid-step (killed for memory, its node gone) can leave the run waiting
forever: its peers block in a collective (gloo, NCCL) that never completes, and the trainer in a
``ray.get`` on those peers. :func:`start` (after Ray is up) runs a thread in the driver that reads
Ray's actor table of this job every ``interval`` seconds (``ray._private.state.actors``, the GCS
itself: the dashboard's state API is off on the CPU backend); on the first actor that died for any
reason but an intended exit it interrupts the driver's main thread, and again every ``interval``
until the run has reported it (an interrupt that lands in code that swallows it is not the last).
:func:`reporting` (around the run) then prints one line naming the actor, where it ran and why it
died, and the last complete checkpoint, and exits with status 1; Ray's shutdown stops the rest. A run that failed otherwise but
with a dead actor behind it (a ``ray.get`` that raised first) is reported the same way.

Bound: the kill is seen within ``interval`` (1 s) plus one read of the table; the driver then exits
after Ray's shutdown (measured in docs/training.md, "What survives a kill").
"""

from __future__ import annotations

import _thread
import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

INTERVAL = 1.0
#: Actor deaths that are part of a normal run (a handle dropped, ``ray.kill``, ``exit_actor``).
INTENDED = ("OUT_OF_SCOPE", "REF_DELETED", "RAY_KILL", "INTENDED_USER_EXIT")
#: Class name fragments -> what the actor is in OpenRLHF's pipeline.
ROLES = (
    ("PolicyModelActor", "policy worker"),
    ("ReferenceModelActor", "reference worker"),
    ("CriticModelActor", "critic worker"),
    ("RewardModelActor", "reward worker"),
    ("Rollout", "rollout engine"),
    ("LLMRayActor", "rollout engine"),
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
    ) -> None:
        self.interval, self.poll, self.last_checkpoint = interval, poll, last_checkpoint
        self.died: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no interrupt once stopped (the run ended, Ray shuts down)
        self._thread = threading.Thread(target=self._run, name="rpg-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

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
        while not self._stop.wait(self.interval):
            if self.check():
                with self._lock:
                    if not self._stop.is_set():
                        _thread.interrupt_main()


_current: Watchdog | None = None


def start(interval: float = INTERVAL, last_checkpoint: Callable[[], str | None] = lambda: None) -> Watchdog:
    """Start the driver's watchdog (once Ray is up); :func:`reporting` reports what it saw, with
    ``last_checkpoint()`` (the directory a resume would load, or None)."""
    global _current
    if _current is None:
        _current = Watchdog(interval, last_checkpoint=last_checkpoint).start()
    return _current


@contextlib.contextmanager
def reporting(prog: str) -> Iterator[None]:
    """Around the run: the watchdog's interrupt, or a failure with a dead actor behind it, becomes one
    line ``PROG: error: ...`` and exit status 1; anything else (Ctrl-C included) propagates unchanged."""
    try:
        yield
    except KeyboardInterrupt:
        if _current is None or _current.died is None:
            raise  # Ctrl-C, not the watchdog
        _report(prog, _current)
    except Exception as exc:
        if _current is None or _current.check() is None:
            raise
        _report(prog, _current, exc)
    finally:
        if _current is not None:
            _current.stop()


def _report(prog: str, watchdog: Watchdog, cause: BaseException | None = None) -> None:
    watchdog.stop()
    where = watchdog.last_checkpoint()
    resume = f"last complete checkpoint: {where}" if where else "no complete checkpoint yet"
    print(f"{prog}: error: {watchdog.died}; the run stopped ({resume}; run the same command with "
          "--ckpt.load_enable to resume)", file=sys.stderr, flush=True)  # fmt: skip
    raise SystemExit(1) from cause
