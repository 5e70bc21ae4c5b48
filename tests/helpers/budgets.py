"""How long a test waits for the real pipeline (Ray, DeepSpeed ranks, vLLM engines) before it calls
it hung: derived from measured start times on a loaded machine, not from a quiet one.

One start of ``rpg-train`` (driver, Ray, an engine, policy and reference workers, through a few steps)
measured on this 2-core machine, in ``tests/test_e2e_preemption.py``:
- quiet: 65 s a start;
- loaded: up to 394 s (load 5-20) and up to 300 s (two xdist workers each running a pipeline beside
  other work, load 14-31); 64-267 s beside three other pipeline files (load 2-33).
"""

from __future__ import annotations

#: The slowest loaded start measured (above).
LOADED_START_S = 394
#: What one start may take: 1.5 x the slowest loaded start, in whole minutes (600 s).
START_S = 60 * round(1.5 * LOADED_START_S / 60)


def starts(n: int) -> int:
    """The time limit of a test (or module fixture) that starts the pipeline ``n`` times, one after another."""
    return n * START_S
