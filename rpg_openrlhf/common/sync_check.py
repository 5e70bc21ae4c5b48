"""Engine-vs-actor log-probs after every weight sync (debug instrumentation, ``RPG_SYNC_CHECK_DIR``).

After OpenRLHF's ``ActorPPOTrainer.broadcast_to_vllm`` the trainer's rank 0 records, for a few fixed
token sequences, the log-probs each vLLM engine gives them (``prompt_logprobs``) beside a Hugging Face
forward of the actor's weights, so a stale or wrong sync shows up as a difference
(``sync_NNNNN.pt``: ``actor`` and ``engines`` rows, one per sequence, one value per position).

It lives on the shared floor because both backends use it and neither may import the other: the CPU
backend applies it in its workers (fp32 engines and an fp32 forward, compared to 1e-4 by the E2E
tests); on the GPU backend ``rpg-train`` applies it only when ``RPG_SYNC_CHECK_DIR`` is set, through
the job's ``worker_process_setup_hook`` (:func:`worker_setup`), and then the forward runs on CUDA in
the actor's dtype and attention implementation (bf16, flash-attention), as the engines do. The seam
entry is ``sync_check`` in :mod:`rpg_openrlhf.common.patches` (stage ``sync-check``).

``RPG_SYNC_CHECK_LENGTHS=512,8192`` adds one pseudo-random sequence of each length (ids below 100,
any tokenizer), for the gap by token position (``python -m rpg_openrlhf.nodecheck``); the engines'
``max_model_len`` (``--data.max_len``) must hold them.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

#: The directory the records go to; nothing is recorded without it.
SYNC_CHECK_ENV = "RPG_SYNC_CHECK_DIR"
#: Extra sequence lengths (comma-separated) for the gap by position.
LENGTHS_ENV = "RPG_SYNC_CHECK_LENGTHS"
#: Fixed token sequences whose log-probs are compared after every sync (ids < 100: any tokenizer).
SYNC_CHECK_SEQUENCES: tuple[tuple[int, ...], ...] = (
    (11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22),
    (40, 41, 42, 30, 31, 32, 60, 61, 62, 70),
    (5, 77, 9, 83, 21, 64, 3, 50),
)


def check_sequences() -> list[list[int]]:
    """:data:`SYNC_CHECK_SEQUENCES` plus one seeded sequence per length in ``RPG_SYNC_CHECK_LENGTHS``."""
    import torch

    sequences = [list(s) for s in SYNC_CHECK_SEQUENCES]
    lengths = [int(n) for n in (os.environ.get(LENGTHS_ENV) or "").split(",") if n.strip()]
    generator = torch.Generator().manual_seed(0)
    for n in lengths:
        sequences.append(torch.randint(3, 100, (n,), generator=generator).tolist())
    return sequences


def _actor_forward(model: Any, state: dict[str, Any], sequences: list[list[int]]) -> tuple[list[Any], str]:
    """Log-probs of ``sequences`` under a Hugging Face copy of the actor holding ``state``.

    On CUDA: the actor's dtype and attention implementation (the engines run bf16 too); on CPU: an
    exact fp32 upcast (the CPU backend's engines compute in fp32). Float64 log-softmax either way, a
    chunk of positions at a time (:func:`_float64_logprobs`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    dtype = next(model.parameters()).dtype if cuda else torch.float32
    attn = getattr(model.config, "_attn_implementation", None) if cuda else None
    kwargs = {"attn_implementation": attn} if attn else {}
    reference = AutoModelForCausalLM.from_config(model.config, dtype=dtype, **kwargs).eval()
    missing, unexpected = reference.load_state_dict({n: p.to(dtype) for n, p in state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    device = "cuda" if cuda else "cpu"
    reference.to(device)
    rows = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=device)
            hidden = reference.model(input_ids=ids).last_hidden_state[0, :-1]
            rows.append(_float64_logprobs(reference.get_output_embeddings(), hidden, ids[0, 1:]).cpu())
    del reference
    return rows, f"{device} {str(dtype).removeprefix('torch.')} {attn or 'default attention'}"


def _float64_logprobs(head: Any, hidden: Any, labels: Any) -> Any:
    """log_softmax(float64(head(hidden)))[label] per row, a chunk of rows at a time (no [T, V] float64
    logits: 10 GB at 8,192 tokens x 151,936), chunks sized by :func:`core.logprobs.chunk_tokens_for`."""
    import torch

    from rpg_openrlhf.core.logprobs import chunk_tokens_for

    chunk = chunk_tokens_for(head.weight.shape[0], torch.float64)
    out = []
    for s in range(0, hidden.shape[0], chunk):
        logits = head(hidden[s : s + chunk]).double()
        out.append(logits.log_softmax(-1).gather(-1, labels[s : s + chunk, None])[:, 0])
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float64)


def _engine_logprobs(trainer: Any, sequences: list[list[int]]) -> list[list[Any]]:
    """Each engine's ``prompt_logprobs`` of ``sequences`` (KV cache woken for it under vLLM sleep)."""
    import ray
    import torch
    from vllm import SamplingParams

    engines = trainer.vllm_engines
    sleeping = bool(trainer.strategy.args.vllm.enable_sleep)
    if sleeping:  # after a sync only the weights are awake (OpenRLHF's broadcast_to_vllm)
        ray.get([e.wake_up.remote(tags=["kv_cache"]) for e in engines])
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    rows = []
    for engine in engines:
        outs = ray.get([engine.generate.remote(list(seq), params) for seq in sequences])
        rows.append(
            [
                torch.tensor([entry[tok].logprob for tok, entry in zip(seq[1:], out.prompt_logprobs[1:])])
                for seq, out in zip(sequences, outs)
            ]
        )
    if sleeping:  # back to sleep: the next rollout wakes weights and KV cache (samples_generator)
        ray.get([e.sleep.remote() for e in engines])
    return rows


def record_engine_sync(trainer: Any, out_dir: str) -> None:
    """After a weight sync: each engine's log-probs of :func:`check_sequences` beside the actor's.

    Rank 0 writes ``sync_NNNNN.pt`` (``sync``, ``actor``, ``engines``, ``sequences``, ``forward``);
    every rank takes part in the gathers (ZeRO-3).
    """
    import torch
    import torch.distributed as dist

    from rpg_openrlhf.common.atomic import atomic_write
    from rpg_openrlhf.common.zero import gather_full_state_dict

    model = trainer.actor.model.module
    gathered = gather_full_state_dict(model, zero3=trainer.strategy.args.ds.zero_stage == 3)
    if dist.get_rank() == 0 and trainer.vllm_engines:
        sequences = check_sequences()
        actor_rows, forward = _actor_forward(model, gathered, sequences)
        engine_rows = _engine_logprobs(trainer, sequences)
        os.makedirs(out_dir, exist_ok=True)
        trainer._rpg_sync_count = getattr(trainer, "_rpg_sync_count", 0) + 1
        record = {"sync": trainer._rpg_sync_count, "actor": actor_rows, "engines": engine_rows,
                  "sequences": sequences, "forward": forward}  # fmt: skip
        with atomic_write(os.path.join(out_dir, f"sync_{trainer._rpg_sync_count:05d}.pt"), "wb") as f:
            torch.save(record, f)
        worst = max(
            float((e.double() - a).abs().max()) for rows in engine_rows for e, a in zip(rows, actor_rows)
        )
        print(
            f"[sync-check] sync {trainer._rpg_sync_count}: max |engine - actor| log-prob {worst:.3g} ({forward})"
        )
    dist.barrier()


def use_sync_check(module: ModuleType) -> None:
    """seam ``sync_check``: ``ActorPPOTrainer.broadcast_to_vllm`` records the check after each sync."""
    check_dir = os.environ.get(SYNC_CHECK_ENV)
    if not check_dir:
        return
    original = module.ActorPPOTrainer.broadcast_to_vllm

    def broadcast_to_vllm(self: Any) -> None:
        original(self)
        record_engine_sync(self, check_dir)

    module.ActorPPOTrainer.broadcast_to_vllm = broadcast_to_vllm


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook`` of a GPU run with ``RPG_SYNC_CHECK_DIR`` (set by ``rpg-train``):
    the seam's ``sync-check`` stage, applied when the trainer's module is imported."""
    from rpg_openrlhf.common import patches, seam

    seam.apply(patches.PATCHES, "sync-check", lazy=True)
