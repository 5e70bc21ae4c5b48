"""The memory plan: per-GPU peak of each phase of an OpenRLHF 0.11.2 step, from its main terms.

``rpg-train ... --dry-run`` prints it (and, on the gpu backend, refuses a config whose plan does not
fit ``--plan.gpu_memory_gib``). It plans the GPU shape the flags ask for (before the CPU backend turns
vLLM sleep off and flash-attention into sdpa) from ``config.json`` alone. The phases and what each
holds: docs/training.md, "Memory plan"; each ``*_phase`` function lists a phase's terms in bytes on the
GPU where its work runs, with whatever is colocated there (:class:`Setup` reads what matters from the
arguments); what each term costs: :mod:`.memory_terms`.

At rest a GPU keeps the actor's bf16 weights (``--ds.enable_sleep`` offloads everything else:
``offload_deepspeed_states`` leaves ``lp_params`` out), the reference model's weights (it never
sleeps) and vLLM's share unless ``--vllm.enable_sleep``. The GPU memory G: ``--plan.gpu_memory_gib``;
else the smallest visible GPU's total memory as the device reports it (an H100 80GB: ~79.2 GiB); else
80, assumed; the plan names which (``gpu_memory_source``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rpg_openrlhf.common.args import get
from rpg_openrlhf.launch import memory_terms as mt
from rpg_openrlhf.launch.micro_batches import (
    MicroBatch,
    actor_ranks,
    rollout_micro_batch,
    training_micro_batch,
)
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


DEFAULT_GPU_MEMORY_GIB = 80.0
DEFAULT_RESERVE_GIB = 4.0
FLAG = "--plan.gpu_memory_gib"
ASSUMED = f"assumed: no GPU visible here; {FLAG} sets it"

#: How to shrink each kind of term (the refusal names the largest term of the phase that breaks);
#: the first key the term's name contains wins.
REMEDIES = {
    "logits": "--train.dynamic_batch_enable with a smaller --train.max_tokens_per_gpu / "
    "--rollout.max_tokens_per_gpu, or smaller --train.micro_batch_size / --rollout.micro_batch_size",
    "log-prob head": "a smaller --logprobs.chunk_mib, or fewer tokens per micro-batch",
    "layer activations": "--actor.gradient_checkpointing_enable, or fewer tokens per micro-batch",
    "layer": "fewer tokens per micro-batch (--train.max_tokens_per_gpu or --train.micro_batch_size)",
    "vLLM": "--vllm.enable_sleep (with --train.colocate_all), or a smaller --vllm.gpu_memory_utilization",
    "actor weights": "--ds.zero_stage 3, or more GPUs",
    "gradients": "--ds.zero_stage 2 or 3",
    "Adam": "--ds.adam_offload, or --ds.zero_stage 1-3 with more GPUs",
    "optimizer step": "--ds.adam_offload",
    "reference": "--ds.zero_stage 3 (shards the reference model; it never sleeps)",
}


@dataclass(frozen=True)
class Plan:
    """Every phase of one config, against the GPU memory it is given."""

    shape: ModelShape
    gpu_memory_gib: float
    phases: list[Phase] = field(default_factory=list)
    gpu_memory_source: str = FLAG

    def _capacity_text(self) -> str:
        if self.gpu_memory_source == FLAG:
            return f"{FLAG} {self.gpu_memory_gib:g}"
        return f"{self.gpu_memory_gib:g} GiB ({self.gpu_memory_source})"

    @property
    def capacity(self) -> int:
        return int(self.gpu_memory_gib * GIB)

    def breaking(self) -> Phase | None:
        """The phase with the highest peak, if that peak exceeds the GPU memory."""
        worst = max(self.phases, key=lambda p: p.total)
        return worst if worst.total > self.capacity else None

    def to_json(self) -> dict[str, Any]:
        """The plan as the dry-run prints it (GiB, 2 decimals)."""
        return {
            "model": {**asdict(self.shape), "params": self.shape.params},
            "gpu_memory_gib": self.gpu_memory_gib,
            "gpu_memory_source": self.gpu_memory_source,
            "phases": {
                p.name: {
                    "total_gib": _gib(p.total),
                    "terms_gib": {k: _gib(v) for k, v in p.terms.items()},
                    **({"micro_batch": p.micro_batch.how} if p.micro_batch else {}),
                }
                for p in self.phases
            },
            "fits": self.breaking() is None,
        }

    def lines(self) -> list[str]:
        """A readable table: one line per phase, its total and its terms."""
        head = (
            f"memory plan per GPU in GiB, {self.gpu_memory_gib:g} GiB given ({self.gpu_memory_source}); "
            f"{self.shape.params / 1e9:.2f}e9 parameters, shape from {self.shape.source}"
        )
        rows = [head]
        for p in self.phases:
            terms = " + ".join(f"{k} {_gib(v):.2f}" for k, v in p.terms.items())
            where = f" [{p.micro_batch.how}]" if p.micro_batch else ""
            rows.append(f"  {p.name:<18} {_gib(p.total):7.2f} = {terms}{where}")
        rows.append(f"  {'fits' if self.breaking() is None else 'DOES NOT FIT'}")
        return rows

    def refusal(self) -> str | None:
        """One line naming the phase and term that break the plan, or None when it fits."""
        phase = self.breaking()
        if phase is None:
            return None
        term, size = phase.largest_term()
        remedy = next((r for key, r in REMEDIES.items() if key in term), "a GPU with more memory")
        return (
            f"memory plan: the {phase.name} needs {phase.total / GIB:.3g} GiB per GPU, more than "
            f"{self._capacity_text()}; its largest term is {term} "
            f"({size / GIB:.3g} GiB): try {remedy}"
        )


def _gib(n: int) -> float:
    return round(n / GIB, 2)


def plan_for(
    args: Any,
    shape: ModelShape,
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    gpu_memory_source: str = FLAG,
) -> Plan:
    """The plan of one set of (processed, nested) OpenRLHF arguments."""
    setup = Setup.from_args(args, shape, gpu_memory_gib, reserve_gib)
    rollout_batch = rollout_micro_batch(args)
    phases = []
    if int(get(args, "vllm.num_engines") or 0) > 0:
        phases.append(rollout_phase(setup))
    phases.append(log_prob_phase(setup, rollout_batch))
    if setup.reference:
        phases.append(reference_phase(setup, rollout_batch))
    phases.append(training_phase(setup, training_micro_batch(args)))
    return Plan(shape, gpu_memory_gib, phases, gpu_memory_source)


def add_arguments(parser: Any) -> None:
    """``--plan.gpu_memory_gib`` and ``--plan.reserve_gib`` (the launcher's namespace)."""
    from rpg_openrlhf.common.cliutil import float_in

    parser.add_argument(
        "--plan.gpu_memory_gib",
        type=float_in(0, low_open=True),
        default=None,
        help="GPU memory per GPU (GiB) the memory plan must fit; the gpu backend refuses a config "
        "whose plan does not (default: the smallest visible GPU's total memory, read from the device; "
        f"{DEFAULT_GPU_MEMORY_GIB:g}, assumed, where no GPU is visible)",
    )
    parser.add_argument(
        "--plan.reserve_gib",
        type=float_in(0),
        default=DEFAULT_RESERVE_GIB,
        help="GiB the plan keeps free on every GPU for CUDA contexts, NCCL buffers and allocator "
        f"fragmentation (an allowance, not a measurement; default {DEFAULT_RESERVE_GIB:g})",
    )


def from_args(args: Any) -> Plan | str:
    """The plan of the run's arguments, or why there is none (the model's shape is unknown offline)."""
    from rpg_openrlhf.launch.model_shape import load_shape

    try:
        shape = load_shape(str(get(args, "actor.model_name_or_path")))
    except LookupError as exc:
        return f"no memory plan: {exc}"
    given = get(args, "plan.gpu_memory_gib", None)
    gpu, source = (float(given), FLAG) if given is not None else device_capacity()
    return plan_for(args, shape, gpu, float(get(args, "plan.reserve_gib", DEFAULT_RESERVE_GIB)), source)


def device_capacity() -> tuple[float, str]:
    """(GiB, where it came from): the smallest visible GPU's total memory, or 80 assumed without CUDA.
    ``get_device_properties`` creates no CUDA context (``mem_get_info`` would, in the driver, for
    the whole run); what other processes hold is not subtracted (the reserve is for that)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return DEFAULT_GPU_MEMORY_GIB, ASSUMED
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    small = min(props, key=lambda p: p.total_memory)
    gib = round(small.total_memory / GIB, 2)
    return gib, f"measured: {small.name} total memory, smallest of {len(props)} visible GPU(s)"
