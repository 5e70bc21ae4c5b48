"""End to end on CPU: tiny HF checkpoints -> lm-eval (hf backend) -> records -> tables;
resume after SIGKILL; Ray with logical GPUs; the shipped task yamls on their own."""

from __future__ import annotations

import csv
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
from rpg_eval.data import load_benchmark
from rpg_eval.graders import grade
from rpg_eval.run import lm_models
from rpg_eval.run.runner import RunConfig, run

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STEPS = (10, 20, 30)
N, LIMIT, MAX_TOKENS = 4, 5, 16

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run ~5x faster on one thread on a busy 2-core machine; every run of
    this module (in-process, subprocess, Ray workers) uses one thread, so their
    floating-point results, and hence samples, are identical."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rpg_openrlhf.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("ckpts")
    for s in STEPS:
        build_tiny_model(root / f"global_step{s}_hf", seed=s)
    return root


def _cfg(ckpts: Path, out: Path, **kw) -> RunConfig:
    """The run of _cli_args (chunk 5 unless given)."""
    base = dict(
        checkpoints=str(ckpts), out=str(out), benchmarks=["aime24", "aime25", "amc23"], n=N, backend="hf",
        data_dir=str(DATA), limit=LIMIT, max_tokens=MAX_TOKENS, run="tiny", chunk=5, device="cpu"
    )  # fmt: skip
    return RunConfig(**{**base, **kw})


def _cli_args(ckpts: Path, out: Path, chunk: int) -> list[str]:
    return [
        "run", "--checkpoints", str(ckpts), "--out", str(out), "--benchmarks", "aime24,aime25,amc23",
        "--n", str(N), "--backend", "hf", "--data-dir", str(DATA), "--limit", str(LIMIT),
        "--max-tokens", str(MAX_TOKENS), "--run", "tiny", "--chunk", str(chunk), "--device", "cpu"
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference(ckpt_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run (one lm-eval call per checkpoint and benchmark)."""
    out = tmp_path_factory.mktemp("ref")
    res = run(_cfg(ckpt_root, out))
    assert res["written"] == len(STEPS) * 3 * LIMIT * N
    return out


def test_end_to_end_records_and_tables(reference: Path, ckpt_root: Path) -> None:
    records = list(rec.read(reference / "samples.jsonl"))
    assert len(records) == len(STEPS) * 3 * LIMIT * N
    # Paths are kept relative to the run folder: a copied run folder (results/ in a clone) names the same files.
    meta = json.loads((reference / "run.json").read_text())
    for name, info in meta["checkpoints"].items():
        assert (
            not os.path.isabs(info["path"])
            and (reference / info["path"]).resolve() == (ckpt_root / name).resolve()
        )
    assert {(reference / r["checkpoint_path"]).resolve() for r in records} == {
        ckpt_root / f"global_step{s}_hf" for s in STEPS
    }
    assert {(reference / i["source"]).resolve() for i in meta["data"].values()} == {DATA.resolve()}
    keys = {(r["checkpoint"], r["benchmark"], r["problem_id"], r["sample_index"]) for r in records}
    assert len(keys) == len(records)  # no duplicates
    for bench in ("aime24", "aime25", "amc23"):
        ids = [p.id for p in load_benchmark(DATA, bench)[:LIMIT]]
        assert sorted({r["problem_id"] for r in records if r["benchmark"] == bench}) == sorted(ids)
    assert set(records[0]) - {"response_tokens"} == {
        "run", "checkpoint", "checkpoint_path", "step", "benchmark", "task", "problem_id", "problem_index",
        "sample_index", "prompt_style", "prompt_hash", "gold", "response", "extracted", "correct",
        "error_math_verify", "seed", "sampling"
    }  # fmt: skip
    assert records[0]["sampling"] == {"backend": "hf", "n": N, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                      "max_tokens": MAX_TOKENS}  # fmt: skip
    assert {r["step"] for r in records} == set(STEPS)
    # The k samples of a problem differ (all k scored, not k copies of the first).
    by_problem = defaultdict(list)
    for r in records:
        by_problem[(r["checkpoint"], r["benchmark"], r["problem_id"])].append(r["response"])
    assert all(len(set(v)) > 1 for v in by_problem.values())
    # Verdicts in the records are the graders' verdicts on the stored responses.
    for r in records[:: len(records) // 20]:
        for g in ("math_verify", "paper"):
            v = grade(r["response"], r["gold"], g)
            assert (v.correct, v.extracted) == (r["correct"][g], r["extracted"][g])
    # summary.csv / last_best.csv from these records: tests/test_eval_metrics.py (Last / Best by hand)
    assert len(list(csv.DictReader((reference / "summary.csv").open()))) == len(STEPS) * 3 * 2


def _count_lines(p: Path) -> int:
    return p.read_bytes().count(b"\n") if p.exists() else 0


def test_resume_after_sigkill_equals_uninterrupted(
    reference: Path,
    ckpt_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path_factory.mktemp("killed")  # beside the reference: the same relative checkpoint paths
    total = len(STEPS) * 3 * LIMIT * N
    # Smaller chunks than the reference: records must not depend on chunking.
    proc = subprocess.Popen([sys.executable, "-m", "rpg_eval.cli", *_cli_args(ckpt_root, out, chunk=2)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + 400
    try:
        # Kill once the second checkpoint has started: one unit finished, one partial.
        while (
            _count_lines(samples) < LIMIT * N * 3 + 2 * N
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done_lines = _count_lines(samples)
    assert 0 < done_lines < total, "the run must be killed mid-way"
    # Make the damage worse than a kill between writes: drop two samples of the last
    # problem and leave a torn half line.
    lines = samples.read_bytes().split(b"\n")[:-1]
    samples.write_bytes(b"\n".join(lines[:-2]) + b"\n" + lines[-2][: len(lines[-2]) // 2])
    before = list(rec.read(samples))
    have = defaultdict(set)
    for r in before:
        have[(r["checkpoint"], r["benchmark"], r["problem_id"])].add(r["sample_index"])
    incomplete = sum(1 for v in have.values() if len(v) < N) + (len(STEPS) * 3 * LIMIT - len(have))

    loaded, generated = [], []
    real_make_lm, real_gen = lm_models.make_lm, lm_models.RPGHFLM.generate_until

    def counting_make_lm(backend, path, *a, **kw):
        loaded.append(Path(path).name)
        return real_make_lm(backend, path, *a, **kw)

    def counting_gen(self, requests, disable_tqdm=False):
        generated.extend({id(r): (r.doc["benchmark"], r.doc["id"]) for r in requests}.values())
        return real_gen(self, requests, disable_tqdm)

    monkeypatch.setattr(lm_models, "make_lm", counting_make_lm)
    monkeypatch.setattr(lm_models.RPGHFLM, "generate_until", counting_gen)
    res = run(_cfg(ckpt_root, out, chunk=2))
    assert res["written"] == total - len(before)
    assert len(generated) == incomplete  # only problems that lacked samples
    finished_ckpts = {
        c for c in {k[0] for k in have} if sum(len(v) for k, v in have.items() if k[0] == c) == 3 * LIMIT * N
    }
    assert finished_ckpts and not finished_ckpts & set(loaded)  # finished checkpoints never reloaded
    assert samples.read_bytes() == (reference / "samples.jsonl").read_bytes()
    assert (out / "summary.csv").read_text() == (reference / "summary.csv").read_text()
    # A second resume has nothing to do.
    generated.clear()
    assert run(_cfg(ckpt_root, out, chunk=2))["written"] == 0 and not generated


def test_resume_refuses_other_settings(reference: Path, ckpt_root: Path) -> None:
    with pytest.raises(ValueError, match=r"made differently: --n 4 -> 2 "):
        run(_cfg(ckpt_root, reference, n=2))


def test_ray_one_checkpoint_per_logical_gpu(reference: Path, ckpt_root: Path, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from rpg_openrlhf.common.ray_python import worker_python
    from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS

    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}, **worker_python()},  # any checkout path
        _system_config=RAY_NODE_DEFAULTS,  # workers un-niced: they do the work (a loaded machine)
    )
    try:
        out = tmp_path / "ray"
        ckpts = ckpt_root / "global_step[12]0_hf"
        res = run(_cfg(ckpts, out, benchmarks=["amc23"], limit=2, ray=True, summarize=False))
    finally:
        ray.shutdown()
    got = list(rec.read(out / "samples.jsonl"))
    assert res["written"] == len(got) == 2 * 2 * N
    key = lambda r: (r["checkpoint"], r["problem_id"], r["sample_index"])  # noqa: E731
    ref = {key(r): r for r in rec.read(reference / "samples.jsonl") if r["benchmark"] == "amc23"}
    # Same per-problem seeds: the Ray workers reproduce the reference samples.
    for r in got:
        assert r["response"] == ref[key(r)]["response"]


def test_shipped_task_yamls_with_env_data_dir(ckpt_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lm_eval --model hf --tasks rpg_amc23_dapo --include_path <tasks>` with RPG_EVAL_DATA_DIR."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    from rpg_eval.run.taskgen import TASKS_DIR

    monkeypatch.setenv("RPG_EVAL_DATA_DIR", str(DATA / "rpg_paper_eval"))
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    res = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={ckpt_root / 'global_step10_hf'},device=cpu",
        tasks=["rpg_amc23_dapo"],
        task_manager=tm,
        limit=1,
        gen_kwargs={"max_gen_toks": 4},
        batch_size=32,
        log_samples=True,
        apply_chat_template=True,
        verbosity="ERROR",
    )
    metrics = {f"{m},all_samples" for m in ("mean_at_k", "paper_mean_at_k", "pass_at_32", "verdicts")}
    assert metrics <= set(res["results"]["rpg_amc23_dapo"])
    sample = res["samples"]["rpg_amc23_dapo"][0]
    assert len(sample["filtered_resps"][0]) == 32  # all 32 repeats scored
    v = json.loads(sample["verdicts"])
    assert len(v["math_verify"]) == len(v["paper"]) == len(v["extracted_paper"]) == 32
    assert "Answer: $Answer" in sample["arguments"][0][0]
