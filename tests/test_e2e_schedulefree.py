"""Schedule-Free AdamW under ZeRO-3 through the real pipeline (issue #11 item 1), with the budget.

One ``rpg-train`` run on CPU: RPG-REINFORCE-URKL, ``--rpg.optimizer schedulefree``, ZeRO-3 (bf16), one
optimizer step per rollout step (8 samples, train batch 8), warm-up of 3 optimizer steps, a checkpoint
every step, and ``--rpg.max_steps 3`` although the data allows 4 rollout steps. Checked from what the
run wrote, against values computed here:

* it stops after global step 3 with a checkpoint there;
* DeepSpeed's checkpoint of step N holds ``k = N`` in every parameter group (one increment per
  optimizer step: ZeRO-3 used to give 2N), ``weight_sum`` / ``lr_max`` of Schedule-Free's warm-up
  formula, and eval mode (saved at x);
* the saved master weights follow Schedule-Free's averaging x_N = (1 - c_N) x_{N-1} + c_N z_N
  with c_N = w_N / sum(w) and w_i = lr_max_i^2 (holds for x, not for y: it shows the checkpoint is x);
* the Hugging Face checkpoint of step N equals those master weights in bf16 (read with DeepSpeed's own
  ``get_fp32_state_dict_from_zero_checkpoint``);
* the rollouts' log-probs come from x and training from y: the importance weights of the first
  optimizer step of a rollout are exactly 1 while x = y (after one step, c_1 = 1) and differ from 1
  once x != y (rollout 3).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import budgets
import pytest
import torch
from pipeline_run import run_pipeline
from run_log import explain

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [("1+2=", "3"), ("4+4=", "8"), ("2+5=", "7"), ("9+0=", "9")]
LR, WARMUP_RATIO, BUDGET, MICRO_PER_STEP = 1e-2, 0.67, 3, 4
RUN_TIMEOUT = budgets.START_S


@pytest.fixture(scope="module")
def run(tiny_vllm_model_dir: Path, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sf_zero3")
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in PROMPTS))
    argv = [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--rpg.backend", "cpu",
        "--actor.model_name_or_path", str(tiny_vllm_model_dir),
        "--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--rollout.n_samples_per_prompt", "4", "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "8",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32", "--ds.zero_stage", "3", "--vllm.num_engines", "1",
        "--ckpt.save_hf", "--ckpt.save_steps", "1", "--ckpt.max_num", "5",
        "--ckpt.path", str(out / "ckpt"), "--ckpt.output_dir", str(out / "final"),
        "--train.num_episodes", "2", "--actor.adam.lr", str(LR), "--actor.lr_scheduler", "constant",
        "--actor.lr_warmup_ratio", str(WARMUP_RATIO), "--rollout.temperature", "1.0",
        "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.optimizer", "schedulefree",
        "--rpg.max_steps", str(BUDGET),
    ]  # fmt: skip
    env = {**os.environ, "RPG_CAPTURE_DIR": str(out / "capture")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    log = run_pipeline(argv, env, RUN_TIMEOUT)
    return {"out": out, "log": log}


def schedule(n: int) -> list[float]:
    """Schedule-Free's lr of optimizer steps 1..n: linear warm-up over ceil(ratio x max_steps) steps,
    max_steps = 3 rollout steps x 1 optimizer step (the budget sets OpenRLHF's scheduler length)."""
    warmup = math.ceil(BUDGET * WARMUP_RATIO)
    return [LR * min(1.0, (i + 1) / warmup) for i in range(n)]


def optim_state(run: dict, step: int) -> dict:
    path = (
        run["out"]
        / "ckpt"
        / "_actor"
        / f"global_step{step}"
        / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    return torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]


def test_stops_at_the_budget_with_a_checkpoint_there(run: dict) -> None:
    import re

    steps = sorted(int(s) for s in re.findall(r"Global step (\d+):", run["log"]))
    assert steps == [1, 2, 3], explain(run["log"])  # the data allows 4
    assert (run["out"] / "ckpt" / "_actor" / "latest").read_text().strip() == "global_step3"
    assert "Schedule-Free AdamW (lr=0.01, warmup_steps=3)" in run["log"]


def test_one_k_per_optimizer_step_and_saved_in_eval_mode(run: dict) -> None:
    for step in (1, 2, 3):
        lrs = schedule(step)
        groups = optim_state(run, step)["optimizer_state_dict"]["param_groups"]
        assert len(groups) == 2  # weights with decay, the rest without
        for group in groups:
            assert group["k"] == step, (step, group["k"])
            assert group["weight_sum"] == pytest.approx(sum(lr**2 for lr in lrs), rel=1e-12)
            assert group["lr_max"] == pytest.approx(lrs[-1], rel=1e-12)
            assert group["train_mode"] is False


def test_saved_master_weights_are_the_average_x(run: dict) -> None:
    lrs = schedule(BUDGET)
    weights = [lr**2 for lr in lrs]
    states = {step: optim_state(run, step) for step in (1, 2, 3)}
    for step in (2, 3):
        c = weights[step - 1] / sum(weights[:step])
        prev, cur = states[step - 1]["fp32_flat_groups"], states[step]["fp32_flat_groups"]
        z = states[step]["optimizer_state_dict"]["state"]
        for i, (x_prev, x_cur) in enumerate(zip(prev, cur)):
            expected = (1 - c) * x_prev.double() + c * z[i]["z"].double()
            torch.testing.assert_close(x_cur.double(), expected, rtol=0, atol=1e-6)
            assert (x_cur - x_prev).abs().max() > 1e-4  # the weights moved


def test_hf_checkpoints_hold_the_master_weights(run: dict) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    for step in (1, 2, 3):
        master = get_fp32_state_dict_from_zero_checkpoint(
            str(run["out"] / "ckpt" / "_actor"), tag=f"global_step{step}"
        )
        hf = load_file(str(run["out"] / "ckpt" / f"global_step{step}_hf" / "model.safetensors"))
        common = sorted(set(master) & set(hf))
        assert len(common) >= len(master) - 1, (sorted(master)[:5], sorted(hf)[:5])
        for name in common:
            assert torch.equal(hf[name], master[name].to(hf[name].dtype)), (step, name)


def test_rollouts_use_x_and_training_uses_y(run: dict) -> None:
    records = [
        torch.load(p, weights_only=False) for p in sorted((run["out"] / "capture").glob("loss_rank0_*.pt"))
    ]
    assert len(records) == BUDGET * MICRO_PER_STEP

    def max_abs_log_ratio(rec: dict) -> float:
        mask = rec["action_mask"].bool()
        return (rec["logp"] - rec["old_logp"])[mask].abs().max().item()

    # One optimizer step per rollout: every micro-batch of rollout r trains the weights after step r-1.
    by_rollout = [records[i : i + MICRO_PER_STEP] for i in range(0, len(records), MICRO_PER_STEP)]
    assert all(max_abs_log_ratio(r) == 0.0 for r in by_rollout[0] + by_rollout[1])  # x = y so far
    assert min(max_abs_log_ratio(r) for r in by_rollout[2]) > 1e-4  # old log-probs from x, training at y
