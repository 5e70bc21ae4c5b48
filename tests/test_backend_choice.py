"""--backend's choice (rpg_openrlhf/launch/backend.py), in-process: the GPU-shape rule at its boundary,
every (request, CUDA, shape, dry run) case, and the torch build named in a refusal. The configs' own
dry runs and refusals through the real parser are in tests/test_configs.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.launch import backend


def shape(**flags: int) -> str | None:
    return backend.gpu_shape(SimpleNamespace(**{k.replace("__", "."): v for k, v in flags.items()}))


def test_gpu_shape_boundary() -> None:
    assert shape(actor__num_nodes=1, actor__num_gpus_per_node=4, vllm__num_engines=4) is None
    assert "= 5 GPUs > 4" in shape(actor__num_nodes=1, actor__num_gpus_per_node=5)
    assert "= 8 GPUs > 4" in shape(actor__num_nodes=2, actor__num_gpus_per_node=4)
    engines = shape(
        actor__num_nodes=1, actor__num_gpus_per_node=1, vllm__num_engines=3, vllm__tensor_parallel_size=2
    )
    assert engines.startswith("--vllm.num_engines 3 x --vllm.tensor_parallel_size 2 = 6 GPUs")
    assert shape(actor__num_nodes=1, actor__num_gpus_per_node=1, vllm__num_engines=None) is None  # unset: 0


@pytest.fixture
def cuda(monkeypatch):
    def set_cuda(available: bool) -> None:
        monkeypatch.setattr(backend, "_cuda_available", lambda: available)

    return set_cuda


GPU_SHAPE = "--actor.num_nodes 1 x --actor.num_gpus_per_node 8 = 8 GPUs > 4"


def test_with_cuda_auto_and_gpu_take_the_gpu(cuda) -> None:
    cuda(True)
    assert backend.resolve_backend("auto")[0] == backend.resolve_backend("gpu", shape=GPU_SHAPE)[0] == "gpu"
    assert backend.resolve_backend("cpu", shape=GPU_SHAPE)[0] == "cpu"  # asked for explicitly


def test_without_cuda(cuda) -> None:
    cuda(False)
    build = f"torch {torch.__version__}: no CUDA" if not torch.version.cuda else "no GPU visible"
    assert backend.resolve_backend("auto")[0] == "cpu"  # a CPU-sized run: the CPU backend
    assert backend.resolve_backend("cpu", shape=GPU_SHAPE)[0] == "cpu"
    for requested, shape_ in (("auto", GPU_SHAPE), ("gpu", None)):
        with pytest.raises(ValueError, match=f"--backend {requested}") as exc:
            backend.resolve_backend(requested, shape=shape_)
        assert build in str(exc.value) and "\n" not in str(exc.value)
        chosen, reason = backend.resolve_backend(requested, shape=shape_, dry_run=True)
        assert chosen == "gpu" and "a plan only" in reason and build in reason
    with pytest.raises(ValueError, match="--backend: 'tpu'"):
        backend.resolve_backend("tpu")


def test_torch_build_of_a_cuda_build_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert (
        backend.torch_build()
        == f"torch {torch.__version__} (CUDA 13.0): no GPU visible (CUDA_VISIBLE_DEVICES='')"
    )
    monkeypatch.setattr(torch.version, "cuda", None)
    assert backend.torch_build() == f"torch {torch.__version__}: no CUDA"
