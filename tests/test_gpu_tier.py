"""The GPU tier (``pytest -m gpu``, ``make test-gpu``): the CPU suite's E2E checks on CUDA, with NCCL,
flash-attention, bf16 vLLM engines and both sleeps; collected everywhere, skipped without CUDA (the
reason names the torch build). The node check's lines pass (1 GPU); tests/test_e2e_ranks.py's runs
with ``--backend gpu``: ZeRO-2 colocated with both sleeps (2 GPUs: engine-vs-actor log-probs after
every sync in bf16, the gradient against the RPG objective) and ZeRO-3 with a reference refresh and a
resume (5 GPUs). Two tests run everywhere: the skipping itself, and each GPU run's command through
``--dry-run`` on the gpu backend. GPU tolerances are not measured yet (no GPU was available).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _no_cuda_reason() -> str | None:
    if torch.cuda.is_available():
        return None
    from rpg_openrlhf.launch.backend import torch_build

    return f"the GPU tier needs CUDA: {torch_build()}"


def _needs(gpus: int):
    """The tier's marks: gpu (selected by -m gpu), e2e and slow, skipped without ``gpus`` CUDA devices."""
    reason = _no_cuda_reason()
    if reason is None and torch.cuda.device_count() < gpus:
        reason = f"needs {gpus} CUDA devices, {torch.cuda.device_count()} visible"

    def mark(test):
        for m in (pytest.mark.gpu, pytest.mark.e2e, pytest.mark.slow,
                  pytest.mark.skipif(reason is not None, reason=reason or "")):  # fmt: skip
            test = m(test)
        return test

    return mark


#: rpg-train flags that turn test_e2e_ranks' CPU runs into GPU runs (the later --backend wins). vLLM
#: at 0.3 of the GPU, as the node check: its default 0.95 leaves no room for the colocated models
#: (the memory plan refuses it).
GPU_FLAGS = ("--backend", "gpu", "--ds.attn_implementation", "flash_attention_2", "--ds.param_dtype", "bf16",
             "--vllm.gpu_memory_utilization", "0.3")  # fmt: skip
#: GPUs each run asks for: ZeRO-2 colocates actor, reference and engines on the actor's 2; ZeRO-3
#: gives the 2 actor ranks, the 2 reference ranks and its engine GPUs of their own.
ZERO2_GPUS, ZERO3_GPUS = 2, 5


@pytest.fixture(scope="module")
def gpu_env():
    """The GPU path's environment: none of the CPU settings conftest.py and the Makefile export."""
    with pytest.MonkeyPatch.context() as mp:
        for key in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR"):
            mp.delenv(key, raising=False)
        yield


@_needs(1)
def test_node_check_passes(tmp_path: Path, gpu_env) -> None:
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, "-m", "rpg_openrlhf.nodecheck", "--gpus", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + (out / "log.txt").read_text()[-4000:]


@pytest.fixture(scope="module")
def ranks(gpu_env):
    import test_e2e_ranks as cpu_ranks  # tests/ is on sys.path (rootdir-relative test modules)

    return cpu_ranks


@pytest.fixture(scope="module")
def zero2_gpu(ranks, model_and_prompts_gpu, tmp_path_factory) -> dict:
    return ranks.zero2_run(tmp_path_factory.mktemp("gpu_ranks_zero2"), model_and_prompts_gpu, GPU_FLAGS)


@pytest.fixture(scope="module")
def model_and_prompts_gpu(ranks, tmp_path_factory):
    return ranks.build_model_and_prompts(tmp_path_factory.mktemp("gpu_ranks_model"))


@_needs(ZERO2_GPUS)
def test_gpu_zero2_colocated_sync_gradient_and_sleep(ranks, zero2_gpu: dict) -> None:
    from engine_sync import assert_engines_follow_actor

    from rpg_openrlhf.nodecheck.measure import BF16_MAX_TOL, deepspeed_sleep, vllm_sleep

    assert vllm_sleep(zero2_gpu["log"]).ok  # vLLM's own sleep (the CPU backend has none)
    sleep = deepspeed_sleep(zero2_gpu["run"] / "dump")
    assert sleep.ok and sleep.detail.startswith("2 actor rank(s)"), sleep.detail
    # bf16 engines against a bf16 flash-attention forward; a stale engine would be off by the move
    assert_engines_follow_actor(zero2_gpu["run"] / "sync", syncs=2, tol=BF16_MAX_TOL, moved=BF16_MAX_TOL)
    print(f"GPU ZeRO-2 gradient relative errors {ranks.check_zero2(zero2_gpu)}")


@_needs(ZERO3_GPUS)
def test_gpu_zero3_refresh_and_resume(ranks, model_and_prompts_gpu, tmp_path_factory) -> None:
    run = ranks.zero3_runs(
        tmp_path_factory.mktemp("gpu_ranks_zero3"), model_and_prompts_gpu, GPU_FLAGS, resume=True
    )
    print(f"GPU ZeRO-3 gradient relative errors {ranks.check_gradients(run)}")
    ranks.test_zero3_refresh_reaches_every_reference_rank(run)
    ranks.check_zero3_resume(run)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skipping without CUDA")
def test_gpu_tier_is_collected_and_skips_without_cuda() -> None:
    """Not marked gpu, so it runs in ``make test``: ``pytest -m gpu`` here collects the tier and skips
    every test of it, each with the reason naming the torch build (and selects nothing else)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", __file__],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 3, proc.stdout[-3000:]
    assert all(f"the GPU tier needs CUDA: torch {torch.__version__}: no CUDA" in line for line in skipped)
    assert "3 skipped, 2 deselected" in proc.stdout  # the two tests that run everywhere


def gpus_asked(openrlhf: dict) -> int:
    """GPUs an OpenRLHF run's placement asks for (resolved arguments): colocate_all puts everything on
    the actor's GPUs, colocate_actor_ref the two models; otherwise each group has its own."""
    actor = openrlhf["actor"]["num_nodes"] * openrlhf["actor"]["num_gpus_per_node"]
    ref = openrlhf["ref"]["num_nodes"] * openrlhf["ref"]["num_gpus_per_node"]
    engines = openrlhf["vllm"]["num_engines"] * openrlhf["vllm"]["tensor_parallel_size"]
    if openrlhf["train"]["colocate_all"]:
        return max(actor, ref, engines)
    return (max(actor, ref) if openrlhf["train"]["colocate_actor_ref"] else actor + ref) + engines


def test_gpu_tier_runs_plan_here(tmp_path: Path, capsys) -> None:
    """Runs everywhere: each GPU run's exact rpg-train command passes ``--dry-run`` on the gpu backend
    (flags, validation, the memory plan at 80 GiB; in this process) and asks for the GPUs its test
    waits for."""
    import test_e2e_ranks as ranks

    from rpg_openrlhf.launch.cli import main

    model, prompts = ranks.build_model_and_prompts(tmp_path)
    for shape, gpus in ((ranks.ZERO2_SHAPE, ZERO2_GPUS), (ranks.ZERO3_SHAPE, ZERO3_GPUS)):
        argv = ranks.rpg_train_argv(tmp_path / "run", tmp_path / "ckpt", model, prompts, [*GPU_FLAGS, *shape])
        assert argv[1:3] == ["-m", "rpg_openrlhf.launch.cli"]
        main([*argv[3:], "--dry-run"])
        out = capsys.readouterr().out
        resolved = json.loads(out[out.index("{") :])
        assert resolved["backend"] == "gpu" and resolved["memory_plan"]["fits"], resolved["memory_plan"]
        assert gpus_asked(resolved["openrlhf"]) == gpus, (shape, resolved["openrlhf"])
