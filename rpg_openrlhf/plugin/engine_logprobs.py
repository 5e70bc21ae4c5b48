"""The rollout engine's log-probs of the sampled tokens, for ``--rpg.old_logp engine`` (pi_old = the
engine's policy, no actor forward; verl's "bypass").

What they are. OpenRLHF creates its vLLM engines with ``logprobs_mode="processed_logprobs"`` and
asks for ``SamplingParams(logprobs=1)``; vLLM then returns, for each sampled token o_t, the log of the
probability it sampled o_t with: ``log_softmax(top_k_top_p(logits_t / T))[o_t]`` (vLLM 0.29's
``Sampler.sample`` divides by the temperature, then ``TopKTopPSampler`` masks and takes the log-softmax
of what it samples from). OpenRLHF's actor computes its log-probs as ``log_softmax(logits_t /
T)[o_t]`` with ``T = --rollout.temperature`` (``Actor.forward``), so with ``--rollout.top_p 1`` (and
no top-k) both are log-probs of the same distribution: the engine's are its own kernels' (bf16 on a
GPU), the actor's its own. With top-p / top-k the engine's are the truncated distribution it really
sampled from, which the actor's are not. Either way they are exactly the sampling distribution's,
per token, whichever weights produced each token (async, partial rollouts).

OpenRLHF asks the engines for them only when its correction is on (``--algo.advantage.
is_correction_level`` token/seq); ``--rpg.old_logp engine`` needs them with the correction off:
:func:`use_processed_logprobs` (engine creation, seam ``engine_logprobs_mode``) and
:func:`request_from_engines` (each request, seam ``engine_logprobs_request``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from rpg_openrlhf.common import seam

#: vLLM's logprobs_mode whose log-probs are those of the distribution sampled from (OpenRLHF's choice).
PROCESSED = "processed_logprobs"


def of_samples(samples_list: Sequence[Any]) -> list[torch.Tensor]:
    """Each experience micro-batch's engine log-probs ([B, A], aligned with its action mask)."""
    logps = [s.rollout_log_probs for s in samples_list]
    if any(lp is None for lp in logps):
        raise RuntimeError(
            "RPG: --rpg.old_logp engine, but the samples carry no engine log-probs (rollout_log_probs): "
            "were the engines asked for them (SamplingParams(logprobs=1))?"
        )
    return [lp.float() for lp in logps]


def as_forward_result(logps: Sequence[torch.Tensor], duplicates: int) -> Any:
    """What the actor group's ``forward`` would have returned, as one Ray object: OpenRLHF's
    ``_flatten_results`` takes every ``duplicates``-th entry (ring attention / tensor-parallel copies)
    and flattens the per-rank lists (its own ``dummy_ref`` has the same layout)."""
    import ray

    return ray.put([[lp] for lp in logps for _ in range(duplicates)])


def with_processed_logprobs(create: Callable[..., Any]) -> Callable[..., Any]:
    """``create_vllm_engines`` (OpenRLHF's or the CPU backend's, same signature) with
    ``logprobs_mode="processed_logprobs"`` whatever the caller passed (train() passes None with the
    correction off)."""
    if getattr(create, "_rpg_processed_logprobs", False):
        return create
    signature = inspect.signature(create)

    @functools.wraps(create)
    def create_vllm_engines(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["logprobs_mode"] = PROCESSED
        return create(*bound.args, **bound.kwargs)

    create_vllm_engines._rpg_processed_logprobs = True  # type: ignore[attr-defined]
    return create_vllm_engines


def use_processed_logprobs(module: ModuleType) -> None:
    """The seam's ``engine_logprobs_mode`` (stage ``engine-logprobs``): engines are created returning
    processed log-probs. Applied after the CPU backend's engine swap, so it wraps whichever is there."""
    module.create_vllm_engines = with_processed_logprobs(module.create_vllm_engines)


def request_from_engines(generator: Any) -> None:
    """Every request of ``generator`` (OpenRLHF's ``SamplesGenerator``) asks for the sampled tokens'
    log-probs: its ``_dispatch_prompts_to_vllm`` builds ``SamplingParams(logprobs=1 if
    args.algo.advantage.is_correction_level != "off" else None)``, so the level reads ``token`` while it
    runs (seam ``engine_logprobs_request``; the RPG loss reads its correction from the config it was
    built with, never from there)."""
    if getattr(generator, "_rpg_engine_logprobs", False):
        return
    original = generator._dispatch_prompts_to_vllm
    advantage = generator.args.algo.advantage

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        with seam.swapped(advantage, is_correction_level="token"):
            return original(*args, **kwargs)

    generator._dispatch_prompts_to_vllm = dispatch
    generator._rpg_engine_logprobs = True
