"""Which backend a joined cluster needs, and what its workers are told (no Ray started here; the
real clusters, and that the CPU backend starts a Ray of its own unless told to join one, are in
test_e2e_cluster.py)."""

from __future__ import annotations

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
