"""The driver's watchdog (rpg_openrlhf/extras/watchdog.py): an actor that dies while nobody waits on it
ends the run with one line within seconds; an intended exit does not; the line names what died.

The run is a real local Ray (tests/helpers/watchdog_driver.py): the main thread waits in ``ray.get`` on
an actor that does not answer for 10 minutes (a peer stuck in a collective), another actor is killed;
it is started under ``nohup``. The other ways a run starts (a terminal, the background of a
non-interactive shell, a library that took SIGINT over) are the inherited dispositions the tests
without Ray below cover. The outcome must not depend on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HELPER = Path(__file__).resolve().parent / "helpers" / "watchdog_driver.py"


def _nohup() -> None:
    """A preexec_fn: the child inherits SIGINT, SIGQUIT and SIGHUP ignored, as ``nohup`` starts it."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _drive(mode: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the helper under ``nohup`` (SIGINT, SIGQUIT, SIGHUP ignored, stdin closed: the case where Python
    installs no SIGINT handler) in its own process group (all of it killed on a timeout: a hang fails)."""
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, stdin=subprocess.DEVNULL, preexec_fn=_nohup,
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


# A real Ray (about 37 s of wall time on two cores); the other starts (a terminal, the background, a library
# that swallows SIGINT) are the inherited dispositions of the in-process tests below.
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
    for name, role in (("StockPPOTrainer", "trainer"), ("Foo", "Ray actor")):  # no death cause
        assert describe({"ActorClassName": name, "Pid": 1}) == f"the {role} {name} (pid 1) died: UNSPECIFIED"


@pytest.fixture
def sigint_restored():
    """The test process's SIGINT handler, put back afterwards (the watchdog installs its own)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("inherited", ["handled", "ignored", "default"])
def test_an_interrupt_swallowed_by_the_main_thread_is_repeated(
    monkeypatch, capsys, sigint_restored, inherited: str
) -> None:
    """The main thread swallows the first KeyboardInterrupt (as library code catching it might); the
    watchdog interrupts again, and the run still ends with the one line and exit status 1: with SIGINT
    handled by Python, ignored (a background or nohup start) or at the OS default."""
    from rpg_openrlhf.extras import watchdog

    signal.signal(signal.SIGINT, {"handled": signal.default_int_handler, "ignored": signal.SIG_IGN,
                                  "default": signal.SIG_DFL}[inherited])  # fmt: skip
    dead = {"ActorClassName": "PolicyModelActor", "Pid": 7, "Address": {}, "DeathCause": None}
    dog = watchdog.Watchdog(interval=0.3, poll=lambda: [dead], last_checkpoint=lambda: None)
    monkeypatch.setattr(watchdog, "_current", dog)
    swallowed = 0
    with pytest.raises(SystemExit) as exc, watchdog.reporting("prog"):
        try:  # the first interrupt lands here, wherever the main thread is (a loaded machine), and is swallowed
            dog.start()
            time.sleep(10)
        except KeyboardInterrupt:
            swallowed += 1
        assert swallowed == 1, "no interrupt reached the main thread in 10 s"
        time.sleep(5)  # only a second interrupt ends this in time
        pytest.fail("no second interrupt")
    assert exc.value.code == 1 and swallowed == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["prog: error: the policy worker PolicyModelActor (pid 7) died: UNSPECIFIED; the run stopped "
                   "(no complete checkpoint yet; run the same command with --ckpt.load_enable to resume)"]  # fmt: skip
    time.sleep(0.2)
    assert not dog._thread.is_alive()  # stopped by the report: no interrupt after it


def test_sigint_before_a_death_keeps_what_was_inherited(sigint_restored) -> None:
    """Until an actor dies the watchdog's handler is invisible: Ctrl-C stays ignored where it was ignored
    and is a KeyboardInterrupt where Python handled it."""
    from rpg_openrlhf.extras import watchdog

    for inherited, expect in ((signal.SIG_IGN, None), (signal.default_int_handler, KeyboardInterrupt)):
        signal.signal(signal.SIGINT, inherited)
        dog = watchdog.Watchdog(interval=60, poll=lambda: [])
        dog.start()
        try:
            if expect is None:
                signal.raise_signal(signal.SIGINT)  # ignored: nothing happens
            else:
                with pytest.raises(expect):
                    signal.raise_signal(signal.SIGINT)
        finally:
            dog.stop()


LAST_RESORT = """
import sys, time
from rpg_openrlhf.extras import watchdog
dead = {"ActorClassName": "PolicyModelActor", "Pid": 7, "Address": {}, "DeathCause": None}
watchdog._current = watchdog.Watchdog(interval=0.1, poll=lambda: [dead], grace=1.0, prog="prog").start()
print("started", flush=True)
with watchdog.reporting("prog"):
    while True:
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # code that swallows every interrupt
"""


def test_a_main_thread_that_never_reports_is_ended_by_the_watchdog() -> None:
    """Whatever the main thread does with the interrupts, ``grace`` seconds after the death the watchdog
    prints the line itself and ends the process with status 1 (from its own thread: the inherited
    SIGINT disposition plays no part; started as under nohup)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", LAST_RESORT], capture_output=True, text=True, timeout=60,
        preexec_fn=_nohup, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "prog: error: the policy worker PolicyModelActor (pid 7) died: UNSPECIFIED; the run stopped "
        "(no complete checkpoint yet; run the same command with --ckpt.load_enable to resume)"
    ), proc.stderr[-3000:]
    assert proc.stderr.count("prog: error:") == 1
    assert time.monotonic() - t0 < 40


def test_a_dead_engine_process_is_one_line(monkeypatch, capsys) -> None:
    """A rollout engine actor whose vLLM engine process died (its ``VLLM::EngineCore`` killed) answers
    with ``EngineDeadError`` inside a ``RayTaskError``; the actor itself lives, so the table shows no death:
    the run still ends with one line and status 1, not a traceback. Anything else propagates."""
    import ray.exceptions

    from rpg_openrlhf.extras import watchdog

    class EngineDeadError(Exception):  # vllm.v1.engine.exceptions's class, by name (vLLM not imported)
        pass

    dog = watchdog.Watchdog(interval=60, poll=lambda: [], last_checkpoint=lambda: "/ckpt/global_step3")
    monkeypatch.setattr(watchdog, "_current", dog)
    wrapped = ray.exceptions.RayTaskError("generate", "Traceback ...", EngineDeadError("EngineCore died"))
    with pytest.raises(SystemExit) as exc, watchdog.reporting("prog"):
        raise wrapped.as_instanceof_cause()
    assert exc.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "prog: error: a rollout engine's vLLM engine process (VLLM::EngineCore) died: EngineDeadError; the run "
        "stopped (last complete checkpoint: /ckpt/global_step3; run the same command with --ckpt.load_enable to resume)"
    ]
    dog.died = None
    with pytest.raises(ValueError), watchdog.reporting("prog"):
        raise ValueError("not an engine")


def test_a_death_reaps_the_clusters_orphaned_vllm_processes() -> None:
    """An engine actor killed leaves its ``VLLM::EngineCore`` / ``VLLM::Worker`` children running; the report
    kills those whose environment names the run's cluster (vLLM sets ``RAY_ADDRESS`` to its GCS address
    before spawning them), and nothing else: not another cluster's, not a process of another title."""
    from rpg_openrlhf.extras.watchdog import reap_engine_orphans

    def spawn(title: str, address: str) -> subprocess.Popen:
        env = {**os.environ, "RAY_ADDRESS": address}
        return subprocess.Popen(["bash", "-c", f"exec -a {title} sleep 300"], env=env)

    ours = [spawn("VLLM::EngineCore", "10.0.0.9:6379"), spawn("VLLM::Worker_TP0", "10.0.0.9:6379")]
    others = [spawn("VLLM::EngineCore", "10.0.0.9:6380"), spawn("python", "10.0.0.9:6379")]
    try:
        deadline = time.monotonic() + 10  # until exec has given each its title
        while time.monotonic() < deadline and not all(
            Path(f"/proc/{p.pid}/cmdline").read_bytes()[:4] in (b"VLLM", b"pyth") for p in ours + others
        ):
            time.sleep(0.05)
        assert sorted(reap_engine_orphans("10.0.0.9:6379")) == sorted(p.pid for p in ours)
        assert [p.wait(timeout=10) for p in ours] == [-signal.SIGKILL] * 2
        assert [p.poll() for p in others] == [None, None]
        assert reap_engine_orphans(None) == []
    finally:
        for p in ours + others:
            p.kill()
            p.wait()


_SIGTERM_DRIVER = """
import os, signal, sys, threading, time
from types import SimpleNamespace
import ray
from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS
from rpg_openrlhf.extras import watchdog
from rpg_openrlhf.extras import checkpoint as run_lock

ckpt, log = sys.argv[1], sys.argv[2]
args = SimpleNamespace(ckpt=SimpleNamespace(path=ckpt))
run_lock.acquire(args, ckpt)  # as checkpoint.prepare does before Ray
release = run_lock.release_all
def logged_release():
    release()
    with open(log, "a") as f:
        f.write(f"released {time.time()}\\n")
run_lock.release_all = logged_release
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=RAY_NODE_DEFAULTS)
watchdog.start(interval=0.5, last_checkpoint=lambda: "/ckpt/_actor/global_step2", prog="prog", grace=5)

@ray.remote(num_cpus=0)
class Trainer:  # what the trainer does before every begin/commit of a checkpoint: the fence
    def commit_steps(self, args, log):
        while True:
            checked = time.time()
            try:
                run_lock.fence(args)
            except run_lock.RunStopped:
                return "stopped"
            with open(log, "a") as f:
                f.write(f"committed {checked}\\n")
            time.sleep(0.05)

trainer = Trainer.remote()
ref = trainer.commit_steps.remote(args, log)
def stop():
    time.sleep(3)
    os.kill(os.getpid(), signal.SIGTERM)  # a batch scheduler's stop
threading.Thread(target=stop, daemon=True).start()
with watchdog.reporting("prog"):
    ray.get(ref)
"""


def test_sigterm_ends_the_driver_like_ctrl_c_and_the_trainer_commits_nothing_more(tmp_path: Path) -> None:
    """Issue 38: SIGTERM to the driver aborted with SIGABRT and Ray's stack dump, no ``rpg-train:`` line, and
    the workers committed one more step. Now: one line with the last complete checkpoint, exit 143, and
    the run's lock is released before it, so no fence check passes after the stop (a real local Ray)."""
    log = tmp_path / "log"
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_DRIVER, str(tmp_path / "ckpt"), str(log)],
                          capture_output=True, text=True, timeout=120, start_new_session=True)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.startswith("prog:")]
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert lines == [
        "prog: stopped by SIGTERM (last complete checkpoint: /ckpt/_actor/global_step2; run the same command "
        "with --ckpt.load_enable to resume)"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "SIGABRT" not in proc.stderr and "*** " not in proc.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    released = [float(t) for what, t in events if what == "released"]
    committed = [float(t) for what, t in events if what == "committed"]
    assert len(released) == 1 and committed, events  # the trainer committed while the run went on
    assert max(committed) < released[0], events  # and never after the stop
