"""The CPU backend on its own: ``python -m rpg_openrlhf.cpu_backend <train_ppo_ray flags>`` runs stock
OpenRLHF (GRPO-style group normalisation, no ``--rpg.*`` flag anywhere) on CPU through OpenRLHF's own
vLLM engine actor, and the driver loads nothing of RPG or of the eval package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from engine_sync import assert_engines_follow_actor
from pipeline_run import run_pipeline
from run_log import explain
from test_e2e_stock import REWARD_FILE, write_prompts

#: What a stock CPU run must not load (tests/test_layering.py holds it for the code; this is the run).
NOT_LOADED = (
    "rpg_eval",
    "rpg_openrlhf.core",
    "rpg_openrlhf.plugin",
    "rpg_openrlhf.launch",
    "rpg_openrlhf.extras",
)
DRIVER = (
    "import sys\n"
    "from rpg_openrlhf.cpu_backend.__main__ import main\n"
    "main(sys.argv[1:])\n"
    f"print('LOADED', sorted(m for m in sys.modules if m.startswith({NOT_LOADED!r})))\n"
)


@pytest.mark.e2e
def test_stock_grpo_on_cpu_through_the_backend_alone(tiny_vllm_model_dir: Path, tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl")
    prompts.write_text("".join(prompts.read_text().splitlines(keepends=True)[:2]))  # 2 prompts: 1 step
    out = tmp_path / "run"
    argv = [
        sys.executable, "-c", DRIVER,
        "--actor.model_name_or_path", str(tiny_vllm_model_dir), "--reward.remote_url", str(REWARD_FILE),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--algo.kl.init_coef", "0",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4", "--rollout.micro_batch_size", "2",
        "--train.micro_batch_size", "2", "--rollout.max_new_tokens", "8", "--data.max_len", "32",
        "--ds.zero_stage", "0", "--vllm.num_engines", "1", "--ckpt.save_hf", "--ckpt.path", str(out / "ckpt"),
        "--ckpt.output_dir", str(out / "final"), "--train.num_episodes", "1", "--actor.adam.lr", "1e-3",
    ]  # fmt: skip
    env = {**os.environ, "RPG_SYNC_CHECK_DIR": str(tmp_path / "sync")}
    for key in ("DS_ACCELERATOR", "DS_BUILD_OPS"):  # a plain shell must work
        env.pop(key, None)
    log = run_pipeline(argv, env, timeout=1200)
    assert "LOADED []" in log, explain(log)
    assert "--ds.attn_implementation flash_attention_2 -> sdpa" in log  # OpenRLHF's default, adjusted
    assert "rollout engine vllm" in log and "Global step 1" in log, explain(log)
    assert_engines_follow_actor(tmp_path / "sync", syncs=1)
    assert (out / "final" / "model.safetensors").is_file()
