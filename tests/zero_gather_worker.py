"""Multi-parameter ZeRO-3 gathers on 2 gloo ranks (CPU), with and without the CPU backend's fix.

    python tests/zero_gather_worker.py OUT.json original|patched

An asynchronous collective's output is defined only once its handle has been waited for. gloo
honours that loosely (its worker threads may finish an earlier all-gather after a later one), so
the race shows about once in 2,000 gathers. To make it deterministic, DeepSpeed's
``all_gather_into_tensor`` is replaced here by one that runs the real all-gather into a scratch
buffer, leaves the output NaN, and copies the result in only when the handle is waited for:
exactly the contract, with the worst legal timing. Each rank then records, for several
``Linear`` layers whose values were set beforehand, how many parameters a single
``GatheredParameters(all of them)`` returned wrong, and how many all-gathers ran.
"""

from __future__ import annotations

import json
import os
import sys

import torch

WORLD = 2
LAYERS = 4


def deferring(real):  # type: ignore[no-untyped-def]
    """``all_gather_into_tensor`` whose async result lands in ``output`` only at ``wait()``."""
    calls = []

    class Handle:
        def __init__(self, output: torch.Tensor, result: torch.Tensor) -> None:
            self.output, self.result = output, result

        def wait(self) -> None:
            self.output.copy_(self.result)

    def all_gather_into_tensor(output, tensor, group=None, async_op=False):  # type: ignore[no-untyped-def]
        calls.append(1)
        result = torch.empty_like(output)
        real(result, tensor, group=group, async_op=False)
        if not async_op:
            output.copy_(result)
            return None
        output.fill_(float("nan"))
        return Handle(output, result)

    return all_gather_into_tensor, calls


def worker(rank: int, out: str, mode: str, port: int) -> None:
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"}
    )  # fmt: skip
    import deepspeed
    import deepspeed.comm
    from deepspeed.runtime.zero import partition_parameters

    deepspeed.init_distributed(dist_backend="gloo")
    if mode == "patched":
        from rpg_openrlhf.integration.zero import use_complete_gathers

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
    import socket

    out, mode = sys.argv[1], sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(worker, args=(out, mode, port), nprocs=WORLD, join=True)
    records = []
    for rank in range(WORLD):
        with open(f"{out}.rank{rank}", encoding="utf-8") as f:
            records.append(json.load(f))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main()
