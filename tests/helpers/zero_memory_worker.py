"""What DeepSpeed ZeRO-2 allocates on CPU, 2 gloo ranks: run by test_memory_plan_terms.py.

    python tests/helpers/zero_memory_worker.py      # prints one JSON line (rank 0's figures)

A bf16 MLP under ``deepspeed.initialize`` with an AdamW section (as OpenRLHF's configs) and a small
``reduce_bucket_size`` (so the bucket does not cost a gigabyte here). Each region is measured with
the profiler's CPU allocator events (``bench/benchlib.py``): bytes allocated in the region and still
alive at its end ("retained") and the region's peak. Regions: initialize; forward + backward + the
first step; a second forward + backward; the second step.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from deepspeed_ranks import spawn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

WORLD = 2
BUCKET = 3_000_000  # elements
SETTLE_ROUNDS = 6  # x 0.25 s after each measured region


def allocations(fn) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(peak, retained) bytes of CPU tensors allocated while fn() runs."""
    import gc

    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
        # The ranks' collectives done, what they held is released inside the region. gloo drops a
        # finished work (and the tensors it holds) on its own threads, after the waiter is woken: on
        # a loaded machine that came after one 0.2 s wait (suite runs: the backward region once kept
        # a full gradient, and initialize or the first step once 2P bytes more). So wait in rounds.
        for _ in range(SETTLE_ROUNDS):
            dist.barrier()
            time.sleep(0.25)
            gc.collect()
        dist.barrier()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak, live


def worker(rank: int) -> None:
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 256))
    model = model.to(torch.bfloat16)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": BUCKET},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
    }
    box = {}

    def initialize() -> None:
        box["engine"], *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )

    x = torch.randn(4, 256, dtype=torch.bfloat16)

    def backward() -> None:
        engine = box["engine"]
        engine.backward(engine(x).float().pow(2).mean())

    def first() -> None:
        backward()
        box["engine"].step()

    figures = {
        "params": sum(p.numel() for p in model.parameters()),
        "largest_param": max(p.numel() for p in model.parameters()),
        "ranks": WORLD,
        "reduce_bucket_size": BUCKET,
    }
    figures["init_retained"] = allocations(initialize)[1]
    figures["first_step_retained"] = allocations(first)[1]
    figures["backward_peak"], figures["backward_retained"] = allocations(backward)
    figures["second_step_peak"] = allocations(box["engine"].step)[0]
    if rank == 0:
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    spawn(worker, world=WORLD)
