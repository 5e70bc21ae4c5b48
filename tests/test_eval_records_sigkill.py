"""Guarantees 1 and 4 for rpg-eval's records (docs/contracts.md, "Threat model"): samples.jsonl is
append-only (one write + fsync per chunk); what a kill leaves (a torn line, last or mid-file, a NUL
tail) ``repair_counts`` drops before a run resumes, keeping every whole record once; ``rpg-eval run`` SIGKILLed
twice then resumed ends with exactly the uninterrupted run's records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rpg_eval import records as rec

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _good(i: int) -> bytes:
    return (json.dumps({"key": f"k{i}"}) + "\n").encode()


@pytest.mark.parametrize("append_first", [False, True], ids=["repaired", "appended-before-repair"])
@pytest.mark.parametrize(
    ("body", "removed"),
    [
        (_good(1) + _good(2) + b'{"key": "k9", "pa', 17),  # a torn last line
        (_good(1) + _good(2) + b"\x00" * 4096, 4096),  # a machine crash's NUL-filled tail
        (_good(1) + _good(2) + b"\xff\xfe", 2),
        (_good(1) + b'{"key": "torn", "pa\n' + _good(2), 20),  # torn by a Ray worker, another appended after
    ],
    ids=["torn", "nul-tail", "garbage-tail", "torn-mid-file"],
)
def test_a_torn_record_is_repaired_and_appending_goes_on(tmp_path: Path, body, removed, append_first) -> None:
    """Appended before a repair (another Ray worker), a record is not glued onto the torn fragment:
    the fragment becomes a line of its own (one byte more to drop)."""
    path = tmp_path / "samples.jsonl"
    path.write_bytes(body)
    if append_first:
        rec.append(path, [{"key": "k3"}])
    removed += append_first and not body.endswith(b"\n")
    cut, _, dropped = rec.repair_counts(path)
    assert cut + dropped == removed and rec.repair_counts(path) == (0, 0, 0)  # idempotent
    if not append_first:
        rec.append(path, [{"key": "k3"}])
    assert [r["key"] for r in rec.read(path)] == ["k1", "k2", "k3"]


def _eval_cmd(ckpts: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpts), "--out", str(out),
        "--benchmarks", "aime24", "--data-dir", str(SHARED_DATA), "--n", "2", "--limit", "3",
        "--max-tokens", "12", "--backend", "hf", "--device", "cpu", "--chunk", "1", "--no-summary",
    ]  # fmt: skip


def _key(r: dict) -> tuple:
    return (r["checkpoint"], r["benchmark"], r["problem_id"], r["sample_index"])


@pytest.mark.slow
def test_sigkill_during_batch_eval_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    """`rpg-eval run` SIGKILLed twice mid-run, then rerun: exactly the uninterrupted records."""
    from rpg_openrlhf.tinymodel import build_tiny_model

    ckpts = tmp_path / "ckpts"
    for step, seed in ((1, 0), (2, 1)):
        build_tiny_model(ckpts / f"global_step{step}_hf", seed=seed)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run(_eval_cmd(ckpts, tmp_path / "ref"), check=True, env=env, capture_output=True, timeout=600)
    reference = {_key(r): r for r in rec.read(tmp_path / "ref" / "samples.jsonl")}
    assert len(reference) == 2 * 3 * 2

    out, samples = tmp_path / "killed", tmp_path / "killed" / "samples.jsonl"
    for kill_after in (2, 7):  # records present when the SIGKILL lands
        proc = subprocess.Popen(
            _eval_cmd(ckpts, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if samples.exists() and samples.read_bytes().count(b"\n") >= kill_after:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    subprocess.run(_eval_cmd(ckpts, out), check=True, env=env, capture_output=True, timeout=600)
    got = list(rec.read(samples))
    assert sorted(map(_key, got)) == sorted(reference), "lost or duplicated records after resume"
    for r in got:
        a = {x: v for x, v in r.items() if x != "checkpoint_path"}
        assert a == {x: v for x, v in reference[_key(r)].items() if x != "checkpoint_path"}, _key(r)
