"""The demo's evaluation: sampling a checkpoint (the warm-up's probe), the checkpoint folder
``rpg-eval run`` reads (the SFT model as step 0, then each RL checkpoint) and its command line."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from .config import BENCHMARK, PROMPT_STYLE, DemoConfig


def generate(model_dir: Path, prompts: list[str], n: int, max_new_tokens: int, seed: int) -> list[list[str]]:
    """``n`` samples (temperature 1, no top-k/top-p) per prompt, as decoded responses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = [p for p in prompts for _ in range(n)]
    enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]


def eval_checkpoints(root: Path, sft: Path, rl_checkpoints: list[tuple[str, Path, int]]) -> Path:
    """``root`` holding the checkpoints ``rpg-eval run`` evaluates for one method: the SFT model as
    ``global_step0_hf`` (the RL start, step 0) and the method's ``global_step<N>_hf``.

    Hard links, not symlinks: the runner resolves checkpoint paths and reads the step from the
    resolved directory name, so a symlink to ``work/sft`` would lose its step; a hard-linked tree
    costs no copy and keeps the name (copied where hard links are not possible)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for name, path in [("global_step0_hf", sft)] + [(n, p) for n, p, _ in rl_checkpoints]:
        shutil.copytree(path, root / name, copy_function=link)
    return root


def eval_argv(cfg: DemoConfig, run: str, ckpts: Path, data: Path, out: Path) -> list[str]:
    """``rpg-eval run`` over one method's checkpoints on the held-out benchmark (a custom benchmark
    ``addition`` given by file, prompt style ``plain``: the model input is ``"a+b="`` verbatim, no
    chat template; bare-number answers graded by math-verify's anchor-free fallback).  Sampling as in
    training: temperature 1, top-p 1, at most ``max_new_tokens`` tokens, EOS ends a response."""
    return [
        sys.executable, "-m", "rpg_eval.cli", "run", "--checkpoints", str(ckpts), "--out", str(out),
        "--run", run, "--benchmarks", BENCHMARK, "--data", f"{BENCHMARK}={data}",
        "--prompt-style", PROMPT_STYLE, "--allow-fallback", "--backend", "hf", "--device", "cpu",
        "--n", str(cfg.eval_n), "--max-tokens", str(cfg.max_new_tokens), "--temperature", "1.0",
        "--top-p", "1.0", "--seed", str(cfg.seed), "--chunk", str(cfg.heldout),
        # float32 as in training's CPU backend (the checkpoints are saved in bf16).
        "--model-arg", "dtype=float32", "--no-summary",
    ]  # fmt: skip


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV written by ``rpg-eval summarize``."""
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def hf_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the HF checkpoints ``global_step<N>_hf`` (with a config.json) in ``root``, by step."""
    found = []
    for d in root.glob("global_step*_hf"):
        if (m := re.fullmatch(r"global_step(\d+)_hf", d.name)) and (d / "config.json").is_file():
            found.append((int(m.group(1)), d))
    return sorted(found, key=lambda c: c[0])


def checkpoints_of(run_dir: Path) -> list[tuple[str, Path, int]]:
    """(name, path, step) of the HF checkpoints of a run (``<run_dir>/ckpt``), by step."""
    return [(d.name, d, step) for step, d in hf_checkpoints(run_dir / "ckpt")]
