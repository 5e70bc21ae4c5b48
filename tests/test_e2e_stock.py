"""docs/training.md's stock OpenRLHF run (no --rpg.* flags) as a command, for the tests that start it.

The run itself (a tiny random Qwen2, 4 prompts, 2 samples each, GRPO-style group normalisation, 2
steps, a Hugging Face checkpoint per step, rollouts on OpenRLHF's own vLLM engine actor) starts once in
the suite, through the CPU backend alone on an existing Ray cluster (tests/test_e2e_cluster.py);
rpg-train's stock pass-through is the demo's GRPO run (tests/test_demo.py). Its dry run resolving to
stock OpenRLHF is tests/test_rpg_flags.py's, and a dry run without Ray's imports
tests/test_train_ppo_ray_source.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
