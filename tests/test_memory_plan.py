"""The memory plan in ``rpg-train --dry-run``: micro-batch sizes as OpenRLHF forms them, the 8K configs
fit 80 GiB with dynamic micro-batches and did not with fixed ones, and the gpu backend refuses a plan over
its GPU memory in one line naming the term (each term measured: test_memory_plan_terms.py)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg_openrlhf.launch import memory_plan
from rpg_openrlhf.launch.micro_batches import balanced_sequences, packed_worst_tokens

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
DYNAMIC = (
    "ds.packing_samples",
    "train.dynamic_batch_enable",
    "train.max_tokens_per_gpu",
    "rollout.max_tokens_per_gpu",
)


sys.path.insert(0, str(REPO / "configs"))
import experiments as EXP  # noqa: E402  (configs/experiments.py: the paper configs' generator)


@pytest.fixture
def hub_online(monkeypatch):
    """Dry runs of hub ids that are not cached need a hub that may download (nothing is fetched)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def dry_run(argv: list[str], capsys) -> dict:
    from rpg_openrlhf.launch.cli import main

    main([*argv, "--dry-run"])
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


def config_argv(name: str, old_micro_batches: bool = False) -> list[str]:
    """A paper config's argv; ``old_micro_batches``: as committed before the memory plan (fixed
    micro-batches of 8 / 4 padded sequences, no dynamic batching, OpenRLHF's log-prob path)."""
    config = EXP.load(name)
    if old_micro_batches:
        flags = {k: v for k, v in config["flags"].items() if k not in DYNAMIC}
        config = {**config, "flags": {**flags, "rollout.micro_batch_size": 8, "train.micro_batch_size": 4}}
    before = ["--logprobs.full"] if old_micro_batches else []  # and OpenRLHF's full logits
    return [*EXP.to_argv(config, data="/d.jsonl", out="/runs"), "--rpg.backend", "cpu", *before]


def openrlhf_largest_micro_batches(n: int, seq_len: int, cap: int, ranks: int) -> tuple[int, int]:
    """Sequences in the largest dynamic micro-batch of n equal sequences, from OpenRLHF's own split
    (rollout: the count rounded to the ranks) and its own partition functions (training,
    setup_dynamic_batch's per-step part)."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    ns = SimpleNamespace
    args = ns(
        train=ns(dynamic_batch_enable=True), rollout=ns(max_tokens_per_gpu=cap),
        actor=ns(num_nodes=1, num_gpus_per_node=ranks), ds=ns(ring_attn_size=1, tensor_parallel_size=1),
    )  # fmt: skip
    samples = [
        Experience(sequences=torch.zeros(1, 1), total_length=torch.tensor([seq_len])) for _ in range(n)
    ]
    maker = ns(args=args, tokenizer=ns(pad_token_id=0))
    rollout = max(len(b.sequences) for b in RemoteExperienceMaker.split_rollout_samples(maker, samples))
    return rollout, openrlhf_largest([seq_len] * n, cap) // seq_len  # training: equal lengths


def test_micro_batches_are_openrlhfs_on_random_shapes() -> None:
    """300 random shapes (caps below one sequence included; OpenRLHF needs n >= ranks)."""
    rng = random.Random(0)
    for _ in range(300):
        ranks = rng.choice([1, 2, 3, 4, 8])
        n, seq_len, cap = rng.randint(ranks, 96), rng.randint(1, 60), rng.randint(1, 200)
        expected = (
            balanced_sequences(n, seq_len, cap, multiple_of=ranks),
            balanced_sequences(n, seq_len, cap),
        )
        assert openrlhf_largest_micro_batches(n, seq_len, cap, ranks) == expected, (n, seq_len, cap, ranks)


def expected_training_step_8k(params: int, reference: bool, chunked: bool) -> float:
    """Qwen3-4B 8K, ZeRO-2 on 8 ranks, sleeping vLLM, checkpointing, the worst packed micro-batch
    (16,192-token cap + one 9,216-token sequence: 25,408 tokens), written out: weights, gradient and
    Adam partitions, reference weights, layer inputs, then the full path's logits with gradients, or
    the chunked path's larger of its head's backward (256 MiB + 8 N H) and one layer's recompute
    (Qwen3-4B: 170,280 bytes per token), ZeRO's bucket, the reserve (GiB)."""
    n, vocab, hidden, layers = 16192 + 9216, 151936, 2560, 36
    total = 2 * params + 2 * params / 8 + 12 * params / 8 + (2 * params if reference else 0)
    total += layers * 2 * hidden * n + 2 * 5e8
    total += max(2**28 + 8 * n * hidden, 170280 * n) if chunked else 10 * n * vocab
    return total / GIB + 4


@pytest.mark.parametrize("name, reference", [("rpg_urkl-qwen3_4b-8k", False), ("grpo-qwen3_4b-8k", True)])
def test_8k_configs_fit_with_dynamic_batches_and_did_not_before(name, reference, capsys, hub_online) -> None:
    plan = dry_run(config_argv(name), capsys)["memory_plan"]
    params = plan["model"]["params"]
    assert plan["fits"] and plan["enforced"] is False  # the CPU backend plans, does not enforce
    assert plan["phases"]["training step"]["total_gib"] == pytest.approx(
        expected_training_step_8k(params, reference, chunked=not reference), abs=0.02
    )  # the RPG config takes the chunked log-prob path by default, GRPO OpenRLHF's
    assert ("reference forward" in plan["phases"]) is reference
    before = dry_run(config_argv(name, old_micro_batches=True), capsys)["memory_plan"]
    logits = before["phases"]["training step"]["terms_gib"]["logits (fp32, with gradients)"]
    assert logits == pytest.approx(10 * 4 * 9216 * 151936 / GIB, abs=0.01)  # 4 x 9216 tokens
    if reference:  # ~8 GB of reference weights that never sleep: over 80 GiB, printed, not enforced on CPU
        assert not before["fits"] and before["enforced"] is False
    worst = max(before["phases"].values(), key=lambda p: p["total_gib"])
    assert worst["total_gib"] > 0.9 * 80


@pytest.fixture
def tiny_run(tiny_model_dir: Path, tmp_path: Path) -> list[str]:
    """A small stock run's argv (nothing starts: dry runs only)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1+2=", "label": "3"}\n')
    return [
        "--actor.model_name_or_path", str(tiny_model_dir),
        "--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--rollout.n_samples_per_prompt", "2", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4", "--vllm.num_engines", "1",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2", "--data.max_len", "4096",
        "--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.output_dir", str(tmp_path / "final"),
    ]  # fmt: skip


def gpu_backend(monkeypatch) -> None:
    """The gpu backend on this CPU machine: a dry run plans it and starts nothing."""
    from rpg_openrlhf.launch import cli

    monkeypatch.setattr(cli, "resolve_backend", lambda requested, *_: ("gpu", "--backend gpu (test)"))


def test_gpu_backend_refuses_a_plan_over_the_gpu(tiny_run, capsys, monkeypatch) -> None:
    """One line, exit 2, naming the phase, its largest term (here: 2 x 4096 tokens of a tiny model
    without gradient checkpointing, its layer activations) and what shrinks it. 5 MiB, no reserve,
    ZeRO-0 (no gradient bucket). (Not enforced on CPU: test_8k_configs_fit_with_dynamic_batches...)"""
    from rpg_openrlhf.launch import cli

    gpu_backend(monkeypatch)
    small = ["--plan.gpu_memory_gib", "0.005", "--plan.reserve_gib", "0", "--ds.zero_stage", "0"]
    with pytest.raises(SystemExit) as exc:
        cli.main([*tiny_run, "--backend", "gpu", *small, "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("rpg-train: error: memory plan: the ")
    for said in ("the training step needs", "--plan.gpu_memory_gib 0.005", "largest term is layer activations",
                 "try --actor.gradient_checkpointing_enable"):  # fmt: skip
        assert said in err[0], err


def test_plan_of_a_gpu_run_that_fits(tiny_run, capsys, monkeypatch) -> None:
    """Not colocated: the engine has a GPU of its own (vLLM's share and the reserve only)."""
    from rpg_openrlhf.launch.cli import main

    gpu_backend(monkeypatch)
    main([*tiny_run, "--backend", "gpu", "--dry-run"])
    out = capsys.readouterr().out
    resolved = json.loads(out[out.index("{") :])
    plan = resolved["memory_plan"]
    assert plan["fits"] and plan["enforced"] and plan["model"]["source"].endswith("config.json")
    share = resolved["openrlhf"]["vllm"]["gpu_memory_utilization"] * 80
    assert plan["phases"]["rollout engines"]["terms_gib"] == pytest.approx(
        {memory_plan.VLLM_SHARE: share, memory_plan.RESERVE: 4.0}, abs=0.01
    )
    assert plan["phases"]["log-prob forward"]["micro_batch"] == "--rollout.micro_batch_size 2, padded to 4096"
    assert "[rpg-train] memory plan per GPU in GiB" in out


def test_no_plan_without_a_config(monkeypatch) -> None:
    args = SimpleNamespace(actor=SimpleNamespace(model_name_or_path="someone/not-cached-model"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = memory_plan.from_args(args)
    assert isinstance(result, str) and "no memory plan" in result and "not a paper model" in result


def test_plan_table_command(tmp_path: Path, capsys, hub_online) -> None:
    """``python configs/experiments.py plan [DIR]`` (the table docs/training.md shows): one row per
    config, its dry-run's phase totals."""
    import shutil

    name, phases = (
        "rpg_urkl-qwen3_4b-8k",
        ("rollout engines", "log-prob forward", "reference forward", "training step"),
    )
    shutil.copy(REPO / "configs" / "experiments" / f"{name}.yaml", tmp_path)
    header, line = EXP.memory_plans(tmp_path)
    assert header.startswith("config | " + " | ".join(phases))
    plan = dry_run(config_argv(name), capsys)["memory_plan"]["phases"]
    assert line.split(" | ") == [
        name,
        *(f"{plan[p]['total_gib']:.1f}" if p in plan else "-" for p in phases),
        "yes",
    ]


def test_gpu_memory_is_read_from_the_device(monkeypatch) -> None:
    """Without --plan.gpu_memory_gib, where CUDA is visible, G is the smallest GPU's total memory as the
    device reports it (an H100 80GB: 85,045,231,616 bytes = 79.2 GiB, not the 80 assumed before), and
    the plan says so; without CUDA, 80 and "assumed"; the flag wins over both (issue 29, fault 3)."""
    from rpg_openrlhf.launch.model_shape import PAPER_MODELS

    args = SimpleNamespace(actor=SimpleNamespace(model_name_or_path="Qwen/Qwen3-4B"), plan=SimpleNamespace())
    monkeypatch.setattr(memory_plan, "plan_for", lambda a, s, g, r, source=None: (g, source))
    monkeypatch.setattr("rpg_openrlhf.launch.model_shape.load_shape", lambda name: PAPER_MODELS[name])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gib, source = memory_plan.from_args(args)
    assert gib == 80.0 and source.startswith("assumed")
    h100 = [85_045_231_616, 85_045_231_616, 84_000_000_000]  # a third GPU with less (another model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(h100))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=h100[i], name=f"GPU{i}"))  # fmt: skip
    gib, source = memory_plan.from_args(args)
    assert gib == round(84_000_000_000 / GIB, 2) and source.startswith("measured: GPU2 total memory"), source
    args.plan.gpu_memory_gib = 40.0
    assert memory_plan.from_args(args) == (40.0, "--plan.gpu_memory_gib")


# ----------------------------------------------------------------------------- packed training micro-batches
def openrlhf_largest(lengths: list[int], cap: int) -> int:
    """Tokens of the largest micro-batch OpenRLHF 0.11.2's packing (``replay_buffer.setup_dynamic_batch``:
    first fit for the count, then ``get_seqlen_balanced_partitions``) forms from one step's ``lengths``."""
    from rpg_openrlhf.cpu_backend.standins import provide_stand_ins

    provide_stand_ins()
    from openrlhf.utils.seqlen_balancing import (
        get_minimum_num_micro_batch_size,
        get_seqlen_balanced_partitions,
    )

    parts = get_seqlen_balanced_partitions(
        lengths, get_minimum_num_micro_batch_size(lengths, cap, 1, 1), False
    )
    return max(sum(lengths[i] for i in part) for part in parts)


def length_lists(n: int, seq_len: int, trials: int) -> list[list[int]]:
    """Realistic (responses up to the budget, many truncated at it) and adversarial mixes."""
    rng = random.Random(0)
    short = max(1, seq_len // 40)
    kinds = [
        lambda: rng.randint(short, seq_len),  # responses anywhere up to the budget
        lambda: seq_len if rng.random() < 0.4 else rng.randint(short, max(short, seq_len // 3)),  # truncated
        lambda: rng.choice([seq_len, seq_len // 2 + 1, seq_len // 3 + 1]),  # two sizes first fit packs badly
        lambda: rng.choice([seq_len, rng.randint(1, short)]),
    ]
    return [[kinds[t % 4]() for _ in range(n)] for t in range(trials)]


@pytest.mark.parametrize("n, seq_len, cap", [(64, 9216, 16192), (16, 9, 20)])
def test_openrlhfs_packing_stays_within_the_planned_worst_case(n: int, seq_len: int, cap: int) -> None:
    """The plan's packed micro-batch bounds OpenRLHF's, which can exceed --train.max_tokens_per_gpu."""
    bound = packed_worst_tokens(n, seq_len, cap)
    largest = max(openrlhf_largest(lengths, cap) for lengths in length_lists(n, seq_len, 200))
    # what the plan assumed before (floor(C / T) whole sequences of T): the real packing exceeds it
    assert max(1, cap // seq_len) * seq_len < largest <= bound
    if seq_len == 9216:  # Qwen3-4B 8K: over its cap, within C + T
        assert 16192 < largest <= bound == 16192 + 9216
    assert packed_worst_tokens(3, 100, 1000) == 300  # a short batch: one micro-batch
    assert packed_worst_tokens(4, 5000, 1000) == 10000  # every sequence over the cap: 2 T at most


def test_the_plan_charges_what_a_chunk_takes_not_the_whole_budget() -> None:
    """A chunk holds chunk_tokens_for(V, bf16, budget) rows (the runtime's rule), never more rows than the
    micro-batch has: a budget above 8 N V costs 8 N V."""
    from rpg_openrlhf.core.logprobs import chunk_tokens_for
    from rpg_openrlhf.launch import memory_terms
    from rpg_openrlhf.launch.model_shape import PAPER_MODELS

    shape = PAPER_MODELS["Qwen/Qwen3-4B"]
    for tokens, budget in ((100, 2**100), (9216, 256 * 2**20), (3, 2**20), (50_000, 2**40)):
        rows = min(tokens, chunk_tokens_for(shape.vocab, torch.bfloat16, budget))
        assert memory_terms.chunk_bytes(shape, tokens, budget) == rows * shape.vocab * (4 + 2 * 2)
        assert memory_terms.chunked_forward_bytes(shape, tokens, budget) < 2**40
