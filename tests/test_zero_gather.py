"""Multi-parameter ZeRO-3 gathers are complete on CPU (seam ``zero3_gather``, rpg_openrlhf/common/zero.py).

DeepSpeed 0.19.6 waits for the last of its per-parameter async all-gathers only; on gloo an earlier
one may not have landed. A two-rank ZeRO-3 run in CI got NaN log-probs at its first training step
from it (transformers' ZeRO-3 loading gathers weight and bias together). ``zero_gather_worker.py``
makes the race deterministic (an async all-gather's result lands only when its handle is waited
for) and counts wrong parameters against values set one parameter at a time. That every CPU-backend
worker applies the fix is checked in tests/test_cpu_backend.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def gather(tmp_path: Path, mode: str) -> list[dict]:
    out = tmp_path / f"{mode}.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "zero_gather_worker.py"), str(out), mode],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_multi_parameter_gather_waits_for_every_parameter(tmp_path: Path) -> None:
    original = gather(tmp_path, "original")
    patched = gather(tmp_path, "patched")
    for rank in original + patched:
        assert rank["params"] == 8 and rank["all_gathers"] == rank["params"], rank  # the deferral was used
    # upstream as installed: every parameter but the last is read before its all-gather landed
    assert [r["wrong"] for r in original] == [list(range(7))] * 2, original
    # the CPU backend's replacement: all eight are right on both ranks
    assert [r["wrong"] for r in patched] == [[], []], patched
