"""The demo's subprocesses: their environment (offline, CPU, one math thread each), a run with its
output logged and followed, a time limit, and the whole process group killed at the end."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .config import REPO


def free_port() -> int:
    """A TCP port free on this host now (the SFT worker's torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment of the demo's subprocesses: offline, CPU, one math thread per process.

    One thread per process is much faster on a small shared CPU (OpenMP spinning across many
    processes on 2 cores costs 10-30x); a value the user set wins.
    """
    env = dict(os.environ)
    defaults = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DS_ACCELERATOR": "cpu",
        "DS_BUILD_OPS": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "WANDB_MODE": "offline",
        "PYTHONUNBUFFERED": "1",
    }
    ext = REPO / ".venv" / "torch_extensions"
    if ext.is_dir():
        defaults["TORCH_EXTENSIONS_DIR"] = str(ext)
    for key, value in defaults.items():
        env.setdefault(key, value)
    env.pop("RAY_ADDRESS", None)  # every run starts (and stops) its own local Ray
    return env


def run_logged(
    argv: list[str],
    log: Path,
    env: dict[str, str],
    timeout: float,
    what: str,
    on_line: Callable[[str], None] | None = None,
) -> str:
    """Run a subprocess in its own process group, tee its output to ``log``; returns the output.

    ``on_line`` sees every complete line as it is written (progress while the stage runs). On
    timeout or Ctrl-C the whole group (Ray's processes included) is killed. A non-zero exit is a
    RuntimeError quoting the end of the log.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_dies_with(os.getpid()))  # fmt: skip
        try:
            rc = _wait_following(proc, log, time.time() + timeout, on_line)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            _kill_group(proc)
            raise RuntimeError(f"{what}: stopped (timeout {timeout:.0f}s or interrupt); log: {log}") from None
        finally:
            _kill_group(proc, only_leftovers=True)
    out = log.read_text(errors="replace")
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}); log: {log}\n{out[-4000:]}")
    return out


def _wait_following(
    proc: subprocess.Popen, log: Path, deadline: float, on_line: Callable[[str], None] | None
) -> int:
    """Wait for ``proc``, handing each new complete line of ``log`` to ``on_line`` (every second)."""
    if on_line is None:
        return proc.wait(timeout=max(0.0, deadline - time.time()))
    offset, pending = 0, ""
    while True:
        rc = proc.poll()
        with log.open(errors="replace") as f:
            f.seek(offset)
            chunk = f.read()
            offset = f.tell()
        *lines, pending = (pending + chunk).split("\n")
        for line in lines:
            on_line(line)
        if rc is not None:
            return rc
        if time.time() > deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)
        time.sleep(1.0)


def _dies_with(parent: int) -> Callable[[], None]:
    """For the child, before it runs: SIGKILL when the demo dies, however (a SIGKILL to rpg-demo
    leaves no worker behind; it runs in a session of its own, out of reach of the demo's group)."""

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the demo died before the line above
            os._exit(1)

    return arm


def _kill_group(proc: subprocess.Popen, only_leftovers: bool = False) -> None:
    """Kill the process group of ``proc`` (its Ray workers too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    if not only_leftovers:
        proc.wait()
