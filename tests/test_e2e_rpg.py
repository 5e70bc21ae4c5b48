"""RPG through OpenRLHF's real Ray pipeline on CPU (rpg-train, CPU backend, a tiny random model).

Three runs, >= 2 global steps each, every one saving Hugging Face checkpoints:

* RPG-REINFORCE-URKL with RPG-Style Clip and ``--rpg.ref_update rollout``: no reference actor;
* RPG-UFKL (differentiable) with ``--rpg.ref_update every_k --rpg.ref_update_k 2`` under ZeRO-3:
  the reference weights differ from the actor's before the refresh and equal them right after;
* corrected GRPO (``grpo_kl_corrected``) against the initial model, with the project's reward
  file and the paper's grader (``RPG_REWARD_GRADER=paper``, rewards +1/-1), under ZeRO-2 with
  Schedule-Free AdamW (``--rpg.optimizer schedulefree``): rollout log-probs come from its x
  weights, training from its y weights.

In each, the loss every worker computed (captured with ``RPG_CAPTURE_DIR``) equals
``rpg_openrlhf.core.compute_loss`` on the same tensors, and the logged KL and importance
weights are finite, and after every weight sync the vLLM engine's log-probs equal the actor's
(engine_sync.py). The CPU command line is docs/training.md's stock one plus ``--rpg.*``.
"""

from __future__ import annotations

import ast
import math
import os
import re
import sys
from pathlib import Path

import budgets
import pytest
import torch
from engine_sync import assert_engines_follow_actor
from pipeline_run import run_pipeline
from run_log import explain

from rpg_openrlhf import core

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["1+2=", "4+4=", "2+5=", "9+0="]
LABELS = ["3", "8", "7", "9"]
RUN_TIMEOUT = budgets.START_S


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    import json

    path = tmp_path_factory.mktemp("rpg_e2e_data") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input": p, "label": a}) + "\n" for p, a in zip(PROMPTS, LABELS)))
    return path


def run_rpg_train(tmp_path: Path, model: Path, prompts: Path, extra: list[str], env: dict | None = None):
    """rpg-train in a subprocess (its own process group, killed on timeout); (stdout, capture dir)."""
    capture = tmp_path / "capture"
    argv = [
        sys.executable, "-m", "rpg_openrlhf.launch.cli",
        "--rpg.backend", "cpu",
        "--actor.model_name_or_path", str(model),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--rollout.n_samples_per_prompt", "4",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32", "--vllm.num_engines", "1",
        "--ckpt.save_hf", "--ckpt.save_steps", "1",
        "--ckpt.path", str(tmp_path / "ckpt"), "--ckpt.output_dir", str(tmp_path / "final"),
        "--train.num_episodes", "1", "--actor.adam.lr", "1e-3", "--actor.lr_scheduler", "constant",
        "--rollout.temperature", "1.0",
        *extra,
    ]  # fmt: skip
    full_env = {
        **os.environ,
        "RPG_CAPTURE_DIR": str(capture),
        "RPG_SYNC_CHECK_DIR": str(tmp_path / "sync"),
        **(env or {}),
    }
    full_env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    out = run_pipeline(argv, full_env, RUN_TIMEOUT)
    return out, capture


def step_logs(out: str) -> dict[int, dict]:
    """The status dict OpenRLHF's trainer logs each global step ("Global step N: {...}")."""
    logs = {}
    for m in re.finditer(r"Global step (\d+): (\{.*\})", out):
        logs[int(m.group(1))] = ast.literal_eval(m.group(2).replace("nan", "None").replace("inf", "None"))
    return logs


def check_common(out: str, capture: Path, tmp_path: Path, use_reference: bool) -> list[dict]:
    """>= 2 steps; HF checkpoints; finite KL / weights logged; every worker loss == core's."""
    logs = step_logs(out)
    assert sorted(logs)[:2] == [1, 2], explain(out)
    for step, status in logs.items():
        for key in ("kl", "rpg/kl", "rpg/w_mean", "rpg/w_max", "rpg/w_min", "policy_loss", "entropy_loss"):
            value = status.get(key)
            assert isinstance(value, float) and math.isfinite(value), (step, key, value)
        for key in ("rpg/clip_frac_low", "rpg/clip_frac_high", "rpg/clip_frac_dual"):
            assert 0.0 <= status[key] <= 1.0
    if "rollout engine vllm" in out:  # the engine held the actor's weights after every sync
        assert_engines_follow_actor(tmp_path / "sync", syncs=2)
    for step in (1, 2):
        hf = tmp_path / "ckpt" / f"global_step{step}_hf"
        assert (hf / "config.json").is_file() and list(hf.glob("*.safetensors")), hf
    assert list((tmp_path / "final").glob("*.safetensors"))

    records = [torch.load(p, weights_only=False) for p in sorted(capture.glob("loss_rank*.pt"))]
    assert len(records) >= 4  # 2 global steps x 2 optimizer steps
    for rec in records:
        assert (rec["ref_logp"] is not None) == use_reference
        loss, metrics = core.compute_loss(
            rec["name"], rec["style"], rec["logp"], rec["old_logp"], rec["advantages"], rec["action_mask"],
            rec["ref_logp"], config=core.LossConfig(**rec["config"]), dp_size=rec["dp_size"],
            batch_num_tokens=rec["batch_num_tokens"], global_batch_size=rec["global_batch_size"],
        )  # fmt: skip
        assert torch.equal(loss, rec["loss"]), (loss, rec["loss"])
        assert metrics == pytest.approx(rec["metrics"], nan_ok=True)
        assert math.isfinite(metrics["kl"]) and math.isfinite(metrics["w_mean"])
    return records


def max_abs_log_ratio(rec: dict) -> float:
    mask = rec["action_mask"].bool()
    return (rec["logp"] - rec["old_logp"])[mask].abs().max().item()


def trainer_info(capture: Path) -> dict:
    import json

    return json.loads((capture / "trainer.json").read_text())


# the cheapest run (a framework KL option goes through the same registry lookup: tests/test_kl_options.py)
def test_rpg_reinforce_urkl_clip_rollout_reference(tiny_vllm_model_dir, prompts_file, tmp_path):
    loss, style = "urkl", "reinforce_clip"
    out, capture = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"), "--ds.zero_stage", "0",
         "--rpg.loss", loss, "--rpg.style", style, "--rpg.ref_update", "rollout", "--rpg.beta", "0.01",
         "--actor.eps_clip_low_high", "0.2", "0.28"],
    )  # fmt: skip
    info = trainer_info(capture)
    assert info["reference_model"] is False and info["advantage_estimator"] == "rpg" and info["kl_ctl"] == 0
    # the chunked log-prob path, on by default for RPG runs, in the policy worker
    assert (
        "[rpg-train] log-probs: chunked path" in out
        and "chunked log-prob path" in out.split("[rpg-train] log-probs")[1]
    )
    assert "ReferenceModelActor" not in out  # no reference actor was ever created
    records = check_common(out, capture, tmp_path, use_reference=False)
    assert {r["name"] for r in records} == {loss} and {r["style"] for r in records} == {style}
    assert records[0]["config"]["clip_c"] == (10.0 if style == "reinforce_clip" else None)
    assert records[0]["config"]["eps_high"] == 0.28
    # The second optimizer step of a rollout is off-policy: importance weights move away from 1.
    assert any(not torch.equal(r["logp"], r["old_logp"]) for r in records)
    # AdamW: the first optimizer step of each rollout trains the weights that made the log-probs.
    for first in (records[0], records[1], records[4], records[5]):
        assert max_abs_log_ratio(first) < 1e-5
    assert not list(capture.glob("refresh_step*.pt"))


def test_rpg_ufkl_every_k_refreshes_reference(tiny_vllm_model_dir, prompts_file, tmp_path):
    out, capture = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"), "--ds.zero_stage", "3",
         "--rpg.loss", "ufkl", "--rpg.style", "differentiable", "--rpg.advantage", "none",
         "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "2", "--rpg.beta", "0.1"],
    )  # fmt: skip
    assert trainer_info(capture)["reference_model"] is True
    # ZeRO-3, the policy and the reference model on the chunked log-prob path
    for actor in ("PolicyModelActor", "ReferenceModelActor"):
        assert f"{actor}: chunked log-prob path" in out, actor
    check_common(out, capture, tmp_path, use_reference=True)
    logs = step_logs(out)
    assert logs[1]["rpg/ref_refreshed"] == 0.0 and logs[2]["rpg/ref_refreshed"] == 1.0
    assert "reference refreshed at global step 2" in out

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    step1 = torch.load(capture / "refresh_step00001.pt", weights_only=False)
    step2 = torch.load(capture / "refresh_step00002.pt", weights_only=False)
    assert not step1["refreshed"] and step2["refreshed"]
    assert same(step1["ref_before"], step1["ref_after"])  # no refresh at step 1
    assert not same(step1["actor"], step1["ref_after"])  # the actor trained away from the reference
    assert not same(step2["actor"], step2["ref_before"])  # before the refresh: different
    assert same(step2["actor"], step2["ref_after"])  # right after it: the actor's weights


def test_corrected_grpo_with_paper_reward(tiny_vllm_model_dir, prompts_file, tmp_path):
    out, capture = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--reward.remote_url", str(REPO / "rpg_openrlhf" / "plugin" / "reward.py"), "--ds.zero_stage", "2",
         "--rpg.loss", "grpo_kl_corrected", "--rpg.style", "differentiable", "--rpg.ref_update", "initial",
         "--rpg.advantage", "none", "--rpg.beta", "0.1", "--rpg.optimizer", "schedulefree"],
        env={"RPG_REWARD_GRADER": "paper"},
    )  # fmt: skip
    assert trainer_info(capture)["reference_model"] is True
    records = check_common(out, capture, tmp_path, use_reference=True)
    assert {r["name"] for r in records} == {"grpo_kl_corrected"}
    for status in step_logs(out).values():
        # The paper's grader scores +1 / -1 (a random model never answers): never 0 / missing.
        assert status["rollout/reward_mean"] == -1.0 and status["reward_error"] == 0.0
    # Schedule-Free: the first optimizer step of rollout 2 trains y while the rollout (and its
    # old log-probs) used x, so the importance weights already differ from 1 there.
    assert "Schedule-Free AdamW" in out
    assert max_abs_log_ratio(records[0]) < 1e-5  # rollout 1: x == y (nothing learned yet)
    assert max_abs_log_ratio(records[4]) > 1e-4 and max_abs_log_ratio(records[5]) > 1e-4
    assert not list(capture.glob("refresh_step*.pt")) or all(
        not torch.load(p, weights_only=False)["refreshed"] for p in capture.glob("refresh_step*.pt")
    )
