"""The probe's stages (:mod:`rpg_openrlhf.nodecheck.probe`): each takes the device and a size ("full": the
8K config's shapes on a GPU; "tiny": CPU-sized) and returns a JSON-able dict with ``ok`` and ``summary``.

Memory: ``torch.cuda.max_memory_allocated`` around the measured call (the caching allocator's peak of
live tensors; CUDA contexts and cuBLAS / flash workspaces outside it); on CPU none (the CPU run checks
that the code runs). Predictions: :mod:`rpg_openrlhf.launch.memory_terms`, the memory plan's terms.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from rpg_openrlhf.launch import memory_terms as terms
from rpg_openrlhf.launch.model_shape import PAPER_MODELS, ModelShape

GIB = 2**30
#: Qwen3-0.6B's config.json (the hub's), for the ZeRO-2 stage.
QWEN3_06B = ModelShape(layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128,
                       vocab=151936, tie_word_embeddings=True, qk_norm=True, source="Qwen/Qwen3-0.6B config")  # fmt: skip
TINY = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=512,
                  tie_word_embeddings=True, qk_norm=True, source="tiny")  # fmt: skip
#: Token counts of the 8K configs' plan (docs/training.md, "Memory plan"): the log-prob forward's 4 x
#: 9,216 (32,768-token budget), training's 1 x 9,216, and OpenRLHF's worst packing of the 16,192-token
#: training budget (every token of the bin used).
FULL_TOKENS = {"log-prob forward": 4 * 9216, "training step": 9216, "training step, worst packing": 16192}
TINY_TOKENS = {"log-prob forward": 4 * 64, "training step": 64, "training step, worst packing": 96}
#: |loss - fp64| / |fp64| and ||grad - fp64|| / ||fp64|| allowed per input dtype: fp32 keeps 24 bits
#: (u = 6e-8) through a few dozen operations; bf16 8 bits (u = 3.9e-3), the exp of a log ratio
#: multiplying its relative error by |log ratio| <= ~1 here.
LOSS_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def environment(device: str, size: str) -> dict[str, Any]:
    """Versions, the device and its usable memory, the driver and nvcc (:mod:`.prereqs`)."""
    from rpg_openrlhf.nodecheck import prereqs
    from rpg_openrlhf.nodecheck.environment import _version

    facts = prereqs.gather()
    out: dict[str, Any] = {
        "versions": {d: _version(d) for d in ("torch", "transformers", "triton", "openrlhf", "deepspeed",
                                               "flash-attn", "rpg-openrlhf")},  # fmt: skip
        "torch_cuda": torch.version.cuda, "prereqs": prereqs.summary(facts), "problems": prereqs.problems(facts),
    }  # fmt: skip
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(0)),
                   total_gib=total / GIB, usable_gib=free / GIB, gpus=torch.cuda.device_count())  # fmt: skip
        summary = f"{props.name}, {free / GIB:.2f} of {total / GIB:.2f} GiB free; {out['prereqs']}"
    else:
        summary = f"cpu; {out['prereqs']}"
    return {**out, "ok": True, "summary": summary}


# ----------------------------------------------------------------------------- losses
def _loss_inputs(
    device: str, dtype: torch.dtype, batch: int = 4, tokens: int = 64
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(batch, tokens, generator=g).pow(2) * 3
    x = {
        "old_logp": old, "logp": old + 0.2 * torch.randn(batch, tokens, generator=g),
        "ref_logp": old + 0.1 * torch.randn(batch, tokens, generator=g),
        "rollout_logp": old + 0.1 * torch.randn(batch, tokens, generator=g),
        "advantages": torch.randn(batch, 1, generator=g).expand(batch, tokens).contiguous(),
    }  # fmt: skip
    x = {k: v.to(dtype) for k, v in x.items()}  # rounded once: the fp64 reference sees the same inputs
    x["action_mask"] = torch.arange(tokens) < torch.randint(tokens // 2, tokens + 1, (batch, 1), generator=g)
    return {k: v.to(device) for k, v in x.items()}


def _loss_and_grad(name: str, style: str, x: dict[str, torch.Tensor], ref: bool, corrected: bool, dtype):
    from rpg_openrlhf.core import losses
    from rpg_openrlhf.core.correction import RolloutCorrection

    correction = RolloutCorrection(level="token") if corrected else RolloutCorrection()
    config = losses.LossConfig(beta=0.1, clip_c=3.0, rollout_correction=correction)
    logp = x["logp"].to(dtype).detach().requires_grad_(True)
    loss, _ = losses.compute_loss(
        name, style, logp, x["old_logp"].to(dtype), x["advantages"].to(dtype), x["action_mask"],
        x["ref_logp"].to(dtype) if ref else None, config, rollout_logp=x["rollout_logp"].to(dtype) if corrected else None,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad.double().cpu()


def losses_stage(device: str, size: str) -> dict[str, Any]:
    """Every registered (loss, style), pi_ref = pi_old and not, without and with the rollout correction,
    in bf16 and fp32 inputs on the device against fp64 on the same (rounded) inputs."""
    from rpg_openrlhf.core import LOSSES

    rows, worst = [], {"bf16": 0.0, "fp32": 0.0}
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        x = _loss_inputs(device, dtype)
        x64 = {k: v.cpu().double() if v.is_floating_point() else v.cpu() for k, v in x.items()}
        for (name, style), ref, corrected in (
            (k, r, c) for k in sorted(LOSSES) for r in (False, True) for c in (False, True)
        ):
            row = {"loss": name, "style": style, "pi_ref": "given" if ref else "pi_old", "corrected": corrected,
                   "dtype": tag}  # fmt: skip
            try:
                value, grad = _loss_and_grad(name, style, x, ref, corrected, dtype)
                value64, grad64 = _loss_and_grad(name, style, x64, ref, corrected, torch.float64)
            except Exception as exc:  # noqa: BLE001 (recorded: a loss that fails on the device is the finding)
                rows.append({**row, "error": f"{type(exc).__name__}: {exc}"})
                continue
            loss_err = abs(value - value64) / max(abs(value64), 1e-8)
            grad_err = float((grad - grad64).norm() / max(float(grad64.norm()), 1e-30))
            rows.append({**row, "loss_rel_err": loss_err, "grad_rel_err": grad_err})
            worst[tag] = max(worst[tag], loss_err, grad_err)
    errors = [r for r in rows if "error" in r]
    ok = not errors and all(
        worst[t] <= LOSS_TOL[d] for t, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))
    )
    summary = (f"{len(rows)} cases ({len(LOSSES)} losses x styles, pi_ref 2, correction 2, dtype 2); worst relative "
               f"error bf16 {worst['bf16']:.2g} (tol {LOSS_TOL[torch.bfloat16]:g}), fp32 {worst['fp32']:.2g} "
               f"(tol {LOSS_TOL[torch.float32]:g}); {len(errors)} errors")  # fmt: skip
    return {"ok": ok, "summary": summary, "worst": worst, "cases": rows}


# ----------------------------------------------------------------------------- policy
def _qwen3(shape: ModelShape, device: str):
    """A random-init Qwen3 of ``shape`` (transformers' Qwen3Config), bf16, gradient checkpointing on."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tie_word_embeddings, max_position_embeddings=32768,
    )  # fmt: skip
    from rpg_openrlhf.cpu_backend.standins import real_package_installed

    attn = "flash_attention_2" if real_package_installed("flash_attn") and device == "cuda" else "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16, attn_implementation=attn)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model, attn


def _peak(device: str, fn) -> tuple[Any, int | None, float]:
    """fn()'s result, the allocator's peak during it (bytes, CUDA only) and its seconds."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (
        result,
        (torch.cuda.max_memory_allocated() if device == "cuda" else None),
        time.perf_counter() - start,
    )


def _batch(
    tokens: int, rows: int, vocab: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows`` full-length sequences of tokens / rows each (what the plan assumes: every sequence at
    max_len), as OpenRLHF's Actor takes them: ids, attention mask, action mask of the last half."""
    g = torch.Generator().manual_seed(0)
    length = tokens // rows
    ids = torch.randint(0, vocab, (rows, length), generator=g).to(device)
    return ids, torch.ones_like(ids), torch.ones(rows, length // 2, dtype=torch.bool, device=device)


def _measure_phase(actor, model, shape: ModelShape, phase: str, n: int, device: str) -> dict[str, Any]:
    """One phase of :func:`policy` at ``n`` tokens: its peak and time against the plan's terms."""
    p = shape.params
    rows = 4 if phase == "log-prob forward" else 1
    ids, attn_mask, action = _batch(n, rows, shape.vocab, device)
    if phase == "log-prob forward":

        def run():
            with torch.no_grad():
                return actor(ids, action, attn_mask)

        planned = terms.weight_bytes(p, 0, 1) + terms.logits_forward_bytes(shape, n)
    else:

        def run():
            logp = actor(ids, action, attn_mask)
            logp.float().mean().backward()
            return logp

        act = terms.training_activation_split(shape, n, checkpointing=True)
        planned = terms.weight_bytes(p, 0, 1) + terms.gradient_bytes(p, 0, 1) + sum(act.values())
    try:
        _, peak, seconds = _peak(device, run)
    except torch.OutOfMemoryError as exc:
        return {"tokens": n, "error": f"out of memory: {str(exc)[:200]}", "planned_gib": planned / GIB}
    model.zero_grad(set_to_none=False)  # gradients stay allocated, as in training
    return {"tokens": n, "rows": rows, "seconds": seconds, "tokens_per_s": n / seconds,
            "peak_gib": peak / GIB if peak else None, "planned_gib": planned / GIB,
            "measured_over_planned": peak / planned if peak else None}  # fmt: skip


def policy(device: str, size: str) -> dict[str, Any]:
    """OpenRLHF's Actor around a random-init Qwen3-4B shape (tiny on CPU), packing on: a training step's
    and a no-grad log-prob forward's peak memory at the 8K plan's token counts, against the plan's terms
    for the same shape on one GPU without DeepSpeed (weights + bf16 gradients + activations; the
    optimizer is the ZeRO stage's business); tokens/s; the chunked log-prob path."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins(("flash_attn",))  # OpenRLHF's models import flash_attn's helpers; the kit has none
    from openrlhf.models import Actor

    shape = PAPER_MODELS["Qwen/Qwen3-4B"] if size == "full" else TINY
    tokens = FULL_TOKENS if size == "full" else TINY_TOKENS
    model, attn = _qwen3(shape, device)
    packed = attn == "flash_attention_2"  # sdpa on packed rows would build an N x N block mask
    actor = Actor(model)
    actor.packing_samples = packed  # Actor sets it only when it loads the model itself
    p = shape.params
    try:
        import flash_attn.ops.triton.cross_entropy  # noqa: F401  (what log_probs_from_logits prefers)

        ce = "flash-attn's Triton cross-entropy"
    except ImportError:
        ce = "torch fallback (chunked logsumexp): flash-attn absent"
    out: dict[str, Any] = {"shape": "Qwen3-4B" if size == "full" else "tiny", "params": p, "attention": attn,
                           "packing": packed, "cross_entropy": ce, "phases": {}}  # fmt: skip
    for phase, n in tokens.items():
        out["phases"][phase] = _measure_phase(actor, model, shape, phase, n, device)
    out["chunked"] = _chunked_phase(model, shape, tokens["log-prob forward"], device)
    model.zero_grad(set_to_none=True)
    ok = all("error" not in v for v in (*out["phases"].values(), out["chunked"]))
    cells = [f"{k} {v['tokens']} tok: " + (v["error"][:40] if "error" in v else
             (f"{v['peak_gib']:.1f}/{v['planned_gib']:.1f} GiB measured/planned, " if v["peak_gib"] else "")
             + f"{v['tokens_per_s']:.0f} tok/s") for k, v in out["phases"].items()]  # fmt: skip
    return {
        **out,
        "ok": ok,
        "summary": f"{out['shape']} ({attn}); "
        + "; ".join(cells)
        + f"; chunked: {out['chunked']['summary']}",
    }


def _chunked_phase(model, shape: ModelShape, n: int, device: str) -> dict[str, Any]:
    """The log-prob forward through the chunked path (hidden states -> chunked_logprobs)."""
    from rpg_openrlhf.core.logprobs import chunked_logprobs as chunked

    ids, attn_mask, _ = _batch(n, 4, shape.vocab, device)

    def run():
        with torch.no_grad():
            hidden = model.model(ids, attention_mask=attn_mask).last_hidden_state
            # chunked_logprobs takes token rows: [N, H] hidden states and [N] labels
            rows = hidden[:, :-1].reshape(-1, hidden.shape[-1])
            logp, _ = chunked(rows, model.lm_head.weight, ids[:, 1:].reshape(-1))
            return logp

    try:
        _, peak, seconds = _peak(device, run)
    except Exception as exc:  # noqa: BLE001 (recorded as the measurement's error: the stage fails)
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return {"error": error, "summary": f"error {error[:120]}"}
    planned = terms.weight_bytes(shape.params, 0, 1)
    peak_txt = f"{peak / GIB:.1f} GiB peak (weights {planned / GIB:.1f}), " if peak else ""
    return {"peak_gib": peak / GIB if peak else None, "seconds": seconds, "tokens": n,
            "summary": f"{peak_txt}{n / seconds:.0f} tok/s"}  # fmt: skip


# ----------------------------------------------------------------------------- DeepSpeed
def zero2(device: str, size: str) -> dict[str, Any]:
    """DeepSpeed ZeRO-2 on one rank (Qwen3-0.6B shape; tiny on CPU), OpenRLHF's optimizer choice
    ("AdamW": FusedAdam on CUDA, JIT-compiled here unless prebuilt): does it build, one step, the
    optimizer states (fp32 master + m + v) against the plan's 12P, and what OpenRLHF's sleep offload leaves."""
    import deepspeed

    shape = QWEN3_06B if size == "full" else TINY
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    model, _ = _qwen3(shape, device)
    config = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2}, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "betas": [0.9, 0.95], "weight_decay": 0.0}},
    }  # fmt: skip
    if device == "cpu":  # the CPU check runs the code path, not a JIT build of DeepSpeed's CPU op
        config["optimizer"]["params"]["torch_adam"] = True
    start = time.perf_counter()
    try:
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, config=config, model_parameters=model.parameters()
        )
    except Exception as exc:  # noqa: BLE001 (no nvcc: this is what the node would do at the first training init)
        return {
            "ok": False,
            "summary": f"deepspeed.initialize failed: {type(exc).__name__}: {str(exc)[:300]}",
        }
    built = time.perf_counter() - start
    inner = type(getattr(optimizer, "optimizer", optimizer)).__name__
    ids = torch.randint(0, shape.vocab, (1, 512 if size == "full" else 32), device=device)
    loss = engine(ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    state = sum(t.numel() * t.element_size() for s in engine.optimizer.optimizer.state.values()
                for t in s.values() if torch.is_tensor(t) and t.dim() > 0)  # fmt: skip
    master = sum(t.numel() * t.element_size() for t in engine.optimizer.single_partition_of_fp32_groups)
    planned = terms.adam_bytes(shape.params, 2, 1)
    out = {"optimizer": inner, "init_s": built, "adam_bytes": state + master, "planned_adam_bytes": planned,
           "adam_over_planned": (state + master) / planned}  # fmt: skip
    if device == "cuda":
        out.update(_after_offload(engine, shape))
    ok = math.isclose(out["adam_over_planned"], 1.0, rel_tol=0.05)
    rest = (
        f"; after sleep offload {out['left_after_offload_gib']:.2f} GiB (plan: bf16 weights {out['planned_at_rest_gib']:.2f})"
        if "left_after_offload_gib" in out
        else ""
    )
    summary = (f"{inner} built in {built:.0f} s; optimizer states {(state + master) / GIB:.3f} GiB vs planned 12P "
               f"{planned / GIB:.3f} GiB{rest}")  # fmt: skip
    return {**out, "ok": ok, "summary": summary}


def _after_offload(engine, shape: ModelShape) -> dict[str, float]:
    """What OpenRLHF's sleep offload (``offload_deepspeed_states``) leaves allocated, against the plan's
    at-rest term (the bf16 weights)."""
    from openrlhf.utils.deepspeed.deepspeed_utils import offload_deepspeed_states

    before = torch.cuda.memory_allocated()
    offload_deepspeed_states(engine)
    torch.cuda.synchronize()
    return {"allocated_before_offload_gib": before / GIB, "left_after_offload_gib": torch.cuda.memory_allocated() / GIB,
            "planned_at_rest_gib": terms.weight_bytes(shape.params, 2, 1) / GIB}  # fmt: skip


STAGES = {
    "environment": environment,
    "losses": losses_stage,
    "policy": policy,
    "zero2": zero2,
}
