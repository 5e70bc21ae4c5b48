"""Which backend a joined cluster needs, and what its workers are told (no Ray started here; the
real clusters are in test_e2e_cluster.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rpg_openrlhf.launch.cluster import ClusterInfo, decide

ADDRESS = "10.0.0.1:6379"


@pytest.mark.parametrize(
    ("requested", "info", "backend"),
    [
        ("auto", ClusterInfo(ADDRESS, gpus=0), "cpu"),
        ("auto", ClusterInfo(ADDRESS, gpus=8, accelerator_types=["H100"]), "gpu"),
        ("auto", ClusterInfo(ADDRESS, gpus=8, cuda_in_gpu_worker=True), "gpu"),
        ("auto", ClusterInfo(ADDRESS, gpus=2, cuda_in_gpu_worker=False), "cpu"),  # logical GPUs
        ("gpu", ClusterInfo(ADDRESS, gpus=8, accelerator_types=["H100"]), "gpu"),
        ("gpu", ClusterInfo(ADDRESS, gpus=8), "gpu"),  # explicit: the driver's CUDA is not asked
        ("cpu", ClusterInfo(ADDRESS, gpus=8, accelerator_types=["H100"]), "cpu"),
    ],
)
def test_the_cluster_decides_not_the_driver(requested: str, info: ClusterInfo, backend: str) -> None:
    got, reason = decide(requested, info)
    assert got == backend and ADDRESS in reason


def test_impossible_or_unknown_is_an_error_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--backend gpu.*no GPUs"):
        decide("gpu", ClusterInfo(ADDRESS, gpus=0))
    with pytest.raises(ValueError, match="--backend auto.*pass --backend"):
        decide("auto", ClusterInfo(ADDRESS, gpus=4, cuda_in_gpu_worker=None))


def test_rpg_variables_reach_the_workers_on_both_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime environment of the job carries every RPG_* variable of the driver."""
    import ray

    from rpg_openrlhf.cpu_backend import driver as cpu
    from rpg_openrlhf.launch import cluster

    monkeypatch.setenv("RPG_REWARD_GRADER", "paper")
    monkeypatch.setenv("RPG_CPU_ROLLOUT_DTYPE", "float32")
    monkeypatch.setenv("NOT_RPG", "x")
    assert cpu.cpu_env()["RPG_REWARD_GRADER"] == "paper" and "NOT_RPG" not in cpu.cpu_env()
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(kw))
    cluster.init_ray_gpu()
    env = calls[0]["runtime_env"]["env_vars"]
    assert env["RPG_REWARD_GRADER"] == "paper" and env["RPG_CPU_ROLLOUT_DTYPE"] == "float32"
    assert env["NCCL_DEBUG"] and "TOKENIZERS_PARALLELISM" in env  # OpenRLHF's own three stay


def test_cpu_backend_starts_its_own_ray_unless_told_to_join(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from rpg_openrlhf.common import seam
    from rpg_openrlhf.cpu_backend import driver as cpu

    args = SimpleNamespace(
        actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=1),
        algo=SimpleNamespace(kl=SimpleNamespace(init_coef=0.0)),
        critic=SimpleNamespace(model_name_or_path=None),
        reward=SimpleNamespace(remote_url=["r.py"]),
        vllm=SimpleNamespace(num_engines=1),
    )
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **kw: calls.append(kw))
    # Nothing of the backend may stay in this test process: no import hooks, no environment.
    monkeypatch.setattr(seam, "when_imported", lambda *a: None)
    monkeypatch.setattr(cpu, "provide_stand_ins", lambda: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cpu.start(args)
    assert calls[-1]["address"] == "local"  # never the cluster named in /tmp/ray/ray_current_cluster
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:7777")
    cpu.start(args)
    assert calls[-1]["address"] == "127.0.0.1:7777" and "num_gpus" not in calls[-1]
