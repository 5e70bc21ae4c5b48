"""The node itself: its CUDA prerequisites (driver, nvcc: :mod:`rpg_openrlhf.nodecheck.prereqs`), a CUDA torch with the GPUs asked for, flash-attn's CUDA extension, vLLM, DeepSpeed,
NCCL; then flash-attn's numerics against an fp32 reference."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from rpg_openrlhf.nodecheck import prereqs
from rpg_openrlhf.nodecheck.measure import Check

#: flash-attn bf16 causal attention vs fp32 math attention, max |difference| on N(0, 1) inputs
#: (bf16 keeps 8 bits of mantissa: ~4e-3 relative per rounding). Not yet measured on a GPU.
FLASH_TOL = 2e-2


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


def check_environment(gpus: int, facts: prereqs.Facts | None = None) -> Check:
    """One line: the torch build, the node's CUDA prerequisites (driver, nvcc: :mod:`.prereqs`), the
    GPUs, and the versions of what the GPU path needs. ``facts``: :func:`prereqs.gather`'s by default."""
    import torch

    from rpg_openrlhf.launch.backend import torch_build

    facts = facts or prereqs.gather()
    if not facts.torch_cuda:
        return Check("environment", False, torch_build(), {"torch": facts.torch_version})
    found = prereqs.problems(facts)
    if found:  # a pre-580 driver, no nvcc: named before "no GPU visible" could blame CUDA_VISIBLE_DEVICES
        return Check("environment", False, "; ".join(found), {"prereqs": prereqs.summary(facts)})
    if not torch.cuda.is_available():
        return Check("environment", False, torch_build(), {"torch": torch.__version__})
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    values = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": names, "prereqs": prereqs.summary(facts),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        **{d: _version(d) for d in ("flash-attn", "vllm", "deepspeed", "openrlhf", "ray", "transformers")},
    }  # fmt: skip
    problems = [
        f"{d} missing" for d in ("flash-attn", "vllm", "deepspeed", "openrlhf") if values[d] == "missing"
    ]
    if len(names) < gpus:
        problems.append(f"{len(names)} GPU(s) visible, --gpus {gpus} asked")
    try:
        import flash_attn_2_cuda  # noqa: F401  (the compiled extension: built for this torch?)
    except ImportError as exc:
        problems.append(f"flash-attn's CUDA extension does not load ({exc})")
    summary = (
        f"{values['prereqs']}, NCCL {values['nccl']}; {len(names)} x {names[0]}; "
        f"flash-attn {values['flash-attn']}, vllm {values['vllm']}, deepspeed {values['deepspeed']}"
    )
    return Check("environment", not problems, "; ".join([summary, *problems]), values)


def check_flash_attention(seq_len: int, heads: int = 2, head_dim: int = 32) -> Check:
    """flash-attn's causal bf16 attention vs an fp32 reference of the same inputs, at ``seq_len``."""
    import torch
    from flash_attn import flash_attn_func

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, seq_len, heads, head_dim, device="cuda", generator=gen) for _ in range(3))
    out = flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=True).float()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    err = float((out - ref).abs().max())
    detail = f"bf16 causal attention vs fp32, {seq_len} tokens: max |diff| {err:.3g} (tolerance {FLASH_TOL})"
    return Check("flash-attention", err <= FLASH_TOL, detail, {"max_abs_diff": err, "seq_len": seq_len})
