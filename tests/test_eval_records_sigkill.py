"""rpg_eval.records and the runner under SIGKILL during batch evaluation and during record writing.

The eval runner's record store (rpg_eval.records) appends one json line per sample with one
write + fsync. After a SIGKILL at any moment, a rerun must resume with no lost and no
duplicated record, and a corrupt trailing record must be detected and repaired.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

WRITER = textwrap.dedent(
    """
    import sys
    from rpg_eval import records as rec
    path, start, pad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    i = start
    while True:
        # three records per append (one chunk), big enough to make torn writes likely
        batch = [{"key": f"k{i + j}", "pad": "x" * pad} for j in range(3)]
        rec.append(path, batch)
        print(" ".join(r["key"] for r in batch), flush=True)  # acknowledged only after append returned
        i += 3
    """
)


def _kill_writer_at_random(path: Path, start: int, seed: int) -> set[str]:
    """Start a writer, SIGKILL it at a random moment; return the acknowledged keys."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(start), "200000"], stdout=subprocess.PIPE, text=True
    )
    acked: set[str] = set()
    rng = random.Random(seed)
    try:
        target = rng.randint(2, 12)
        while len(acked) < target * 3:
            line = proc.stdout.readline()
            if not line:
                break
            acked.update(line.split())
        time.sleep(rng.random() * 0.05)  # land inside a write sometimes
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # lines printed before the kill but not yet read are acknowledged too
    acked.update(" ".join(proc.stdout.read().split()).split())
    return acked


def test_sigkill_during_record_writing_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    from rpg_eval import records as rec

    path = tmp_path / "samples.jsonl"
    acked: set[str] = set()
    for round_ in range(4):
        rec.repair(path)  # what `rpg-eval run` does before resuming
        acked |= _kill_writer_at_random(path, start=round_ * 10_000, seed=round_)
    rec.repair(path)
    keys = [r["key"] for r in rec.read(path)]
    dup = [k for k, n in Counter(keys).items() if n > 1]
    assert not dup, f"duplicated records: {dup[:5]}"
    assert not (acked - set(keys)), f"lost acknowledged records: {sorted(acked - set(keys))[:5]}"
    assert path.read_bytes().endswith(b"\n")
    assert all(len(r["pad"]) == 200_000 for r in rec.read(path))  # no half record survived


def _good(i: int) -> bytes:
    return (json.dumps({"key": f"k{i}"}) + "\n").encode()


@pytest.mark.parametrize(
    "tail",
    [b'{"key": "k9", "pa', b"\x00" * 4096, b'{"key": "k9"}'[:-1], b"\xff\xfe"],
    ids=["torn-json", "nul-filled-tail", "missing-brace", "garbage-bytes"],
)
def test_corrupt_unterminated_trailing_record_is_detected_and_repaired(tmp_path: Path, tail: bytes) -> None:
    from rpg_eval import records as rec

    path = tmp_path / "samples.jsonl"
    path.write_bytes(_good(1) + _good(2) + tail)
    assert rec.repair(path) == len(tail)
    assert [r["key"] for r in rec.read(path)] == ["k1", "k2"]
    assert rec.repair(path) == 0  # idempotent
    rec.append(path, [{"key": "k3"}])
    assert [r["key"] for r in rec.read(path)] == ["k1", "k2", "k3"]


def test_corrupt_record_in_the_middle_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    from rpg_eval import records as rec

    path = tmp_path / "samples.jsonl"
    path.write_bytes(_good(1) + b"{not json}\n" + _good(3))
    with pytest.raises(rec.RecordError, match=rf"{path}:2"):
        list(rec.read(path))


def test_torn_record_followed_by_another_writer(tmp_path: Path) -> None:
    """Writer A is SIGKILLed mid-record; writer B (another Ray task) appends afterwards: A's fragment is
    then a complete but invalid line, dropped by repair wherever it lies."""
    from rpg_eval import records as rec

    path = tmp_path / "samples.jsonl"
    rec.append(path, [{"key": "k1"}])
    with path.open("ab") as f:
        f.write(b'{"key": "torn-by-A", "pa')  # A's partial write
    rec.append(path, [{"key": "k2"}, {"key": "k3"}])  # B continues
    rec.repair(path)
    assert [r["key"] for r in rec.read(path)] == ["k1", "k2", "k3"]


# --------------------------------------------------------------------------- the real runner


def _eval_cmd(ckpts: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpts), "--out", str(out),
        "--benchmarks", "aime24", "--data-dir", str(SHARED_DATA), "--n", "2", "--limit", "3",
        "--max-tokens", "12", "--backend", "hf", "--device", "cpu", "--chunk", "1", "--no-summary",
    ]  # fmt: skip


def _records(out: Path) -> list[dict]:
    from rpg_eval import records as rec

    return list(rec.read(out / "samples.jsonl"))


def _key(r: dict) -> tuple:
    return (r["checkpoint"], r["benchmark"], r["problem_id"], r["sample_index"])


@pytest.mark.slow
def test_sigkill_during_batch_eval_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    """`rpg-eval run` SIGKILLed twice mid-run, then rerun: exactly the uninterrupted records."""
    if not (SHARED_DATA / "aime24.jsonl").is_file():
        pytest.fail(f"{SHARED_DATA}/aime24.jsonl is missing")
    from rpg_openrlhf.tinymodel import build_tiny_model

    ckpts = tmp_path / "ckpts"
    for step, seed in ((1, 0), (2, 1)):
        build_tiny_model(ckpts / f"global_step{step}_hf", seed=seed)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

    ref_out = tmp_path / "ref"
    subprocess.run(_eval_cmd(ckpts, ref_out), check=True, env=env, capture_output=True, timeout=600)
    reference = {_key(r): r for r in _records(ref_out)}
    assert len(reference) == 2 * 3 * 2

    out = tmp_path / "killed"
    for kill_after in (2, 7):  # records present when the SIGKILL lands
        proc = subprocess.Popen(
            _eval_cmd(ckpts, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        samples = out / "samples.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if samples.exists() and samples.read_bytes().count(b"\n") >= kill_after:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    subprocess.run(_eval_cmd(ckpts, out), check=True, env=env, capture_output=True, timeout=600)
    got = _records(out)
    keys = [_key(r) for r in got]
    assert len(keys) == len(set(keys)), "duplicated records after resume"
    assert set(keys) == set(reference), "lost records after resume"
    for r in got:
        k = _key(r)
        a = {x: v for x, v in r.items() if x not in ("checkpoint_path",)}
        b = {x: v for x, v in reference[k].items() if x not in ("checkpoint_path",)}
        assert a == b, f"resumed record {k} differs from the uninterrupted run's"
