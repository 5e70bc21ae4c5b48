"""Guarantee 3 (docs/contracts.md, "Threat model"): one run per output.

A ``filelock`` lock per output folder, taken before the first write: a second run is refused at once
with one line "another PROG run (pid N) holds OUT", N the pid of the holder this test started; a
SIGKILLed holder blocks nothing (rpg-train's lock: tests/test_checkpoint_careless.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_io_ownership import FOLDER_WRITERS, made  # noqa: F401  (the fixture)

from rpg_openrlhf.common.atomic import LOCK_FILE, hold_lock

PROGS = {"run": "rpg-eval", "mechanisms": "rpg-mechanisms", "nodecheck": "rpg-nodecheck"}
HOLD = """
import sys, time
from rpg_openrlhf.common.atomic import hold_lock
with hold_lock(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(folder: Path, prog: str) -> subprocess.Popen:
    """Another process holding ``folder``'s lock (as a running command would)."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), prog], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.parametrize("cmd", ["table", "compare", "summarize", "run", "mechanisms", "nodecheck"])
def test_a_command_refuses_an_output_another_run_holds(made, tmp_path, capsys, cmd) -> None:  # noqa: F811
    out = tmp_path / "out"
    prog = PROGS.get(cmd, f"rpg-eval {cmd}")
    proc = _holder(out, prog)
    if cmd != "run":  # rpg-eval run's folder: empty but for the lock
        (out / ".rpg-owner").write_text(f"{prog}\n")
    try:
        start = time.time()
        rc = FOLDER_WRITERS[cmd](made, out)
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert rc == 2 and f": error: another {prog} run (pid {proc.pid}) holds {out}" in line
        assert time.time() - start < 60  # refused at once, not waited on
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with hold_lock(out, prog):  # the kernel dropped the dead holder's lock
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
