"""One rank of the non-finite-input test (test_finite.py): 2 gloo ranks, started with spawn.

Each rank computes the RPG loss through the policy actor's ``RPGPolicyLoss`` on log-probs from a
``DistributedDataParallel`` model (whose backward all-reduces the gradients, as DeepSpeed's does),
then backs it up and steps. Only ``NAN_RANK`` puts a NaN into its advantages. A rank that raises
reports the message and then stays alive, as a Ray actor whose method raised does, so a rank that
went on into the gradient all-reduce waits for it (the hang the fix removes).
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
import torch.distributed as dist

NAN_RANK = 1


def run(rank: int, world: int, port: int, results: Any, release: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from rpg_openrlhf import core
        from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

        provide_stand_ins()  # openrlhf.trainer.ray imports vllm / flash_attn at import time
        from rpg_openrlhf.plugin.actor import RPGPolicyLoss

        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 6))
        x = torch.randn(3, 4)
        logp = torch.nn.functional.logsigmoid(model(x))  # [B=3, T=6], finite
        old_logp = logp.detach() - 0.01
        advantages = torch.randn(3)
        if rank == NAN_RANK:
            advantages[1] = float("nan")
        loss_fn = RPGPolicyLoss("rkl", "reinforce", core.LossConfig())
        loss = loss_fn(logp, old_logp, advantages, action_mask=torch.ones(3, 6, dtype=torch.bool))[0]
        loss.backward()  # DDP all-reduces the gradients here: needs every rank
        results.put((rank, "ok", float(loss)))
    except Exception as e:  # noqa: BLE001 (reported to the test, like Ray reports an actor's error)
        results.put((rank, type(e).__name__, str(e) or traceback.format_exc()))
    release.wait(120)  # alive until the test has collected what it can (a Ray actor stays alive)
