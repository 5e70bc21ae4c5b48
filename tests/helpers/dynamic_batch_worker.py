"""The RPG loss under OpenRLHF's dynamic batching, 2 gloo ranks: run by test_dynamic_batch_loss.py.

    python tests/helpers/dynamic_batch_worker.py OUT.json AGGREGATION:SCOPE [AGGREGATION:SCOPE ...]

Each rank puts SEQUENCES single-sample experiences of varied lengths into OpenRLHF's own
``NaiveReplayBuffer`` and lets its ``setup_dynamic_batch`` form the micro-batches (token budget
MAX_TOKENS, so they differ in size and count of sequences). For every micro-batch it takes the
normalizers from OpenRLHF's ``get_loss_batch_info`` (as ``ActorPPOTrainer.training_step`` does with
``--train.dynamic_batch_enable``), computes the plug-in's ``RPGPolicyLoss`` on log-probs that depend
on a parameter vector theta (log pi = old log pi + phi . theta, phi fixed random features per token),
and accumulates d loss / d theta per optimizer step, averaged over the ranks as DeepSpeed does. It
writes, per case and rank: every sample (id, masks, old log-probs, advantages, features), the
micro-batches (sample ids, the step each belongs to, the normalizers) and, per optimizer step, the
averaged gradient.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
from deepspeed_ranks import spawn

WORLD = 2
SEQUENCES = 12  # per rank
STEP_SEQUENCES = 12  # --train.batch_size over both ranks: 2 optimizer steps of 6 sequences per rank
MAX_TOKENS = 40
FEATURES = 6
BETA = 0.3


def samples(rank: int) -> list[dict]:
    """Prompt + response lengths that differ, per-token old log-probs, advantages and features."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(SEQUENCES):
        prompt, response = (
            int(torch.randint(2, 6, (1,), generator=g)),
            int(torch.randint(1, 32, (1,), generator=g)),
        )
        response = 0 if (rank, i) == (1, 3) else response  # a sample without response tokens
        length = prompt + response
        action = torch.zeros(length - 1, dtype=torch.bool)
        action[prompt - 1 :] = True
        out.append({
            "id": f"r{rank}s{i}", "length": length, "action_mask": action,
            "old_logp": -torch.rand(length - 1, generator=g) * 3,
            "advantage": float(torch.randn(1, generator=g)),
            "features": torch.randn(length - 1, FEATURES, generator=g) * 0.2,
        })  # fmt: skip
    return out


def replay_buffer(items: list[dict]):
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer

    buffer = NaiveReplayBuffer(1, packing_samples=True, dynamic_batch=True)
    for s in items:
        mask = s["action_mask"]
        buffer.append(
            Experience(
                sequences=torch.arange(s["length"])[None], attention_mask=torch.ones(1, s["length"], dtype=torch.long),
                action_mask=mask[None], action_log_probs=s["old_logp"][None],
                advantages=(s["advantage"] * mask.float())[None], total_length=torch.tensor([s["length"]]),
                prompts=[s["id"]],
            )
        )  # fmt: skip
    return buffer


def strategy():
    """What setup_dynamic_batch and get_loss_batch_info read, with OpenRLHF's own all_reduce."""
    import torch.distributed as dist
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    ns = SimpleNamespace
    args = ns(
        train=ns(batch_size=STEP_SEQUENCES, max_tokens_per_gpu=MAX_TOKENS),
        rollout=ns(batch_size=SEQUENCES * WORLD // 6, n_samples_per_prompt=6),  # every sample of both ranks
        ds=ns(ring_attn_size=1, tensor_parallel_size=1),
    )  # fmt: skip
    s = ns(args=args, world_size=dist.get_world_size(), ds_device_mesh={"dp": ns(get_group=lambda: None)})
    s.all_reduce = lambda data, op="mean": DeepspeedStrategy.all_reduce(s, data, op)
    return s


def run_case(aggregation: str, scope: str, rank: int) -> dict:
    """One loss configuration through the replay buffer's micro-batches; this rank's record."""
    import torch.distributed as dist
    from openrlhf.utils.loss_utils import get_loss_batch_info

    from rpg_openrlhf import core
    from rpg_openrlhf.plugin.actor import RPGPolicyLoss

    items = samples(rank)
    by_id = {s["id"]: s for s in items}
    buffer, strat = replay_buffer(items), strategy()
    buffer.setup_dynamic_batch(strat)
    loss_fn = RPGPolicyLoss(
        "rkl", "differentiable", core.LossConfig(beta=BETA, aggregation=aggregation, aggregation_scope=scope)
    )
    theta = torch.zeros(FEATURES, requires_grad=True)
    micro, grads, step = [], {}, 1
    for index in range(len(buffer)):
        exp = buffer.collate_fn([buffer[index]])
        features = torch.nn.utils.rnn.pad_sequence(
            [by_id[i]["features"] for i in exp.prompts], batch_first=True
        )
        logp = (exp.action_log_probs + features[:, : exp.action_mask.shape[1]] @ theta) * exp.action_mask
        info = get_loss_batch_info(
            strat, exp.action_mask, replay_buffer=buffer, step=index, dynamic_batch=True
        )
        loss_fn(logp, exp.action_log_probs, exp.advantages, exp.action_mask, **info)[0].backward()
        micro.append({"ids": list(exp.prompts), "step": step, "batch_num_tokens": float(info["batch_num_tokens"]),
                      "global_batch_size": float(info["global_batch_size"]), "dp_size": info["dp_size"]})  # fmt: skip
        if buffer.dynamic_optimizer_step[index]:  # DeepSpeed averages the ranks' gradients here
            grad = theta.grad.clone()
            dist.all_reduce(grad)
            grads[step] = (grad / dist.get_world_size()).tolist()
            theta.grad = None
            step += 1
    tensors = ("action_mask", "old_logp", "features")
    return {
        "samples": [{**s, **{k: s[k].tolist() for k in tensors}} for s in items],
        "micro_batches": micro,
        "grads": grads,
    }


def worker(rank: int, out: str, cases: list[str]) -> None:
    from rpg_openrlhf.cpu_backend.worker import worker_setup

    worker_setup()  # OpenRLHF's CUDA calls on CPU, as in the CPU backend's workers
    import torch.distributed as dist

    results = {}
    for case in cases:
        record = run_case(*case.split(":"), rank)
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, record)
        results[case] = gathered
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"beta": BETA, "cases": results}, f)


if __name__ == "__main__":
    spawn(worker, sys.argv[1], sys.argv[2:], world=WORLD)
