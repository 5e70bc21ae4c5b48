"""The reference refresh with several reference ranks (issue #11 item 7).

* Refused before Ray: a refreshing ``--rpg.ref_update`` with ``--ds.tensor_parallel_size > 1``
  (DeepSpeed AutoTP splits the reference's layers; a full-weight copy cannot load into them).
* Transport, on a real local Ray with OpenRLHF's ``RayActorGroup`` of two real RPG reference actors
  (``tests/helpers/ref_refresh_actor.py``: a gloo group and a small module instead of a DeepSpeed engine) and
  the trainer's own ``refresh_reference``: the state is put once, every rank is delivered a
  reference to it (not a copy), and every rank ends up with the actor's weights through rank 0.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_preflight import BASE, error_of, no_ray  # noqa: F401 (fixture)

TESTS = Path(__file__).resolve().parent
HELPERS = TESTS / "helpers"
RPG = ["--rpg.loss", "rkl", "--rpg.style", "reinforce"]


@pytest.mark.parametrize(
    ("mode", "extra"),
    [("every_k", ["--rpg.ref_update_k", "2"]), ("kl_threshold", ["--rpg.ref_kl_threshold", "0.1"])],
)
@pytest.mark.usefixtures("no_ray")
def test_refresh_with_tensor_parallelism_is_refused(mode, extra, capsys) -> None:
    """The real start path (no --dry-run), before Ray; a dry run validates the same way (test_rpg_flags)."""
    argv = [*BASE, *RPG, "--rpg.ref_update", mode, *extra, "--ds.tensor_parallel_size", "2"]
    line = error_of(argv, capsys)
    assert f"--rpg.ref_update {mode}" in line and "--ds.tensor_parallel_size 2" in line, line


def test_tensor_parallelism_without_refresh_passes_the_check() -> None:
    from rpg_openrlhf.plugin import ref_refresh

    for mode in ("initial", "rollout"):
        ref_refresh.validate(
            SimpleNamespace(**{"rpg.loss": "rkl", "rpg.ref_update": mode, "ds.tensor_parallel_size": 2})
        )
    ref_refresh.validate(
        SimpleNamespace(**{"rpg.loss": None, "rpg.ref_update": "every_k", "ds.tensor_parallel_size": 4})
    )


class _ActorGroup:
    """The actor side: rank 0 returns the full weights (as ``rpg_state_dict`` does), through Ray."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def async_run_method(self, method_name: str):
        import ray

        assert method_name == "rpg_state_dict"
        return [ray.put(self.state), ray.put(None)]


@pytest.fixture(scope="module")
def reference_group():
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import ray
    from openrlhf.trainer.ray.launcher import RayActorGroup

    from rpg_openrlhf.common.ray_python import worker_python
    from rpg_openrlhf.cpu_backend.driver import RAY_NODE_DEFAULTS

    temp = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    path = os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local", num_cpus=2, num_gpus=2, include_dashboard=False, _temp_dir=temp, logging_level="ERROR",
        _system_config=RAY_NODE_DEFAULTS,  # workers un-niced: they do the work (a loaded machine)
        runtime_env={
            "worker_process_setup_hook": "rpg_openrlhf.cpu_backend.worker.worker_setup",
            "env_vars": {"DS_ACCELERATOR": "cpu", "PYTHONPATH": path, "OMP_NUM_THREADS": "1"},
            **worker_python(),  # a venv under a path with a space
        },
    )  # fmt: skip
    try:
        from ref_refresh_actor import RecordingReference

        group = RayActorGroup(1, 2, RecordingReference, pg=None, num_gpus_per_actor=1)
        assert sorted(ray.get(group.async_run_method("rpg_test_setup", seed=1))) == [0, 1]
        yield group
    finally:
        ray.shutdown()


def _trainer(group, state: dict):
    from rpg_openrlhf.plugin.trainer import _RPGPPOTrainer

    trainer = object.__new__(_RPGPPOTrainer)  # no __init__: no models, only the refresh's state
    trainer.args = SimpleNamespace(ds=SimpleNamespace(enable_sleep=False))
    trainer.actor_model_group, trainer.reference_model_group = _ActorGroup(state), group
    return trainer


@pytest.mark.slow
def test_refresh_puts_once_and_every_rank_gets_the_actor_weights(reference_group) -> None:
    import ray

    torch.manual_seed(7)  # the actor's weights: neither reference rank's initial ones
    actor = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    state = {k: v.detach().clone() for k, v in actor.state_dict().items()}
    before = ray.get(reference_group.async_run_method("rpg_test_report"))
    assert all(not torch.equal(r["weights"]["0.weight"], state["0.weight"]) for r in before)

    _trainer(reference_group, state).refresh_reference()

    reports = sorted(ray.get(reference_group.async_run_method("rpg_test_report")), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        # Ray delivered a reference to the one put, not a copy of the weights, to every rank ...
        assert r["received"] == ["list['ObjectRef']"], r["received"]
        # ... and every rank holds the actor's weights afterwards (rank 1 through rank 0's broadcast).
        assert sorted(r["weights"]) == sorted(state)
        for name, value in state.items():
            assert torch.equal(r["weights"][name], value), (r["rank"], name)


@pytest.mark.slow
def test_a_bad_state_stops_every_reference_rank_with_the_same_error(reference_group) -> None:
    import ray

    state = {"0.weight": torch.zeros(7, 5)}  # the other parameters are missing
    refs = reference_group.async_run_method("rpg_load_state_dict", state=[ray.put(state)])
    messages = []
    for ref in refs:
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(ref, timeout=120)
        messages.append(str(info.value))
    assert all("state: missing parameters ['0.bias', '1.bias', '1.weight']" in m for m in messages), messages
    assert "reported by reference rank 0" in messages[1]
