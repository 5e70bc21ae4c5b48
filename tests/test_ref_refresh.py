"""The reference refresh with several reference ranks (issue #11 item 7).

* Refused before Ray: a refreshing ``--rpg.ref_update`` with ``--ds.tensor_parallel_size > 1``
  (DeepSpeed AutoTP splits the reference's layers; a full-weight copy cannot load into them).
* On a real local Ray with OpenRLHF's ``RayActorGroup`` of two real RPG reference actors
  (``tests/helpers/ref_refresh_actor.py``: a gloo group and a small module instead of a DeepSpeed engine):
  a state that does not fit stops every rank with rank 0's error, none waits in the copy's collectives.
  (Every rank getting the actor's weights: tests/test_e2e_ranks.py's ZeRO-3 refresh; one put per refresh,
  sent as a nested reference: tests/test_rpg_actor.py.)
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
