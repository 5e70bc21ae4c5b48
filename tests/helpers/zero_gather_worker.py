"""Multi-parameter ZeRO-3 gathers on 2 gloo ranks (CPU), with and without the CPU backend's fix.

    python tests/helpers/zero_gather_worker.py OUT.json original|patched

With DeepSpeed's all-gathers at the worst legal timing (``deepspeed_ranks.deferring``: an async
result lands only when waited for), each rank records, for several ``Linear`` layers whose values
were set beforehand one parameter at a time, which parameters a single
``GatheredParameters(all of them)`` returned wrong, and how many all-gathers ran.
"""

from __future__ import annotations

import json
import sys

import torch
from deepspeed_ranks import deferring, spawn

WORLD = 2
LAYERS = 4


def worker(rank: int, out: str, mode: str) -> None:
    import deepspeed
    import deepspeed.comm
    from deepspeed.runtime.zero import partition_parameters

    if mode == "patched":
        from rpg_openrlhf.cpu_backend.zero_gathers import use_complete_gathers

        use_complete_gathers(partition_parameters)
    config = {"train_batch_size": WORLD, "zero_optimization": {"stage": 3}}
    with deepspeed.zero.Init(config_dict_or_path=config):
        layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(LAYERS)])
    params = list(layers.parameters())
    for i, param in enumerate(params):  # one at a time: known values 1, 2, 3, ...
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            if rank == 0:
                param.data.fill_(float(i + 1))

    deepspeed.comm.all_gather_into_tensor, calls = deferring(deepspeed.comm.all_gather_into_tensor)
    with deepspeed.zero.GatheredParameters(params):
        wrong = [
            i for i, p in enumerate(params) if not torch.equal(p.data, torch.full_like(p.data, float(i + 1)))
        ]
    record = {"params": len(params), "wrong": wrong, "all_gathers": len(calls)}
    with open(f"{out}.rank{rank}", "w", encoding="utf-8") as f:
        json.dump(record, f)


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    spawn(worker, out, mode, world=WORLD)
    records = []
    for rank in range(WORLD):
        with open(f"{out}.rank{rank}", encoding="utf-8") as f:
            records.append(json.load(f))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main()
