"""Debug hold points: stop a run at an exact moment so that a test can kill it there (not by luck).

Off unless ``RPG_HOLD_AT`` is set (``POINT:N[,POINT:N...]``; the CPU backend and ``RAY_ADDRESS`` runs
forward ``RPG_*`` variables to every worker). When the code reaching ``POINT`` with count ``N`` calls
:func:`hold`, it prints one line, creates ``held_<POINT>_<N>`` in ``RPG_HOLD_DIR`` (when set) and
sleeps until the process is killed. Points:

* ``commit`` (the trainer, ``extras.checkpoint``): global step N's checkpoint is written, its
  completeness markers are not;
* ``optimizer_step`` (a policy worker with ``RPG_STEP_DUMP_DIR``, ``extras.step_dump``): right before
  this process's N-th optimizer step, in the middle of a training step;
* any name a test's own code uses (the tests' reward file holds at its N-th call, mid-rollout).

A hold changes nothing that is computed; it only never returns.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ENV = "RPG_HOLD_AT"
ENV_DIR = "RPG_HOLD_DIR"


def wanted(point: str, n: int) -> bool:
    """Whether ``RPG_HOLD_AT`` names ``point:n``."""
    spec = os.environ.get(ENV, "")
    return f"{point}:{n}" in {s.strip() for s in spec.split(",")}


def hold(point: str, n: int) -> None:
    """Never return if ``RPG_HOLD_AT`` names ``point:n`` (see the module docstring); else nothing."""
    if not wanted(point, n):
        return
    print(f"[rpg] hold: {point} {n} reached ({ENV}); waiting to be killed", file=sys.stderr, flush=True)
    folder = os.environ.get(ENV_DIR)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder, f"held_{point}_{n}").write_text(str(os.getpid()))
    while True:
        time.sleep(3600)
