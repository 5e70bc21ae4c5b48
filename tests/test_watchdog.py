"""The driver's watchdog (rpg_openrlhf/extras/watchdog.py): an actor that dies while nobody waits on it
ends the run with one line within seconds; an intended exit does not; the line names what died.

The run is a real local Ray (tests/helpers/watchdog_driver.py): the main thread waits in ``ray.get`` on
an actor that does not answer for 10 minutes (a peer stuck in a collective), another actor is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HELPER = Path(__file__).resolve().parent / "helpers" / "watchdog_driver.py"


def _drive(mode: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the helper in its own process group (all of it killed on a timeout: a hang fails the test)."""
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the driver did not exit within 120 s:\n{err[-3000:]}")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    killed = [float(line.split()[1]) for line in out.splitlines() if line.startswith("killed ")]
    return done, (time.time() - killed[0]) if killed else float("nan")


def test_a_dead_actor_ends_a_stuck_driver_with_one_line() -> None:
    proc, since_kill = _drive("kill")
    print(f"kill -> driver exit: {since_kill:.1f} s (includes Ray's shutdown)")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("prog: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("prog: error: the policy worker PolicyModelActor (pid "), errors
    assert (
        " died: WORKER_DIED" in errors[0]
        and "last complete checkpoint: /ckpt/_actor/global_step2;" in errors[0]
    )
    assert "Traceback" not in proc.stderr
    assert since_kill < 60  # the peer would have answered after 600 s


def test_an_intended_exit_is_not_a_death() -> None:
    proc, _ = _drive("ray_kill")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("done"), proc.stderr[-3000:]


def test_the_line_names_role_place_and_cause() -> None:
    from ray.core.generated import common_pb2

    from rpg_openrlhf.extras.watchdog import describe

    context = common_pb2.ActorDiedErrorContext(
        reason=common_pb2.ActorDiedErrorContext.WORKER_DIED,
        error_message="The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR",
    )
    info = {
        "ActorClassName": "CPURolloutEngine",
        "Pid": 42,
        "Address": {"IPAddress": "10.0.0.1"},
        "DeathCause": common_pb2.ActorDeathCause(actor_died_error_context=context),
    }
    assert describe(info) == (
        "the rollout engine CPURolloutEngine (pid 42 on 10.0.0.1) died: WORKER_DIED "
        "(The actor is dead because its worker process has died)"
    )
    oom = common_pb2.ActorDeathCause(
        oom_context=common_pb2.OomContext(
            error_message="Task was killed due to the node running low on memory."
        )
    )
    assert describe({**info, "ActorClassName": "_RPGReferenceModelActor", "DeathCause": oom}).endswith(
        "died: OUT_OF_MEMORY (Task was killed due to the node running low on memory)"
    )


@pytest.mark.parametrize("name, role", [("StockPPOTrainer", "trainer"), ("Foo", "Ray actor")])
def test_roles(name: str, role: str) -> None:
    from rpg_openrlhf.extras.watchdog import describe

    assert describe({"ActorClassName": name, "Pid": 1}).startswith(
        f"the {role} {name} (pid 1) died: UNSPECIFIED"
    )


def test_an_interrupt_swallowed_by_the_main_thread_is_repeated(monkeypatch, capsys) -> None:
    """The main thread swallows the first KeyboardInterrupt (as library code catching it might); the
    watchdog interrupts again, and the run still ends with the one line and exit status 1."""
    from rpg_openrlhf.extras import watchdog

    dead = {"ActorClassName": "PolicyModelActor", "Pid": 7, "Address": {}, "DeathCause": None}
    dog = watchdog.Watchdog(interval=0.05, poll=lambda: [dead], last_checkpoint=lambda: None)
    monkeypatch.setattr(watchdog, "_current", dog)
    swallowed = 0
    with pytest.raises(SystemExit) as exc, watchdog.reporting("prog"):
        dog.start()
        while swallowed == 0:
            try:
                time.sleep(5)  # the first interrupt lands here and is swallowed
            except KeyboardInterrupt:
                swallowed += 1
        time.sleep(5)  # only a second interrupt ends this in time
        pytest.fail("no second interrupt")
    assert exc.value.code == 1 and swallowed == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["prog: error: the policy worker PolicyModelActor (pid 7) died: UNSPECIFIED; the run stopped "
                   "(no complete checkpoint yet; run the same command with --ckpt.load_enable to resume)"]  # fmt: skip
    time.sleep(0.2)
    assert not dog._thread.is_alive()  # stopped by the report: no interrupt after it
