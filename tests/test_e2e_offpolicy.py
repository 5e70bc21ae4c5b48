"""Off-policy RPG through OpenRLHF's real Ray pipeline on CPU (rpg-train, vLLM-CPU engines, tiny model).

Four runs (>= 2 global steps each; the loss a worker computed, captured with RPG_CAPTURE_DIR, and
the micro-batches it trained on, dumped with RPG_STEP_DUMP_DIR, are checked from outside):

* bf16 engines against the actor (bf16 DeepSpeed forward; fp32 engines too differ from it by ~1e-3 per
  token, bf16 ones by their own kernels' rounding) with OpenRLHF's token-level
  mask correction: the loss every worker computed is the weighted URKL loss recomputed here with the
  formula written in this file; the filtered fraction, the engine-vs-trainer KL and the mean weight
  that OpenRLHF logged are the formula's, averaged as OpenRLHF averages them;
* ``--rpg.old_logp engine`` at ``--rollout.temperature 0.7`` (fp32 engines): pi_old is exactly the
  engine's log-probs, which equal a Hugging Face forward of the weights that sampled, divided by the
  temperature (OpenRLHF's actor: logits / T), to fp32 tolerance, and not the T = 1 ones;
* async (``--train.async_enable``, queue 1, partial rollouts) with ``--rpg.old_logp engine``, a
  reference refreshed every 2 steps and ``--rpg.max_steps 2``: batch 2 was sampled by older weights
  than the actor that trains on it, and pi_old is the sampler's; the reference equals the actor right
  after the refresh; the run stops at step 2 with a checkpoint;
* that run resumed with ``--rpg.max_steps 3`` under async with bf16 engines and the sequence-level
  correction: the reference schedule and weights come back, only step 3 trains, and the loss is the
  sequence-weighted one of the formula.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from engine_sync import assert_engines_follow_actor
from run_log import explain
from test_e2e_rpg import REPO, prompts_file, run_rpg_train, step_logs, trainer_info  # noqa: F401 (fixture)

from rpg_openrlhf import core

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REWARD = ["--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py")]
URKL_PLAIN = ["--rpg.loss", "urkl", "--rpg.style", "differentiable", "--rpg.reward_term", "plain",
              "--rpg.beta", "0.1", "--rpg.advantage", "none"]  # fmt: skip
BF16 = {"RPG_CPU_ROLLOUT_DTYPE": "bfloat16"}
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
    """OpenRLHF's ratio-gated mask correction, RPG's weight: r_t = log pi_old - log mu; token level:
    c_t = exp(r_t), dropped where exp(r_t) is outside [low, high]; seq level: c = exp(sum_t r_t),
    dropped where the geometric mean exp(mean_t r_t) is outside. Loss = sum c L m / (N_tok / dp)."""
    cfg, m = rec["config"]["rollout_correction"], rec["action_mask"].double()
    r = (rec["old_logp"].double() - rec["rollout_logp"].double()) * m
    if cfg["level"] == "token":
        stat, c, units = r.exp(), r.exp(), m
    else:
        stat, c, units = (
            (r.sum(-1, keepdim=True) / m.sum(-1, keepdim=True)).exp(),
            r.sum(-1, keepdim=True).exp(),
            m.amax(-1, keepdim=True),
        )
    dropped = ((stat < cfg["low"]) | (stat > cfg["high"])).double()
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


def records(capture: Path) -> list[dict]:
    return [torch.load(p, weights_only=False) for p in sorted(capture.glob("loss_rank*.pt"))]


def dumps(dump: Path) -> list[dict]:
    return [torch.load(p, weights_only=False) for p in sorted(dump.glob("mb_rank0_*.pt"))]


def assert_loss_is_core(recs: list[dict]) -> None:
    """What the worker computed is rpg_openrlhf.core on the captured tensors (as tests/test_e2e_rpg.py)."""
    for rec in recs:
        loss, metrics = core.compute_loss(
            rec["name"], rec["style"], rec["logp"], rec["old_logp"], rec["advantages"], rec["action_mask"],
            rec["ref_logp"], config=core.LossConfig(**rec["config"]), dp_size=rec["dp_size"],
            batch_num_tokens=rec["batch_num_tokens"], global_batch_size=rec["global_batch_size"],
            rollout_logp=rec["rollout_logp"],
        )  # fmt: skip
        assert torch.equal(loss, rec["loss"]) and metrics == pytest.approx(rec["metrics"], nan_ok=True)


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
def test_bf16_engines_token_correction_acts_as_its_formula(tiny_vllm_model_dir, prompts_file, tmp_path):  # noqa: F811
    env = {**BF16, "RPG_STEP_DUMP_DIR": str(tmp_path / "dump")}
    out, capture = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        [*REWARD, "--ds.zero_stage", "0", *URKL_PLAIN, f"{CORRECTION}level", "token",
         f"{CORRECTION}threshold", "0.999", "1.001"],
        env=env,
    )  # fmt: skip
    assert "bfloat16" in out
    logs, recs = step_logs(out), records(capture)
    assert sorted(logs) == [1, 2] and len(recs) == 8
    assert_loss_is_core(recs)
    assert_correction_acts_as_formula(recs, logs, [1, 2])
    # a real mismatch: bf16 sampling moves mu off the actor's forward by ~1e-3 per token; the first
    # token differs systematically: the engine sampled it without EOS (min_tokens=1)
    for rec in recs:
        r, mask, first = (
            rec["old_logp"] - rec["rollout_logp"],
            rec["action_mask"].bool(),
            first_tokens(rec["action_mask"]),
        )
        assert r[mask & ~first].abs().max() > 5e-4 and (r[first] < -1e-3).all()
        assert 0 < correction_by_formula(rec)["is_filter_ratio"] < 1
    assert all(logs[s]["vllm_kl"] > 0 for s in logs)
    # what the worker trained on: mu's log-probs are the engine's (dump), pi_old the actor's
    for mb, rec in zip(dumps(tmp_path / "dump"), recs):
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


def test_engine_logprobs_are_pi_old_at_the_rollout_temperature(tiny_vllm_model_dir, prompts_file, tmp_path):  # noqa: F811
    dump = tmp_path / "dump"
    out, capture = run_rpg_train(
        tmp_path, tiny_vllm_model_dir, prompts_file,
        [*REWARD, "--ds.zero_stage", "0", *URKL_PLAIN, "--rpg.old_logp", "engine", "--rollout.temperature", "0.7"],
        env={"RPG_STEP_DUMP_DIR": str(dump)},
    )  # fmt: skip
    assert sorted(step_logs(out)) == [1, 2] and trainer_info(capture)["rpg"]["old_logp"] == "engine"
    assert_engines_follow_actor(tmp_path / "sync", syncs=2)
    assert_loss_is_core(records(capture))
    mbs = dumps(dump)
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
    recs = records(capture)
    assert max_log_w(recs[0]) < BF16_ACTOR_NOISE and max_log_w(recs[4]) < BF16_ACTOR_NOISE


ASYNC = ["--train.async_enable", "--train.async_queue_size", "1", "--train.num_episodes", "3",
         "--rpg.ref_update", "every_k", "--rpg.ref_update_k", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def async_runs(tiny_vllm_model_dir, prompts_file, tmp_path_factory) -> dict:  # noqa: F811
    """The async run stopping at step 2 (partial rollouts, engine log-probs as pi_old), then the same
    checkpoint directory resumed to step 3 (no partial rollouts, bf16 engines, seq correction)."""
    first, resumed = tmp_path_factory.mktemp("async_first"), tmp_path_factory.mktemp("async_resumed")
    common = [*REWARD, "--ds.zero_stage", "2", *URKL_PLAIN, *ASYNC, "--ckpt.path", str(first / "ckpt")]
    out1, cap1 = run_rpg_train(
        first, tiny_vllm_model_dir, prompts_file,
        [*common, "--train.partial_rollout_enable", "--rpg.old_logp", "engine", "--rpg.max_steps", "2"],
        env={"RPG_STEP_DUMP_DIR": str(first / "dump"), "RPG_SYNC_CHECK_DIR": ""},
    )  # fmt: skip
    out2, cap2 = run_rpg_train(
        resumed, tiny_vllm_model_dir, prompts_file,
        [*common, "--ckpt.load_enable", "--rpg.max_steps", "3", f"{CORRECTION}level", "seq",
         f"{CORRECTION}threshold", "0.999", "1.001", "--rpg.resume_changes",  # the changes made on purpose
         "algo.advantage.is_correction_level,algo.advantage.is_correction_threshold,rpg.old_logp,"
         "train.partial_rollout_enable"],
        env={**BF16, "RPG_SYNC_CHECK_DIR": ""},
    )  # fmt: skip
    (first / "run.log").write_text(out1)  # kept beside the run for a failure's diagnosis
    (resumed / "run.log").write_text(out2)
    return {"first": (first, out1, cap1), "resumed": (resumed, out2, cap2)}


def test_async_engine_old_logp_budget_and_reference_refresh(async_runs):
    tmp, out, capture = async_runs["first"]
    info = trainer_info(capture)
    assert info["trainer"] == "_RPGTrainingActor" and info["rpg"]["async"] and info["kl_ctl"] == 0
    logs = step_logs(out)
    assert sorted(logs) == [1, 2] and "reached --rpg.max_steps 2" in out, explain(out)
    assert (tmp / "ckpt" / "_actor" / "global_step2").is_dir() and (tmp / "ckpt" / "global_step2_hf").is_dir()
    recs, mbs = records(capture), dumps(tmp / "dump")
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
    assert (tmp / "ckpt" / "_rpg_reference" / "global_step2.pt").is_file()


def test_async_resume_restores_the_reference_and_weights_by_sequence(async_runs):
    _, out, capture = async_runs["resumed"]
    logs = step_logs(out)
    assert sorted(logs) == [3] and "reached --rpg.max_steps 3" in out, explain(out)
    assert "resumed reference weights (refresh at step 2)" in out
    recs = records(capture)
    assert len(recs) == 4 and all(r["ref_logp"] is not None for r in recs)
    assert_loss_is_core(recs)
    assert_correction_acts_as_formula(recs, logs, [3])
    # bf16 engines against the actor's forward: the sequence weights are off 1
    weights = [correction_by_formula(r)["is_weight_mean"].item() for r in recs]
    assert any(abs(w - 1) > 1e-3 for w in weights) and all(math.isfinite(w) for w in weights)
