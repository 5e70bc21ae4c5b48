"""The phases of one OpenRLHF 0.11.2 step on a GPU and what each holds: the memory plan's rows.

:class:`Setup` reads what matters from the arguments (ZeRO stage, ranks, sleep, colocation, vLLM's
share, checkpointing); each ``*_phase`` function lists a phase's terms in bytes on the GPU where its
work runs, with whatever is colocated there (:mod:`rpg_openrlhf.launch.memory_plan` says what each
phase is; :mod:`rpg_openrlhf.launch.memory_terms` what each term costs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rpg_openrlhf.common.args import get
from rpg_openrlhf.launch import memory_terms as mt
from rpg_openrlhf.launch.micro_batches import MicroBatch, actor_ranks
from rpg_openrlhf.launch.model_shape import ModelShape

GIB = 2**30
RESERVE = "reserve (CUDA contexts, NCCL, fragmentation)"
VLLM_SHARE = "vLLM share (gpu_memory_utilization x GPU)"
REFERENCE_WEIGHTS = "reference weights (bf16, never sleeps)"


@dataclass(frozen=True)
class Phase:
    """One phase's terms (name -> bytes) on its busiest GPU."""

    name: str
    terms: dict[str, int]
    micro_batch: MicroBatch | None = None

    @property
    def total(self) -> int:
        return sum(self.terms.values())

    def largest_term(self) -> tuple[str, int]:
        return max(((k, v) for k, v in self.terms.items() if k != RESERVE), key=lambda kv: kv[1])


def _sleeping(args: Any, key: str) -> bool:
    # OpenRLHF turns --vllm.enable_sleep off without --train.colocate_all; DeepSpeed sleep works alone
    return bool(get(args, key, False)) and (
        key != "vllm.enable_sleep" or bool(get(args, "train.colocate_all"))
    )


def needs_reference(args: Any) -> bool:
    """Whether a reference group starts: RPG's ``--rpg.ref_update`` decides for RPG runs (it sets
    OpenRLHF's ``--algo.kl.init_coef`` switch itself), ``--algo.kl.init_coef`` > 0 for stock runs."""
    from rpg_openrlhf.plugin import flags

    if flags.enabled(args):
        return flags.needs_reference_model(args)
    return float(get(args, "algo.kl.init_coef", 0) or 0) > 0


def _chunk_budget(args: Any) -> int | None:
    """The chunk budget in bytes when the run takes the chunked log-prob path, else None."""
    from rpg_openrlhf.common import logprobs_path
    from rpg_openrlhf.plugin import flags

    mode, _ = logprobs_path.mode_of(args, rpg_run=flags.enabled(args))
    if mode != "chunked":
        return None
    return int(get(args, logprobs_path.BUDGET_KEY) or logprobs_path.DEFAULT_CHUNK_MIB) * 2**20


@dataclass(frozen=True)
class Setup:
    """What the plan reads from the arguments (the GPU shape the flags describe)."""

    shape: ModelShape
    zero_stage: int
    actor_dp: int
    ref_dp: int
    reference: bool
    engines_with_actor: bool  # --train.colocate_all: an engine shard on every actor GPU
    ref_with_actor: bool  # --train.colocate_all or --train.colocate_actor_ref
    vllm_share: int  # bytes vLLM claims while awake: u G
    vllm_sleep: bool
    ds_sleep: bool
    adam_offload: bool
    overlap_comm: bool
    ref_offload: bool
    checkpointing: bool
    entropy_graph: bool
    reserve: int
    chunk_budget: int | None = None  # bytes: the chunked log-prob path (--logprobs.chunked)

    @classmethod
    def from_args(cls, args: Any, shape: ModelShape, gpu_memory_gib: float, reserve_gib: float) -> Setup:
        colocate_all = bool(get(args, "train.colocate_all")) and not get(args, "train.async_enable", False)
        ref_gpus = get(args, "ref.num_nodes", 1) * get(args, "ref.num_gpus_per_node", 1)
        entropy_coef = get(args, "actor.entropy_coef")
        return cls(
            chunk_budget=_chunk_budget(args),
            shape=shape,
            zero_stage=int(get(args, "ds.zero_stage", 2)),
            actor_dp=actor_ranks(args),
            ref_dp=max(
                1, ref_gpus // (get(args, "ds.ring_attn_size", 1) * get(args, "ds.tensor_parallel_size", 1))
            ),
            reference=needs_reference(args),
            engines_with_actor=colocate_all and int(get(args, "vllm.num_engines") or 0) > 0,
            ref_with_actor=bool(get(args, "train.colocate_all") or get(args, "train.colocate_actor_ref")),
            vllm_share=int(float(get(args, "vllm.gpu_memory_utilization", 0.9)) * gpu_memory_gib * GIB),
            vllm_sleep=_sleeping(args, "vllm.enable_sleep"),
            ds_sleep=bool(get(args, "ds.enable_sleep", False)),
            adam_offload=bool(get(args, "ds.adam_offload", False)),
            overlap_comm=bool(get(args, "ds.overlap_comm", False)),
            ref_offload=bool(get(args, "ref.offload", False)),
            checkpointing=bool(get(args, "actor.gradient_checkpointing_enable", False)),
            entropy_graph=entropy_coef is not None and float(entropy_coef) != 0.0,
            reserve=int(reserve_gib * GIB),
        )

    def actor_states(self, training: bool) -> dict[str, int]:
        """The actor's model states on one GPU: resting (sleep keeps only the bf16 weights) or training."""
        p, s, d = self.shape.params, self.zero_stage, self.actor_dp
        terms = {"actor weights (bf16)": mt.weight_bytes(p, s, d)}
        if training or not self.ds_sleep:
            terms["actor gradients (bf16)"] = mt.gradient_bytes(p, s, d)
            terms["actor Adam states (fp32 master, m, v)"] = mt.adam_bytes(p, s, d, self.adam_offload)
        return terms

    def reference_weights(self) -> int:
        """The reference model's bf16 weights (ZeRO-3 shards them; --ref.offload moves them to CPU)."""
        if self.zero_stage == 3:
            return 0 if self.ref_offload else mt.weight_bytes(self.shape.params, 3, self.ref_dp)
        return mt.weight_bytes(self.shape.params, 0, 1)

    def on_actor_gpu(self, engine_awake: bool = False) -> dict[str, int]:
        """What else rests on an actor GPU: the engine shard and the reference model, if colocated."""
        terms: dict[str, int] = {}
        if self.engines_with_actor and (engine_awake or not self.vllm_sleep):
            terms[VLLM_SHARE] = self.vllm_share
        if self.reference and self.ref_with_actor:
            terms[REFERENCE_WEIGHTS] = self.reference_weights()
        return terms


def forward_activations(setup: Setup, tokens: int) -> dict[str, int]:
    """A no-grad forward: the logits at the fp32 cast (or the chunked head's), or one layer's
    activations if larger."""
    if setup.chunk_budget is not None:
        name, logits = (
            "log-prob head (chunked)",
            mt.chunked_forward_bytes(setup.shape, tokens, setup.chunk_budget),
        )
    else:
        name, logits = "logits (bf16 + fp32 copy)", mt.logits_forward_bytes(setup.shape, tokens)
    layer = mt.layer_activation_bytes_per_token(setup.shape) * tokens
    if layer > logits:
        return {"one layer's activations": layer}
    return {name: logits}


def _zero3(setup: Setup, training: bool) -> dict[str, int]:
    if setup.zero_stage != 3:
        return {}
    return {"ZeRO-3 gathered weights": mt.zero3_gathered_bytes(setup.shape, training)}


def rollout_phase(setup: Setup) -> Phase:
    """vLLM generating: its share, plus the models resting on the same GPU."""
    if not setup.engines_with_actor:
        return Phase("rollout engines", {VLLM_SHARE: setup.vllm_share, RESERVE: setup.reserve})
    terms = {**setup.actor_states(training=False), **setup.on_actor_gpu(engine_awake=True)}
    return Phase("rollout engines", {**terms, RESERVE: setup.reserve})


def log_prob_phase(setup: Setup, batch: MicroBatch) -> Phase:
    """The actor's no-grad forward over the rollout micro-batch (old log-probs)."""
    terms = {**setup.actor_states(training=False), **setup.on_actor_gpu()}
    terms.update({**_zero3(setup, False), **forward_activations(setup, batch.tokens), RESERVE: setup.reserve})
    return Phase("log-prob forward", terms, batch)


def reference_phase(setup: Setup, batch: MicroBatch) -> Phase:
    """The reference model's no-grad forward over the same micro-batch."""
    if setup.ref_with_actor:
        terms = {**setup.actor_states(training=False), **setup.on_actor_gpu()}
    else:
        terms = {REFERENCE_WEIGHTS: setup.reference_weights()}
    terms.update({**_zero3(setup, False), **forward_activations(setup, batch.tokens), RESERVE: setup.reserve})
    return Phase("reference forward", terms, batch)


def training_phase(setup: Setup, batch: MicroBatch) -> Phase:
    """One training micro-step: all model states, and the backward's peak (activations and ZeRO's
    gradient bucket) or, if larger, the optimizer step's temporaries."""
    terms = {**setup.actor_states(training=True), **setup.on_actor_gpu(), **_zero3(setup, True)}
    backward = mt.training_activation_split(
        setup.shape, batch.tokens, setup.checkpointing, setup.entropy_graph, setup.chunk_budget
    )
    bucket = mt.reduce_bucket_bytes(setup.zero_stage, setup.overlap_comm)
    if bucket:
        backward["ZeRO gradient bucket"] = bucket
    p, s, d = setup.shape.params, setup.zero_stage, setup.actor_dp
    step = mt.step_temporary_bytes(p, s, d, setup.adam_offload)
    peak = {"optimizer step temporaries": step} if step > sum(backward.values()) else backward
    return Phase("training step", {**terms, **peak, RESERVE: setup.reserve}, batch)
