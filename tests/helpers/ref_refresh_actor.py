"""The real RPG reference actor class, set up without DeepSpeed for test_ref_refresh.py.

:class:`RecordingReference` is ``actor._RPGReferenceModelActor`` (OpenRLHF's reference actor plus
``rpg_load_state_dict``) with a light ``rpg_test_setup`` in place of ``init_model_from_pretrained``:
a gloo process group from the environment OpenRLHF's ``BaseDistributedActor`` set, and an OpenRLHF
``Actor`` around a small module (ZeRO-0: every rank holds full parameters, as the reference engine
does below ZeRO-3).
"""

from __future__ import annotations

from types import SimpleNamespace

import ray
import torch
import torch.distributed as dist

from rpg_openrlhf.plugin.actor import _RPGReferenceModelActor


class _RecordingReference(_RPGReferenceModelActor):
    def rpg_test_setup(self, seed: int) -> int:
        from openrlhf.models import Actor

        dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from BaseDistributedActor
        torch.manual_seed(seed)
        self.model = Actor(torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)))
        self.strategy = SimpleNamespace(args=SimpleNamespace(ds=SimpleNamespace(zero_stage=0)))
        return dist.get_rank()


RecordingReference = ray.remote(num_gpus=1)(_RecordingReference)
