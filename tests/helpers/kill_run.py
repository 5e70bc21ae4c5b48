"""Start an ``rpg-train`` command, stop it at a hold point (``rpg_openrlhf.extras.hold``) and kill it there:
the whole process group (driver, Ray, every worker: what a scheduler's preemption does) or one process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from run_log import explain

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Segment:
    """One start of the command: its log, exit status and what was killed when."""

    name: str
    folder: Path
    log: str = ""
    returncode: int | None = None
    killed: str | None = None
    kill_to_exit: float | None = None
    seconds: float = 0.0
    notes: dict = field(default_factory=dict)

    @property
    def dump(self) -> Path:
        return self.folder / "dump"


class Started:
    """A running command in its own process group (``start_new_session``), output in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], segment: Segment) -> None:
        segment.folder.mkdir(parents=True, exist_ok=True)
        self.segment, self.t0 = segment, time.time()
        self.out = open(segment.folder / "log.txt", "w")  # noqa: SIM115 - closed in finish()
        env = {**env, "RPG_STEP_DUMP_DIR": str(segment.dump), "RPG_HOLD_DIR": str(segment.folder)}
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_held(self, held: str, timeout: float) -> int:
        """Wait for the hold file ``held`` (e.g. ``held_commit_2``); the pid of the process holding."""
        path = self.segment.folder / held
        deadline = time.time() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill_group()
                self.finish()
                pytest.fail(f"{self.segment.name}: never reached {held}; {explain(self.segment.log)}")
            time.sleep(0.1)
        time.sleep(0.2)  # the pid is written after the file is created
        return int(path.read_text() or 0)

    def kill_group(self, what: str | None = None) -> None:
        """SIGKILL every process of the run (Ray's own processes are in the driver's group)."""
        if what is not None:
            self.segment.killed = what
        with _gone:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.time() + 30
        while _group_alive(self.proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _group_alive(self.proc.pid), f"{self.segment.name}: processes survived SIGKILL"

    def kill_pid(self, pid: int, what: str, timeout: float) -> None:
        """SIGKILL one process and wait for the driver to exit (at most ``timeout`` s, then the group)."""
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        self.segment.killed = what
        try:
            self.proc.wait(timeout=timeout)
            self.segment.kill_to_exit = time.time() - killed_at
        except subprocess.TimeoutExpired:
            self.segment.kill_to_exit = None  # a hang
        deadline = time.time() + 10  # vLLM processes of the run still alive 10 s after the driver exited
        while (left := _vllm_alive(self.proc.pid)) and time.time() < deadline:
            time.sleep(0.2)
        self.segment.notes["left_behind"] = left
        self.kill_group()  # whatever Ray left behind

    def wait_exit(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            self.finish()
            pytest.fail(f"{self.segment.name}: timed out after {timeout}s; {explain(self.segment.log)}")

    def finish(self) -> Segment:
        self.out.close()
        self.segment.log = (self.segment.folder / "log.txt").read_text(errors="replace")
        self.segment.returncode = self.proc.returncode
        self.segment.seconds = time.time() - self.t0
        return self.segment


#: A process that exited meanwhile.
_gone = contextlib.suppress(ProcessLookupError, FileNotFoundError, PermissionError)


def _titles(group: int) -> dict[int, str]:
    """pid -> command line of the live (not zombie) processes of ``group``."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with _gone:
                if (
                    os.getpgid(int(p.name)) == group
                    and (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                ):
                    out[int(p.name)] = (
                        (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    )
    return out


def _vllm_alive(group: int) -> list[str]:
    """Titles of ``group``'s live vLLM processes (``VLLM::EngineCore``, ``VLLM::Worker``)."""
    return [title.strip() for title in _titles(group).values() if title.startswith("VLLM::")]


def _group_alive(group: int) -> bool:
    """Some process of ``group`` still runs (zombies waiting to be reaped do not count)."""
    return bool(_titles(group))
