"""Memory of entropy logging in one training forward+backward: OpenRLHF's entropy vs RPG's detached one.

    python bench/entropy_memory.py [--vocab 32768 --batch 2 --tokens 128] [--json OUT]

On OpenRLHF's ``Actor.forward`` (a 1-layer Qwen2 with the given vocabulary), for ``return_entropy``
off, on with OpenRLHF's ``compute_entropy`` (compiled, differentiable) and on with
``rpg_openrlhf.extras.entropy`` (detached, chunked): bytes saved for backward by the forward
(``saved_tensors_hooks``) and peak CPU tensor bytes of forward+backward (``benchlib.peak_cpu_bytes``).
It also prints the saved bytes per [B, T, V] float32 tensor at the paper's micro-batch 4 and vocab
151,936 for 2K/4K/8K tokens, to scale the measured difference. Deterministic: no timing.
"""

from __future__ import annotations

import argparse
import sys

import torch
from benchlib import environment, fmt_table, peak_cpu_bytes, write_json


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    a = parser.parse_args(argv)

    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    import openrlhf.models.actor as actor_mod
    from openrlhf.models import Actor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rpg_openrlhf.extras import entropy

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=a.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    actor = Actor(Qwen2ForCausalLM(cfg))
    actor.packing_samples = False
    seq = torch.randint(0, a.vocab, (a.batch, a.tokens))
    mask = torch.ones(a.batch, a.tokens // 2, dtype=torch.bool)
    attn = torch.ones(a.batch, a.tokens, dtype=torch.long)
    upstream = actor_mod.compute_entropy

    def step(ent: bool) -> int:
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, out = actor(seq, mask, attention_mask=attn, return_output=True, return_entropy=ent)
        loss = -logp.sum() + (0.0 * out.entropy.mean() if ent else 0.0)  # coefficient 0, as RPG logs it
        loss.backward()
        actor.zero_grad(set_to_none=True)
        return saved[0]

    rows = []
    for name, ent, fn in [("no entropy", False, upstream), ("openrlhf", True, upstream), ("detached", True, entropy.entropy_from_logits)]:  # fmt: skip
        actor_mod.compute_entropy = fn
        step(ent)  # warm-up (torch.compile of OpenRLHF's entropy)
        box = {}
        peak = peak_cpu_bytes(lambda ent=ent, box=box: box.setdefault("saved", step(ent)))
        rows.append(
            {"mode": name, "saved_MB": round(box["saved"] / 2**20, 2), "peak_MB": round(peak / 2**20, 2)}
        )
    actor_mod.compute_entropy = upstream
    btv = a.batch * a.tokens * a.vocab * 4 / 2**20
    print(f"vocab {a.vocab}, batch {a.batch}, tokens {a.tokens}: one [B, T, V] float32 tensor = {btv:.2f} MB")
    print(fmt_table(rows, ["mode", "saved_MB", "peak_MB"]))
    scale = {f"{t // 1024}K": round(4 * t * 151936 * 4 / 1e9, 2) for t in (2048, 4096, 8192)}
    print(f"one [4, T, 151936] float32 tensor, GB: {scale}")
    write_json(
        a.json, {"args": vars(a), "rows": rows, "btv_MB": btv, "paper_tensor_GB": scale, "env": environment()}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
