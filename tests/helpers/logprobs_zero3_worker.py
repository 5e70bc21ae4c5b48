"""The chunked log-prob path inside a real ZeRO-3 engine, 2 ranks (gloo, CPU): run by test_logprobs_zero3.py.

    python tests/helpers/logprobs_zero3_worker.py OUT.json TIED(0|1)

Each rank wraps the same tiny Qwen2 model (seed 0) in OpenRLHF's ``Actor`` and a ZeRO-3 DeepSpeed
engine (``actor.model = engine``, as OpenRLHF's strategy does), so the LM head's weight is
partitioned. On its own batch it runs OpenRLHF's ``Actor.forward`` and then the chunked path, each
followed by the RPG loss's backward through the engine, and records the log-probs, the entropy and
every parameter's full gradient after ZeRO's reduce-scatter (``safe_get_full_grad``), and how many
times the head's weight was gathered in the chunked forward (ZeRO's pre-forward hook on the head).
"""

from __future__ import annotations

import json
import sys

import torch
from deepspeed_ranks import spawn

WORLD = 2
V = 97


def run(rank: int, out: str, tied: bool) -> None:
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rpg_openrlhf import core
    from rpg_openrlhf.common import logprobs_path as lp
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import openrlhf.models.actor as actor_mod

    def eager_entropy(logits: torch.Tensor) -> torch.Tensor:  # upstream's formula, not torch.compile'd
        return torch.logsumexp(logits, -1) - (logits.softmax(-1) * logits).sum(-1)

    actor_mod.compute_entropy = eager_entropy
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied, attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    actor = actor_mod.Actor(model, temperature=0.7)
    actor.packing_samples = False
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.0}},
    }
    engine, *_ = deepspeed.initialize(model=model, config=ds_config, model_parameters=model.parameters())
    actor.model = engine
    head = model.get_output_embeddings()
    gathers = []
    head.register_forward_pre_hook(lambda module, args: gathers.append(tuple(module.weight.shape)))

    torch.manual_seed(10 + rank)
    b, p, a = 3, 4, 6
    attention = torch.ones(b, p + a, dtype=torch.long)
    attention[1, :2] = 0
    attention[2, -3:] = 0
    action = attention[:, p:].bool()
    seq = torch.randint(3, V, (b, p + a)) * attention
    stock = actor_mod.Actor.forward
    lp._STATE["original"] = stock
    lp._STATE["budget_bytes"] = 3 * V * 12  # 3-token chunks

    record = {}
    for name, forward in (("stock", stock), ("chunked", lp.chunked_forward)):
        gathers.clear()
        engine.optimizer.zero_grad()
        logp, output = forward(
            actor, seq, action, attention_mask=attention, return_output=True, return_entropy=True
        )
        old = (logp.detach() - 0.1) * action
        adv = torch.linspace(-1, 1, b)[:, None] * action.float()
        loss, _ = core.compute_loss("urkl", "reinforce", logp, old, adv, action, config=core.LossConfig())
        engine.backward(loss)
        grads = {n: safe_get_full_grad(prm) for n, prm in model.named_parameters()}
        record[name] = {
            "logp": logp.detach().tolist(),
            "entropy": (output.entropy[:, -a:] * action).tolist(),
            "grads": {n: g.tolist() for n, g in grads.items() if g is not None},
            "head_gathers": list(gathers),
        }
    if rank == 0:
        with open(out, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    spawn(run, sys.argv[1], sys.argv[2] == "1", world=WORLD)
