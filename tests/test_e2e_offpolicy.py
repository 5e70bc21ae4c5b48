"""RPG through OpenRLHF's real Ray pipeline on CPU (rpg-train, CPU backend, vLLM-CPU engines, tiny model).

Three runs of 2 global steps (pipeline_run.rpg_argv plus ``--rpg.*``). In each, the loss every worker
computed (``RPG_CAPTURE_DIR``) equals ``rpg_openrlhf.core.compute_loss`` on the same tensors, and the
micro-batches it trained on (``RPG_STEP_DUMP_DIR``) are checked from outside:

* bf16 engines (the actor's bf16 DeepSpeed forward differs from them by their kernels' rounding) with
  OpenRLHF's token-level mask correction: the loss every worker computed is the weighted URKL loss
  written in this file; the filtered fraction, the engine-vs-trainer KL and the mean weight OpenRLHF
  logged are the formula's, averaged as OpenRLHF averages them;
* RPG-REINFORCE-URKL with RPG-Style Clip and ``--rpg.ref_update rollout`` (no reference actor; the
  method of scripts/train_tiny_cpu.sh), ``--rpg.old_logp engine`` at ``--rollout.temperature 0.7``
  (fp32 engines): pi_old is exactly the engine's log-probs, a Hugging Face forward of the weights that
  sampled divided by the temperature (OpenRLHF's actor: logits / T), and not the T = 1 ones; the
  policy worker runs the chunked log-prob path;
* async (queue 1, partial rollouts) with ``--rpg.old_logp engine``, a reference refreshed every 2
  steps and ``--rpg.max_steps 2``: batch 2 was sampled by older weights than the actor that trains on
  it, pi_old is the sampler's; the reference equals the actor right after the refresh; the run stops at
  step 2 of 6 with a checkpoint there although ``--ckpt.save_steps`` is 5.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import budgets
import pytest
import torch
from engine_sync import assert_engines_follow_actor
from pipeline_run import assert_loss_is_core, dump_env, load_all, rpg_argv, run_pipeline, write_prompts
from run_log import explain

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    return write_prompts(tmp_path_factory.mktemp("rpg_e2e_data") / "prompts.jsonl")


def run_rpg_train(tmp_path: Path, model: Path, prompts: Path, extra: list[str], **env: str):
    """rpg-train (pipeline_run.rpg_argv + ``extra``) and what it recorded: (log, loss records, micro-batches)."""
    log = run_pipeline(rpg_argv(model, prompts, tmp_path, *extra), dump_env(tmp_path, **env), budgets.START_S)
    return log, load_all(tmp_path / "capture", "loss_rank*.pt"), load_all(tmp_path / "dump", "mb_rank0_*.pt")


def step_logs(out: str) -> dict[int, dict]:
    """The status dict OpenRLHF's trainer logs each global step ("Global step N: {...}")."""
    return {
        int(m.group(1)): ast.literal_eval(m.group(2).replace("nan", "None").replace("inf", "None"))
        for m in re.finditer(r"Global step (\d+): (\{.*\})", out)
    }


def trainer_info(capture: Path) -> dict:
    return json.loads((capture / "trainer.json").read_text())


URKL_PLAIN = ["--rpg.loss", "urkl", "--rpg.style", "differentiable", "--rpg.reward_term", "plain",
              "--rpg.beta", "0.1", "--rpg.advantage", "none"]  # fmt: skip
CORRECTION = "--algo.advantage.is_correction_"


# ----------------------------------------------------------------------------- formulas
def urkl_plain_per_token(rec: dict) -> torch.Tensor:
    """L_t = -w A + beta (w log(pi_theta/pi_ref) - w + rho): URKL, fully differentiable, plain reward
    term; w = pi_theta/pi_old, rho = pi_ref/pi_old (1 without a reference model)."""
    log_w = rec["logp"] - rec["old_logp"]
    log_rho = torch.zeros_like(log_w) if rec["ref_logp"] is None else rec["ref_logp"] - rec["old_logp"]
    w, rho = log_w.exp(), log_rho.exp()
    return -w * rec["advantages"] + rec["config"]["beta"] * (w * (log_w - log_rho) - w + rho)


def correction_by_formula(rec: dict) -> dict[str, torch.Tensor]:
    """OpenRLHF's ratio-gated token-level mask correction, RPG's weight: r_t = log pi_old - log mu,
    c_t = exp(r_t), dropped where exp(r_t) is outside [low, high]. Loss = sum c L m / (N_tok / dp)."""
    cfg, m = rec["config"]["rollout_correction"], rec["action_mask"].double()
    assert cfg["level"] == "token", cfg
    c = ((rec["old_logp"].double() - rec["rollout_logp"].double()) * m).exp()
    units = m
    dropped = ((c < cfg["low"]) | (c > cfg["high"])).double()
    c = c * (1 - dropped)
    loss = (c * urkl_plain_per_token(rec).double() * m).sum() / (
        float(rec["batch_num_tokens"]) / rec["dp_size"]
    )
    return {
        "loss": loss,
        "vllm_kl": ((rec["rollout_logp"].double() - rec["old_logp"].double()) * m).sum() / m.sum(),
        "is_filter_ratio": (dropped * units).sum() / units.sum(),
        "is_weight_mean": (c * units).sum() / units.sum(),
    }  # fmt: skip


def first_tokens(mask: torch.Tensor) -> torch.Tensor:
    """[B, A] bool: each response's first token (OpenRLHF samples it with min_tokens=1: no EOS)."""
    mask = mask.bool()
    return mask & (mask.cumsum(-1) == 1)


def max_log_w(rec: dict, skip_first: bool = True) -> float:
    """max |log pi_theta - log pi_old| over the response tokens (the first ones left out: sampled without EOS)."""
    mask = rec["action_mask"].bool() & (~first_tokens(rec["action_mask"]) if skip_first else True)
    return (rec["logp"] - rec["old_logp"])[mask].abs().max().item()


#: pi_theta (the actor's bf16 DeepSpeed forward) vs the fp32 engine's log-probs of the same weights
BF16_ACTOR_NOISE = 1e-2


def assert_correction_acts_as_formula(recs: list[dict], logs: dict[int, dict], steps: list[int]) -> None:
    """Per micro-batch: the loss is the formula's. Per global step: what OpenRLHF logged is the
    formula's per micro-batch values averaged with their action-token counts (its ppo_train merge)."""
    per_step = len(recs) // len(steps)
    for i, step in enumerate(steps):
        batch = recs[i * per_step : (i + 1) * per_step]
        expected = [correction_by_formula(rec) for rec in batch]
        for rec, exp in zip(batch, expected):
            assert rec["loss"].item() == pytest.approx(exp["loss"].item(), rel=1e-5, abs=1e-7)
        tokens = torch.tensor([float(rec["action_mask"].sum()) for rec in batch])
        for key, logged in (("vllm_kl", "vllm_kl"), ("is_filter_ratio", "is_filter_ratio"),
                            ("is_weight_mean", "rpg/is_weight_mean")):  # fmt: skip
            mean = float(sum(e[key] * n for e, n in zip(expected, tokens)) / tokens.sum())
            assert logs[step][logged] == pytest.approx(mean, rel=1e-4, abs=1e-6), (step, key)


# ----------------------------------------------------------------------------- runs
def test_bf16_engines_token_correction_acts_as_its_formula(tiny_vllm_model_dir, prompts_file, tmp_path):
    out, recs, mbs = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--ds.zero_stage", "0", *URKL_PLAIN, f"{CORRECTION}level", "token", f"{CORRECTION}threshold", "0.999", "1.001"],
        RPG_CPU_ROLLOUT_DTYPE="bfloat16",
    )  # fmt: skip
    assert "bfloat16" in out
    logs = step_logs(out)
    assert sorted(logs) == [1, 2] and len(recs) == 8
    assert_loss_is_core(recs)
    assert_correction_acts_as_formula(recs, logs, [1, 2])
    # a real mismatch: bf16 sampling moves mu off the actor's forward by up to ~1e-3 per token (a
    # micro-batch's largest gap measured 5e-4 once); the first token differs systematically: the engine
    # sampled it without EOS (min_tokens=1)
    gaps = []
    for rec in recs:
        r, mask, first = (
            rec["old_logp"] - rec["rollout_logp"],
            rec["action_mask"].bool(),
            first_tokens(rec["action_mask"]),
        )
        gaps.append(float(r[mask & ~first].abs().max()))
        assert (r[first] < -1e-3).all()
        assert 0 < correction_by_formula(rec)["is_filter_ratio"] < 1
    assert min(gaps) > 0 and max(gaps) > 5e-4, gaps
    assert all(logs[s]["vllm_kl"] > 0 for s in logs)
    # what the worker trained on: mu's log-probs are the engine's (dump), pi_old the actor's
    for mb, rec in zip(mbs, recs, strict=True):
        assert torch.equal(mb["rollout_logp"], rec["rollout_logp"]) and torch.equal(
            mb["old_logp"], rec["old_logp"]
        )


def hf_logprobs(
    model: torch.nn.Module, mb: dict, temperature: float, min_tokens: bool = True
) -> torch.Tensor:
    """The sampling distribution's log-probs of the dumped tokens, by Hugging Face in fp32: OpenRLHF's
    actor formula log_softmax(logits / T) (Actor.forward), except that at each response's first token
    EOS is excluded, as the engine samples it: OpenRLHF asks for SamplingParams(min_tokens=1), and
    vLLM's processed log-probs are taken after that logits processor."""
    seq, att, mask = mb["sequences"], mb["attention_mask"], mb["action_mask"].bool()
    with torch.no_grad():
        logits = model(seq, attention_mask=att).logits[:, :-1].float()[:, -mask.shape[1] :] / temperature
    if min_tokens:
        eos = model.generation_config.eos_token_id
        logits[..., eos] = torch.where(first_tokens(mask), -math.inf, logits[..., eos])
    return logits.log_softmax(-1).gather(-1, seq[:, 1:, None][:, -mask.shape[1] :]).squeeze(-1)


URKL_CLIP = ["--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "rollout",
             "--rpg.beta", "0.01", "--actor.eps_clip_low_high", "0.2", "0.28"]  # fmt: skip


def test_urkl_clip_engine_logprobs_are_pi_old_at_the_rollout_temperature(
    tiny_vllm_model_dir, prompts_file, tmp_path
):
    out, recs, mbs = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--ds.zero_stage", "0", *URKL_CLIP, "--rpg.old_logp", "engine", "--rollout.temperature", "0.7"],
    )  # fmt: skip
    capture = tmp_path / "capture"
    logs, info = step_logs(out), trainer_info(capture)
    assert sorted(logs) == [1, 2] and info["rpg"]["old_logp"] == "engine"
    assert info["reference_model"] is False and info["advantage_estimator"] == "rpg" and info["kl_ctl"] == 0
    assert "ReferenceModelActor" not in out  # no reference actor was ever created
    # the chunked log-prob path, on by default for RPG runs, in the policy worker
    assert (
        "[rpg-train] log-probs: chunked path" in out
        and "chunked log-prob path" in out.split("[rpg-train] log-probs")[1]
    )
    for step, status in logs.items():
        for key in ("kl", "rpg/kl", "rpg/w_mean", "rpg/w_max", "rpg/w_min", "policy_loss", "entropy_loss"):
            assert isinstance(status.get(key), float) and math.isfinite(status[key]), (step, key)
        for key in ("rpg/clip_frac_low", "rpg/clip_frac_high", "rpg/clip_frac_dual"):
            assert 0.0 <= status[key] <= 1.0
    assert_engines_follow_actor(tmp_path / "sync", syncs=2)
    assert_loss_is_core(recs)
    assert {(r["name"], r["style"]) for r in recs} == {("urkl", "reinforce_clip")}
    assert all(r["ref_logp"] is None for r in recs) and not list(capture.glob("refresh_step*.pt"))
    assert recs[0]["config"]["clip_c"] == 10.0 and recs[0]["config"]["eps_high"] == 0.28
    assert list((tmp_path / "final").glob("*.safetensors"))
    assert len(mbs) == 8
    from transformers import AutoModelForCausalLM

    sampled_by = {1: tiny_vllm_model_dir, 2: tmp_path / "ckpt" / "global_step1_hf"}  # the weights of step k
    models = {
        k: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for k, d in sampled_by.items()
    }
    for i, mb in enumerate(mbs):
        mask = mb["action_mask"].bool()
        assert torch.equal(mb["old_logp"], mb["rollout_logp"])  # pi_old is the engine's, not recomputed
        model = models[i // 4 + 1]
        assert (mb["old_logp"] - hf_logprobs(model, mb, 0.7))[mask].abs().max() < 1e-4
        # not the T = 1 distribution, nor the actor's formula without the first token's EOS mask
        assert (mb["old_logp"] - hf_logprobs(model, mb, 1.0))[mask].abs().max() > 1e-2
        assert (mb["old_logp"] - hf_logprobs(model, mb, 0.7, min_tokens=False))[mask].abs().max() > 1e-4
    # sync: the first optimizer step of each rollout trains the weights that sampled it
    assert max_log_w(recs[0]) < BF16_ACTOR_NOISE and max_log_w(recs[4]) < BF16_ACTOR_NOISE


ASYNC = ["--train.async_enable", "--train.async_queue_size", "1", "--train.num_episodes", "3",
         "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "2"]  # fmt: skip


def test_async_engine_old_logp_budget_and_reference_refresh(tiny_vllm_model_dir, prompts_file, tmp_path):
    out, recs, mbs = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        ["--ds.zero_stage", "2", *URKL_PLAIN, *ASYNC, "--train.partial_rollout_enable",
         "--rpg.old_logp", "engine", "--rpg.max_steps", "2", "--ckpt.save_steps", "5"],
        RPG_SYNC_CHECK_DIR="",
    )  # fmt: skip
    capture = tmp_path / "capture"
    info = trainer_info(capture)
    assert info["trainer"] == "_RPGTrainingActor" and info["rpg"]["async"] and info["kl_ctl"] == 0
    logs = step_logs(out)
    assert sorted(logs) == [1, 2] and "reached --rpg.max_steps 2" in out, explain(out)
    ckpt = tmp_path / "ckpt"  # the budget's step has a checkpoint, although --ckpt.save_steps is 5
    assert (ckpt / "_actor" / "latest").read_text().strip() == "global_step2"
    assert (ckpt / "global_step2_hf" / "config.json").is_file() and not (ckpt / "global_step1_hf").exists()
    assert len(recs) == len(mbs) == 8
    assert_loss_is_core(recs)
    for mb in mbs:
        assert torch.equal(mb["old_logp"], mb["rollout_logp"])  # pi_old = the engine that sampled
    # batch 1: sampled by the initial weights the actor still has; batch 2: sampled by them too
    # (generated while batch 1 trained), trained by an actor one update further: w != 1 at once
    assert max_log_w(recs[0]) < BF16_ACTOR_NOISE < 5 * BF16_ACTOR_NOISE < max_log_w(recs[4])
    assert logs[1]["rpg/ref_refreshed"] == 0.0 and logs[2]["rpg/ref_refreshed"] == 1.0
    refresh = torch.load(capture / "refresh_step00002.pt", weights_only=False)
    assert refresh["refreshed"] and all(
        torch.equal(refresh["actor"][k], refresh["ref_after"][k]) for k in refresh["actor"]
    )
    assert (ckpt / "_rpg_reference" / "global_step2.pt").is_file()
