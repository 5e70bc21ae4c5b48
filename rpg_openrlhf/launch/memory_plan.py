"""The memory plan: per-GPU peak of each phase of an OpenRLHF 0.11.2 step, from its main terms.

``rpg-train ... --dry-run`` prints it (and, on the gpu backend, refuses a config whose plan does not
fit ``--plan.gpu_memory_gib``). It plans the GPU shape the flags ask for (before the CPU backend turns
vLLM sleep off and flash-attention into sdpa) from ``config.json`` alone. The phases and what each
holds: docs/training.md, "Memory plan"; their terms: :mod:`.memory_phases`, :mod:`.memory_terms`.

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
from rpg_openrlhf.launch.memory_phases import (
    GIB,
    Phase,
    Setup,
    log_prob_phase,
    reference_phase,
    rollout_phase,
    training_phase,
)
from rpg_openrlhf.launch.micro_batches import rollout_micro_batch, training_micro_batch
from rpg_openrlhf.launch.model_shape import ModelShape

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
