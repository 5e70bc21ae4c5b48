"""Run one ``rpg-train`` pipeline for an E2E test: its own process group (the whole Ray tree is
killed on a timeout); a failure shows the run's first error, then the log's end (run_log.explain)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from run_log import explain

REPO = Path(__file__).resolve().parents[2]


def run_pipeline(argv: list[str], env: dict[str, str], timeout: float) -> str:
    """The combined stdout/stderr of ``argv`` run from the repository root; fails the test on a
    timeout or a non-zero exit."""
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"rpg-train timed out after {timeout}s; {explain(log, 'rpg-train')}")
    assert proc.returncode == 0, f"rpg-train exited {proc.returncode}; {explain(log, 'rpg-train')}"
    return log
