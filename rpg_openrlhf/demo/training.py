"""The demo's training steps: the supervised warm-up with OpenRLHF's own SFT trainer (its worker,
its command, the checkpoint picked by sampled accuracy) and the RL runs through ``rpg-train`` (their
command line, the per-step log lines)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import METHODS, REPO, DemoConfig, mean_or_nan
from .evaluate import generate, hf_checkpoints
from .processes import free_port


def sft_worker() -> None:
    """OpenRLHF's ``train_sft`` in this (plain, single-rank) process with the CPU backend patches.

    Called as ``python -c "from rpg_openrlhf.demo.training import sft_worker; sft_worker()" <train_sft flags>``.
    ``worker_setup`` makes OpenRLHF's CUDA calls harmless exactly as in a Ray worker of
    ``rpg-train``. One change of *speed* only: OpenRLHF's SFTDataset keeps its columns as
    lazy ``datasets`` columns and re-reads them for every sample (90% of the step time on a tiny
    model); they are turned into Python lists after the dataset is built (same values).
    """
    import runpy

    from rpg_openrlhf.cpu_backend.worker import worker_setup

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    worker_setup()
    import openrlhf.datasets
    import openrlhf.datasets.sft_dataset as sft_dataset

    original_init = sft_dataset.SFTDataset.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.prompts, self.responses = list(self.prompts), list(self.responses)
        self.prompt_ids_lens = list(self.prompt_ids_lens)
        if self.response_ranges is not None:
            self.response_ranges = list(self.response_ranges)

    sft_dataset.SFTDataset.__init__ = __init__
    openrlhf.datasets.SFTDataset = sft_dataset.SFTDataset
    sys.argv = ["openrlhf.cli.train_sft", *sys.argv[1:]]
    runpy.run_module("openrlhf.cli.train_sft", run_name="__main__")


def sft_argv(cfg: DemoConfig, base: Path, data: Path, out: Path, save_steps: int) -> list[str]:
    """The train_sft flags of the warm-up (ZeRO-2 keeps fp32 master weights under bf16; with ZeRO-0
    OpenRLHF's bf16 run keeps bf16 master weights and the tiny model barely learns).

    A Hugging Face checkpoint is saved every ``save_steps`` steps into ``<out>/../sft_ckpt`` so that
    :func:`pick_warmup` can stop the warm-up where the sampled accuracy first reaches the target."""
    return [
        "--model.model_name_or_path", str(base), "--data.dataset", str(data),
        "--data.input_key", "input", "--data.output_key", "output", "--data.input_template", "{}",
        "--data.max_len", "16", "--train.batch_size", str(cfg.sft_batch),
        "--train.micro_batch_size", str(cfg.sft_batch), "--train.max_epochs", str(cfg.sft_epochs),
        "--train.seed", str(cfg.seed), "--adam.lr", str(cfg.sft_lr), "--lr_scheduler", "constant",
        "--lr_warmup_ratio", "0", "--max_norm", "0", "--ds.zero_stage", "2",
        "--ds.attn_implementation", "sdpa", "--ckpt.output_dir", str(out),
        "--logger.logging_steps", "1000000",
        "--ckpt.path", str(out.parent / "sft_ckpt"), "--ckpt.save_hf", "--ckpt.disable_ds",
        "--ckpt.save_steps", str(save_steps), "--ckpt.max_num", "1000",
    ]  # fmt: skip


def probe_accuracy(model_dir: Path, rows: list[dict[str, str]], cfg: DemoConfig) -> float:
    """Sampled (temperature 1) accuracy of one answer per training prompt in ``rows``."""
    from rpg_openrlhf.demo.reward import exact_answer

    samples = generate(model_dir, [r["input"] for r in rows], 1, cfg.max_new_tokens, cfg.seed)
    return mean_or_nan([float(exact_answer(s[0], r["label"])) for s, r in zip(samples, rows)])


def pick_warmup(ckpt_root: Path, probe: list[dict[str, str]], cfg: DemoConfig) -> tuple[Path, int, list]:
    """The earliest SFT checkpoint whose sampled accuracy on ``probe`` reaches ``cfg.sft_target``.

    Supervised learning of addition is abrupt on this model (sampled accuracy goes from 0.2 to
    0.8 within ~50 steps), and where the jump happens shifts a little with CPU numerics; picking the
    checkpoint by a measured accuracy keeps the RL start near the target on any machine. Only
    checkpoints from the second half of training are probed; without a hit the last one is used.
    Returns (checkpoint, step, [(step, accuracy), ...]).
    """
    ckpts = hf_checkpoints(ckpt_root)
    if not ckpts:
        raise RuntimeError(f"SFT saved no checkpoints under {ckpt_root}")
    last_step = ckpts[-1][0]
    probed = []
    for step, d in ckpts:
        if step < last_step // 2 and step != last_step:
            continue
        acc = probe_accuracy(d, probe, cfg)
        probed.append((step, acc))
        if acc >= cfg.sft_target:
            return d, step, probed
    return ckpts[-1][1], last_step, probed


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Put the base model's tokenizer files (left padding, as built) into a trained model dir.

    OpenRLHF's SFT saves its training tokenizer (right padding), which would make batched
    generation of prompts of different lengths wrong in plain ``transformers``.
    """
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


# ----------------------------------------------------------------------------- RL
def rl_argv(cfg: DemoConfig, run: str, model: Path, prompts: Path, out: Path) -> list[str]:
    """``rpg-train`` command line of one RL run (CPU backend)."""
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--backend", "cpu",
        "--actor.model_name_or_path", str(model),
        "--reward.remote_url", str(REPO / "rpg_openrlhf" / "demo" / "reward.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_samples", str(cfg.rl_steps * cfg.rl_prompts_per_step),
        "--rollout.n_samples_per_prompt", str(cfg.rl_samples_per_prompt),
        "--rollout.batch_size", str(cfg.rl_prompts_per_step),
        "--rollout.micro_batch_size", "128",
        "--train.batch_size", str(cfg.rl_train_batch), "--train.micro_batch_size", str(min(128, cfg.rl_train_batch)),
        "--rollout.max_new_tokens", str(cfg.max_new_tokens), "--data.max_len", "16",
        "--rollout.temperature", "1.0", "--rollout.top_p", "1.0",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--ds.zero_stage", "2", "--ds.attn_implementation", "sdpa",
        "--train.num_episodes", "1", "--train.seed", str(cfg.seed),
        "--actor.adam.lr", str(cfg.rl_lr), "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--ckpt.save_hf", "--ckpt.disable_ds", "--ckpt.save_steps", str(cfg.save_steps),
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--logger.tensorboard_dir", str(out.parent.parent / "tensorboard"), "--logger.wandb.run_name", run,
        *METHODS[run][1],
    ]  # fmt: skip


_STEP_RE = re.compile(r"Global step (\d+): (\{.*\})")


def _step_printer(total: int) -> Callable[[str], None]:
    """Prints ``step k/total: reward r`` for each of OpenRLHF's "Global step" lines as it comes."""

    def on_line(line: str) -> None:
        for step in parse_steps(line):
            reward = step.get("reward")
            shown = f"{reward:.3f}" if isinstance(reward, int | float) else "-"
            print(f"[rpg-demo]           step {step['step']}/{total}: train reward {shown}", flush=True)

    return on_line


def parse_steps(log_text: str) -> list[dict[str, Any]]:
    """The status dict OpenRLHF's trainer prints every global step, with ``step`` added."""
    steps: dict[int, dict[str, Any]] = {}
    for m in _STEP_RE.finditer(log_text):
        text = re.sub(r"\b(nan|inf)\b", "None", m.group(2))
        try:
            status = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue
        steps[int(m.group(1))] = {"step": int(m.group(1)), **status}
    return [steps[k] for k in sorted(steps)]
