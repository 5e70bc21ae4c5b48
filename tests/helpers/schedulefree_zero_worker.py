"""Schedule-Free AdamW inside real DeepSpeed engines, 2 ranks (gloo, CPU): run by test_schedulefree_zero.py.

    python tests/helpers/schedulefree_zero_worker.py OUT.json STAGE:DTYPE [STAGE:DTYPE ...]

For each (ZeRO stage, dtype) it builds the engine as ``rpg-train`` does (an AdamW section in the
DeepSpeed config that ``schedule_free.schedulefree_initialize`` turns into Schedule-Free) and trains a
small MLP in three "fits" (2, 1 and 2 optimizer steps), in train mode for each fit and eval mode after,
as the RPG policy actor does. ZeRO-3 uses tiny sub-groups (several ``step()`` calls per optimizer step)
and keeps the biases gathered. After each switch it records, from DeepSpeed's own accessors, the master
and model weights by name, each rank's flat master partitions with their ``z``, and each group's ``k`` /
``weight_sum`` / ``lr_max``.
"""

from __future__ import annotations

import json
import sys

import torch
from deepspeed_ranks import deferring, spawn

WORLD = 2
LR, BETAS, EPS, WD, WARMUP = 0.05, (0.9, 0.999), 1e-8, 0.1, 3
FITS = (2, 1, 2)


def model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    x = torch.randn(4, 6)
    y = torch.randn(4, 3)
    return model, x, y


def param_groups(model: torch.nn.Module) -> list[dict]:
    """Two groups as OpenRLHF builds them: weights with decay, biases without."""
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n.endswith("weight")], "weight_decay": WD},
        {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0},
    ]


def local_flats(wrapper, sf) -> list[dict]:
    """This rank's fp32 master partitions and their Schedule-Free z (flat, as the optimizer sees them)."""
    if hasattr(wrapper, "fp32_partitioned_groups_flat"):  # ZeRO-3: one per sub-group
        flats = wrapper.fp32_partitioned_groups_flat
    else:  # ZeRO-1/2: one per parameter group
        flats = wrapper.single_partition_of_fp32_groups
    out = []
    for flat in flats:
        z = sf.state.get(flat, {}).get("z")
        out.append({"x_or_y": flat.detach().tolist(), "z": None if z is None else z.detach().tolist()})
    return out


def snapshot(engine, wrapper, sf, names: list[str], dtype: torch.dtype) -> dict:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param

    params = [p for _, p in engine.module.named_parameters()]
    master, model = {}, {}
    for name, p in zip(names, params):
        master[name] = safe_get_full_fp32_param(p).detach().float().flatten().tolist()
    for name, p in zip(names, params):
        # One parameter at a time: DeepSpeed 0.19.6 gathers a list of several with one async gloo
        # all-gather each and waits for the last one only, which on CPU can return unfilled memory.
        with deepspeed.zero.GatheredParameters([p], enabled=hasattr(p, "ds_id")):
            assert p.dtype == dtype, (name, p.dtype)
            model[name] = p.detach().float().flatten().tolist()
    flats: list = [None] * dist.get_world_size()
    dist.all_gather_object(flats, local_flats(wrapper, sf))
    groups = [{k: float(g[k]) for k in ("k", "weight_sum", "lr_max")} for g in sf.param_groups]
    return {
        "master": master, "model": model, "flats": flats, "groups": groups,
        "train_mode": sf.param_groups[0]["train_mode"],
    }  # fmt: skip


def run_case(stage: int, dtype_name: str) -> list[dict]:
    import deepspeed

    from rpg_openrlhf.plugin import schedule_free

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    model, x, y = model_and_data()
    names = [n for n, _ in model.named_parameters()]
    config = {
        "train_micro_batch_size_per_gpu": x.shape[0],
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "sub_group_size": 40, "stage3_param_persistence_threshold": 16},
        "bf16": {"enabled": dtype_name == "bf16"},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD},
        },
    }
    total_steps = sum(FITS)
    with schedule_free.schedulefree_initialize(WARMUP / total_steps, total_steps):
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=config)
    wrapper, sf = schedule_free.schedulefree_of(engine)
    assert sf is not None, type(engine.optimizer)
    records = []
    for n_steps in FITS:
        assert schedule_free.set_mode(engine, "train")
        records.append({"mode": "train", **snapshot(engine, wrapper, sf, names, dtype)})
        for _ in range(n_steps):
            out = engine(x.to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y)
            engine.backward(loss)
            engine.step()
        assert schedule_free.set_mode(engine, "eval")
        records.append(
            {"mode": "eval", "steps": engine.global_steps, **snapshot(engine, wrapper, sf, names, dtype)}
        )
    engine.destroy()
    return records


def worker(rank: int, out: str, cases: list[str]) -> None:
    # As the CPU backend's workers do (seam zero3_gather): ZeRO-3 re-gathers the persistent biases
    # several at a time after each switch and step. And under the worst timing an async all-gather
    # may legally have (deepspeed_ranks.deferring): without the fix the model's weights then miss
    # the master copy after most switches.
    import deepspeed.comm
    from deepspeed.runtime.zero import partition_parameters

    from rpg_openrlhf.cpu_backend.zero_gathers import use_complete_gathers

    use_complete_gathers(partition_parameters)
    deepspeed.comm.all_gather_into_tensor, _ = deferring(deepspeed.comm.all_gather_into_tensor)
    results = {}
    for case in cases:
        stage, dtype_name = case.split(":")
        results[case] = run_case(int(stage), dtype_name)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f)


def main() -> None:
    spawn(worker, sys.argv[1], sys.argv[2:], world=WORLD)


if __name__ == "__main__":
    main()
