"""The GPU node check (``python -m rpg_openrlhf.nodecheck``, ``make gpu-check``) on a CPU-only machine:
its arguments, its refusal without CUDA (one line naming the torch build), its training command through
rpg-train's real parser (``--dry-run``), and its measurements and report lines on a fake run directory,
passing and failing (a stale engine, a micro-batch run asleep). The run itself needs a GPU
(tests/test_gpu_tier.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.nodecheck import measure, pipeline

REPO = Path(__file__).resolve().parents[1]
SEQ_LEN = 8192


def nodecheck(*args: str) -> subprocess.CompletedProcess:
    """``python -m rpg_openrlhf.nodecheck ARGS`` as a user runs it (once, without CUDA, below)."""
    return subprocess.run([sys.executable, "-m", "rpg_openrlhf.nodecheck", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _in_process(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``rpg-nodecheck ARGS`` run in this process."""
    from rpg_openrlhf.nodecheck.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_without_cuda_stops_at_the_environment_line(tmp_path: Path) -> None:
    proc = nodecheck("--out", str(tmp_path / "check"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        f"FAIL  environment      torch {torch.__version__}: no CUDA",
        "0 passed, 1 failed: environment",
    ]


def test_long_check_sequence(monkeypatch) -> None:
    from rpg_openrlhf.common.sync_check import LENGTHS_ENV, SYNC_CHECK_SEQUENCES, check_sequences

    monkeypatch.setenv(LENGTHS_ENV, "100,300")
    seqs = check_sequences()
    assert [len(s) for s in seqs[len(SYNC_CHECK_SEQUENCES) :]] == [100, 300]
    assert all(3 <= t < 100 for t in seqs[-1]) and check_sequences() == seqs  # seeded


# ----------------------------------------------------------------------------- a fake run directory
def _sync_records(out: Path, stale: bool = False) -> None:
    """Three syncs: the actor moves by ~0.1 each time; the engine follows it within bf16-like noise,
    or (``stale``) keeps the previous sync's weights from the second sync on."""
    gen = torch.Generator().manual_seed(0)
    lengths = [12, 10, 8, SEQ_LEN]
    actors = []
    for sync in range(3):
        actors.append([-4.6 + 0.1 * sync * torch.randn(n - 1, generator=gen).double() for n in lengths])
        engine = actors[max(sync - 1, 0)] if stale else actors[sync]
        noisy = [a.float() + 1e-3 * torch.randn(a.shape, generator=gen) for a in engine]
        (out / "sync").mkdir(exist_ok=True)
        torch.save({"sync": sync + 1, "actor": actors[sync], "engines": [noisy], "forward": "cuda bfloat16 fa2"},
                   out / "sync" / f"sync_{sync + 1:05d}.pt")  # fmt: skip


def _events(out: Path, asleep: bool = False, boundaries: tuple[bool, ...] = (False, True)) -> None:
    """Three steps of len(boundaries) micro-batches each, DeepSpeed's accumulation boundary as given
    (the grad-boundary fix: only the last one; without it: every one)."""
    (out / "dump").mkdir(exist_ok=True)
    events = [{"event": "start", "time": 0.0}]
    for step in (1, 2, 3):
        t = 10.0 * step
        if not asleep:
            events.append({"event": "reload", "time": t})
        for i, boundary in enumerate(boundaries):
            events.append({"event": "train", "optimizer_step": step, "time": t + i})
            events.append(
                {"event": "boundary", "optimizer_step": step, "time": t + i + 0.5, "boundary": boundary}
            )
        events.append({"event": "offload", "time": t + 5})
    (out / "dump" / "events_rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def fake_run(
    out: Path, stale: bool = False, asleep: bool = False, boundaries: tuple[bool, ...] = (False, True)
) -> Path:
    out.mkdir(parents=True)
    _sync_records(out, stale)
    _events(out, asleep, boundaries)
    log = "".join(f"Global step {s}: reward 0.5\n" for s in (1, 2, 3))
    (out / "log.txt").write_text(log + "Sleep mode freed 0.52 GiB memory, 1.10 GiB memory is still in use.\n")
    (out / "memory.json").write_text(json.dumps({"peak_mib": {"0": 20480}, "total_mib": {"0": 81920}}))
    (out / "run.json").write_text(json.dumps({"returncode": 0, "wall_s": 95.0, "gpus": 1, "steps": 3}))
    return out


def test_report_of_a_passing_run(tmp_path: Path, capsys) -> None:
    rc, out, err = _in_process(capsys, "--report", str(fake_run(tmp_path / "ok")))
    lines = out.splitlines()
    assert rc == 0, out + err
    assert [line.split()[:2] for line in lines[:-1]] == [
        ["PASS", n]
        for n in ("pipeline", "engine-vs-actor", "deepspeed-sleep", "micro-batches", "vllm-sleep", "step-time",
                  "peak-memory")
    ]  # fmt: skip
    assert lines[-1] == "7 passed, 0 failed"
    gap = lines[1]
    for bucket in ("1-64:", "65-512:", "513-2048:", "2049-8191:"):
        assert bucket in gap, gap
    assert "2-2 packed micro-batches per optimizer step" in lines[3]
    assert "RL step 10.0, 10.0 s" in lines[5] and "GPU 0: 20.0 / 80.0 GiB" in lines[6]


def test_report_fails_a_stale_engine_and_a_step_run_asleep(tmp_path: Path) -> None:
    checks = {c.name: c for c in measure.analyse(fake_run(tmp_path / "bad", stale=True, asleep=True))}
    assert not checks["engine-vs-actor"].ok and not checks["deepspeed-sleep"].ok
    assert checks["engine-vs-actor"].values["buckets"][-1]["mean"] > measure.BF16_MEAN_TOL
    assert "rank 0: a micro-batch ran" in checks["deepspeed-sleep"].detail
    assert checks["pipeline"].ok and checks["step-time"].ok


@pytest.mark.parametrize(
    ("boundaries", "needle"),
    [((True, True), "boundaries [True, True]"), ((True,), "1 micro-batch (no dynamic split)")],
)
def test_micro_batches_fail_without_the_grad_boundary_fix_or_a_split(tmp_path, boundaries, needle) -> None:
    """Every micro-batch a boundary (DeepSpeed at gradient_accumulation_steps 1 without the fix: the
    optimizer gets the last micro-batch's gradient), or one micro-batch a step: FAIL, naming the step."""
    check = measure.micro_batches(fake_run(tmp_path / "run", boundaries=boundaries) / "dump")
    assert not check.ok and "rank 0 step 1" in check.detail and needle in check.detail, check.detail


def test_all_gpus_walk_the_8k_path(tmp_path: Path, capsys) -> None:
    """--gpus all on an 8-GPU node: the node check's rpg-train argv through OpenRLHF's parser and
    rpg-train's checks (--dry-run): a gpu plan that fits, flash-attention and vLLM sleep; actor ranks,
    reference ranks and engines on all 8 (NCCL across them), packed samples in dynamic micro-batches
    at ZeRO-2 (so rpg-train attaches the grad-boundary fix), 8 samples per rank."""
    from rpg_openrlhf.extras import grad_boundary
    from rpg_openrlhf.launch.cli import main
    from rpg_openrlhf.nodecheck.cli import gpus_arg, resolve_gpus

    assert gpus_arg("all") == "all" and gpus_arg("8") == 8 and resolve_gpus(3) == 3
    model, prompts = pipeline.prepare(tmp_path, SEQ_LEN)
    argv = pipeline.command(tmp_path, model, prompts, gpus=8, seq_len=SEQ_LEN, steps=3)
    assert argv[1:4] == ["-m", "rpg_openrlhf.launch.cli", "--backend"]
    main([*argv[3:], "--dry-run"])
    out = capsys.readouterr().out
    plan = json.loads(out[out.index("{") :])
    orl = plan["openrlhf"]
    assert plan["backend"] == "gpu" and plan["rpg"]["loss"] == "rkl" and plan["memory_plan"]["fits"]
    assert orl["ds"]["attn_implementation"] == "flash_attention_2" and orl["vllm"]["enable_sleep"] is True
    assert orl["data"]["max_len"] > SEQ_LEN
    assert json.loads((model / "config.json").read_text())["max_position_embeddings"] > SEQ_LEN
    gpus = (orl["actor"]["num_gpus_per_node"], orl["ref"]["num_gpus_per_node"], orl["vllm"]["num_engines"])
    assert gpus == (8, 8, 8)
    assert (
        orl["ds"]["packing_samples"] and orl["train"]["dynamic_batch_enable"] and orl["ds"]["zero_stage"] == 2
    )
    nested = SimpleNamespace(**{k: SimpleNamespace(**v) for k, v in orl.items() if isinstance(v, dict)})
    assert grad_boundary.needed(nested)
    samples = orl["rollout"]["batch_size"] * orl["rollout"]["n_samples_per_prompt"]
    assert samples == orl["train"]["batch_size"] == 8 * 8
    assert orl["train"]["max_tokens_per_gpu"] < 8 * 20 // 2  # a rank's samples (~20 tokens): 3+ micro-batches
    assert len(prompts.read_text().splitlines()) >= orl["rollout"]["batch_size"]
