"""``rpg-train --dry-run`` of docs/training.md's stock OpenRLHF run (no --rpg.* flags): the resolved
configuration without Ray, and a bad one refused before Ray.

The run itself (a tiny random Qwen2, 4 prompts, 2 samples each, GRPO-style group normalisation, 2
steps, a Hugging Face checkpoint per step, rollouts on OpenRLHF's own vLLM engine actor) starts once in
the suite, through the CPU backend alone on an existing Ray cluster (tests/test_e2e_cluster.py);
rpg-train's stock pass-through is the demo's GRPO run (tests/test_demo.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REWARD_FILE = REPO / "tests" / "helpers" / "reward_has_digit.py"
PROMPTS = [("1+2=", "3"), ("4+4=", "8"), ("2+5=", "7"), ("9+0=", "9")]


def write_prompts(path: Path) -> Path:
    """A 4-prompt jsonl dataset with OpenRLHF's default keys (input, label)."""
    path.write_text("".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in PROMPTS))
    return path


def stock_command(model: Path, prompts: Path, out: Path) -> list[str]:
    """The stock (non-RPG) CPU run of docs/training.md."""
    return [
        sys.executable, "-m", "rpg_openrlhf.launch.cli",
        "--actor.model_name_or_path", str(model),
        "--reward.remote_url", str(REWARD_FILE),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2",
        "--algo.kl.init_coef", "0",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32",
        "--ds.zero_stage", "0", "--vllm.num_engines", "1",
        "--ckpt.save_hf", "--ckpt.save_steps", "1",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--train.num_episodes", "1", "--actor.adam.lr", "1e-3",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # A plain shell must work: nothing the backend needs may come from here except offline mode.
    for key in ("DS_ACCELERATOR", "DS_BUILD_OPS"):
        env.pop(key, None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("WANDB_MODE", "offline")
    return env


def _run(cmd: list[str], timeout: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=REPO, env={**_env(), **env}, capture_output=True, text=True, timeout=timeout
    )


def _json_after_logs(stdout: str) -> dict:
    """The dry-run JSON object: it starts at the first line that is exactly "{"."""
    lines = stdout.splitlines()
    start = lines.index("{")
    return json.loads("\n".join(lines[start:]))


@pytest.mark.slow
def test_dry_run_prints_resolved_config_without_ray(tiny_model_dir: Path, tmp_path: Path) -> None:
    cmd = stock_command(tiny_model_dir, write_prompts(tmp_path / "p.jsonl"), tmp_path) + ["--dry-run"]
    proc = _run(cmd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = _json_after_logs(proc.stdout)
    import torch

    assert config["backend"] == ("gpu" if torch.cuda.is_available() else "cpu")
    assert config["rpg"] == {"enabled": False}
    orl = config["openrlhf"]
    assert orl["actor"]["model_name_or_path"] == str(tiny_model_dir)
    assert orl["algo"]["advantage"]["estimator"] == "group_norm"
    assert orl["rollout"]["n_samples_per_prompt"] == 2
    assert orl["reward"]["remote_url"] == [str(REWARD_FILE)]  # after OpenRLHF's own processing
    assert "dry_run" not in orl
    if config["backend"] == "cpu":
        assert orl["ds"]["attn_implementation"] == "sdpa"
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_invalid_configuration_fails_before_ray(tiny_model_dir: Path, tmp_path: Path) -> None:
    cmd = stock_command(tiny_model_dir, write_prompts(tmp_path / "p.jsonl"), tmp_path)
    proc = _run([*cmd, "--rpg.backend", "cpu", "--ds.ring_attn_size", "2", "--dry-run"], timeout=300)
    assert proc.returncode == 2
    assert "rpg-train: error:" in proc.stderr and "--ds.ring_attn_size" in proc.stderr
    proc = _run([*cmd, "--rpg.backend", "tpu", "--dry-run"], timeout=300)
    assert proc.returncode == 2 and "--rpg.backend" in proc.stderr  # argparse rejects the choice
