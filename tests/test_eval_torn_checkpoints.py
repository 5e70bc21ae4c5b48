"""rpg-eval never reads a torn checkpoint of a training run (issue #20): ``rpg-eval run`` over a run's
checkpoint directory evaluates the committed ``global_step<N>_hf`` and names the others (being written, or
left half-written by a kill) as skipped; the next run over the same checkpoints and output picks one up
once the trainer committed it. Tiny models, the hf backend, one problem, one sample."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras.checkpoints.commit import commit

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.slow


def rpg_eval(ckpt: Path, out: Path) -> subprocess.CompletedProcess:
    argv = [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpt), "--out", str(out),
        "--benchmarks", "aime24", "--n", "1", "--backend", "hf", "--data-dir", str(DATA), "--limit", "1",
        "--max-tokens", "4", "--run", "tiny", "--device", "cpu",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600)


def evaluated(out: Path) -> list[str]:
    lines = (out / "samples.jsonl").read_text().splitlines()
    return sorted({json.loads(line)["checkpoint"] for line in lines if line.strip()})


def test_a_torn_checkpoint_is_skipped_then_picked_up_once_committed(tmp_path: Path, shared_data) -> None:
    from rpg_openrlhf.tinymodel import build_tiny_model

    run, out = tmp_path / "ckpt", tmp_path / "eval"
    ck.declare(run)  # what rpg-train writes when the run starts
    for step in (1, 2, 3):
        build_tiny_model(run / f"global_step{step}_hf", seed=step)
    commit(run, "global_step1", 1)  # committed; step 2 fully written but not yet; step 3 torn:
    commit(run, "global_step3", 3)
    weights = run / "global_step3_hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # the marker's sizes no longer hold

    first = rpg_eval(run, out)
    assert first.returncode == 0, first.stderr[-3000:]
    skipped = [line for line in first.stderr.splitlines() if line.startswith("[rpg-eval] skipped")]
    assert [Path(line.split()[2].rstrip(":")).name for line in skipped] == [
        "global_step2_hf",
        "global_step3_hf",
    ]
    assert evaluated(out) == ["global_step1_hf"]

    commit(run, "global_step2", 2)  # the trainer's commit, after the save returned
    second = rpg_eval(run, out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert evaluated(out) == ["global_step1_hf", "global_step2_hf"]
    assert (
        "global_step2_hf: incomplete" not in second.stderr and "global_step3_hf: incomplete" in second.stderr
    )
