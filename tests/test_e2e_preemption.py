"""Training that survives being killed (issue #20), through OpenRLHF's real Ray pipeline on CPU.

The command is docs/training.md's ("What survives a kill"), read from there: RPG-REINFORCE-URKL, a
reference refreshed every 2 steps, Schedule-Free AdamW, ``--rpg.max_steps 4``, a checkpoint every step
with ``--ckpt.max_num 1``, ``--ckpt.load_enable`` from the first start. It runs once straight through
and once as three starts of the same command, the first two stopped at a hold point
(``rpg_openrlhf.extras.hold``) and killed there:

1. the process group (a scheduler's preemption) while saving step 2: its files written, the commit
   (markers) not yet, DeepSpeed's ``latest`` naming it; rpg-eval's discovery is run there, then the
   optimizer shard is cut in half (what a kill leaves of a file being written);
2. one policy worker, mid-training of step 3 (step 2 redone and committed): the driver ends the run
   with one line, and the next start resumes the refreshed reference of step 2;
3. no kill: steps 3 and 4, then the budget stops the run.

A kill before a step's checkpoint leaves less behind than the first kill; a dead engine or reference
worker ends a run as the policy worker does (tests/test_watchdog.py names every role, reaps vLLM's orphans).

Rollouts are greedy (``--rollout.top_p 1e-9``) so that both runs are deterministic and compared exactly:
every micro-batch each attempt of a step trained on (prompts, responses, old and reference log-probs,
advantages), the Hugging Face weights of every step, DeepSpeed's final model and optimizer states
(Schedule-Free's ``z``, ``k``) and the reference weights. (With sampling the engines' random stream
restarts with them, so responses would differ after a resume.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import budgets
import pytest
import torch
from kill_run import Segment, Started
from pipeline_run import REPO, docs_command, write_prompts
from run_log import explain

from rpg_openrlhf.common import checkpoints as ck
from rpg_openrlhf.extras import checkpoint as resume

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(budgets.starts(4))]  # four starts

START_TIMEOUT = budgets.START_S  # one start on a loaded 2-core machine
EXIT_BOUND = 60  # a dead worker ends the run within this (the watchdog polls every second)
KILL_COMMAND = "<!-- the kill test's command -->"  # docs/training.md's marker of the command


@pytest.fixture(scope="module")
def runs(tiny_vllm_model_dir: Path, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("preempt")
    prompts = write_prompts(root / "prompts.jsonl")
    env = {**os.environ}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

    def command(run: Path) -> list[str]:
        return docs_command(KILL_COMMAND, tiny_vllm_model_dir, prompts, run)

    reference = Started(
        command(root / "uninterrupted"), env, Segment("uninterrupted", root / "uninterrupted")
    )
    reference.wait_exit(START_TIMEOUT)
    out = {
        "uninterrupted": reference.finish(),
        "ckpt": root / "killed" / "ckpt",
        "reference_ckpt": root / "uninterrupted" / "ckpt",
    }
    out["segments"] = _killed_run(command(root / "killed"), env, root / "killed", out["ckpt"])
    for s in [out["uninterrupted"], *out["segments"].values()]:  # pytest -s shows them
        exit_after = f", driver exit {s.kill_to_exit:.1f} s after the kill" if s.kill_to_exit else ""
        print(f"[preempt] {s.name}: {s.seconds:.0f} s, killed: {s.killed}{exit_after}")
    return out


def _start(argv, env, folder: Path, name: str, hold: str | None) -> Started:
    return Started(argv, {**env, "RPG_HOLD_AT": hold or ""}, Segment(name, folder / name))


def _killed_run(argv: list[str], env: dict, folder: Path, ckpt: Path) -> dict[str, Segment]:
    """The three starts of the same command (module docstring); after each, the checkpoint a resume
    would load is recorded (``resume.last_complete``)."""
    seg: dict[str, Segment] = {}

    def group_kill(name: str, hold: str, held: str, inspect=None) -> None:
        run = _start(argv, env, folder, name, hold)
        run.wait_held(held, START_TIMEOUT)
        if inspect:
            inspect(run.segment)
        run.kill_group("process group")
        seg[name] = run.finish()
        seg[name].notes["resumable"] = resume.last_complete(ckpt)

    def worker_kill(name: str, hold: str, held: str, what: str) -> None:
        run = _start(argv, env, folder, name, hold)
        pid = run.wait_held(held, START_TIMEOUT)  # the process holding: the policy worker
        run.kill_pid(pid, what, timeout=EXIT_BOUND * 3)
        seg[name] = run.finish()
        seg[name].notes["resumable"] = resume.last_complete(ckpt)

    group_kill("saving", "commit:2", "held_commit_2", inspect=lambda s: _while_saving(s, ckpt))
    # resumed from step 1: its first optimizer step redoes step 2, its second is step 3's
    worker_kill("policy", "optimizer_step:2", "held_optimizer_step_2", "policy worker")
    last = _start(argv, env, folder, "final", None)
    last.wait_exit(START_TIMEOUT)
    seg["final"] = last.finish()
    return seg


def _while_saving(segment: Segment, ckpt: Path) -> None:
    """What a reader sees while step 2 is written but not committed (its files in place, no marker:
    ``extras/checkpoint.py``); then the optimizer shard is cut in half, as a kill leaves a file
    ``torch.save`` is writing."""
    from rpg_eval.run.checkpoints import find_checkpoints

    skipped: list[Path] = []
    segment.notes["eval_finds"] = [c.name for c in find_checkpoints(ckpt, skipped=skipped)]
    segment.notes["eval_skips"] = [p.name for p in skipped]
    segment.notes["latest"] = (ckpt / "_actor" / "latest").read_text().strip()
    segment.notes["ds_dirs"] = sorted(p.name for p in (ckpt / "_actor").iterdir() if p.is_dir())
    segment.notes["actor"] = sorted(p.name for p in (ckpt / "_actor").iterdir())
    shard = ckpt / "_actor" / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


# ----------------------------------------------------------------------------- kill anywhere
def test_group_kills_resume_from_the_last_complete_checkpoint(runs: dict) -> None:
    seg = runs["segments"]
    saving = seg["saving"].notes
    # Killed with step 2 written but not committed: its files in place, unmarked, DeepSpeed's latest
    # naming it; --ckpt.max_num 1 still keeps step 1 (rotation follows the commit), which resumes.
    assert saving["actor"] == ["global_step1", "global_step2", "latest", "zero_to_fp32.py"], saving
    assert saving["latest"] == "global_step2" and saving["ds_dirs"] == ["global_step1", "global_step2"]
    assert saving["resumable"] == "global_step1"
    restarted = seg["policy"].log
    assert re.search(
        r"save\(s\) stopped before their commit left their files in .*: removed \(global_step2\)", restarted
    )
    assert "resuming from global_step1" in restarted


def test_rpg_eval_passes_over_the_checkpoint_being_written(runs: dict) -> None:
    from rpg_eval.run.checkpoints import find_checkpoints

    saving = runs["segments"]["saving"].notes
    # step 2 is in place, not committed: passed over
    assert saving["eval_finds"] == ["global_step1_hf"] and saving["eval_skips"] == ["global_step2_hf"]
    # Redone and committed after the resume: found by the next discovery, as every other step.
    assert [c.name for c in find_checkpoints(runs["ckpt"])] == [f"global_step{s}_hf" for s in (1, 2, 3, 4)]


# ----------------------------------------------------------------------------- dead workers
def test_a_dead_worker_ends_the_run_with_one_line(runs: dict) -> None:
    s = runs["segments"]["policy"]
    assert s.kill_to_exit is not None and s.kill_to_exit < EXIT_BOUND, explain(s.log)
    errors = [line for line in s.log.splitlines() if line.startswith("rpg-train: error:")]
    assert s.returncode == 1 and len(errors) == 1, explain(s.log)
    assert "the policy worker " in errors[0] and " died: " in errors[0], errors
    assert f"last complete checkpoint: {runs['ckpt'] / '_actor' / 'global_step2'};" in errors[0], errors
    assert not [line for line in s.log.splitlines() if line.startswith("Traceback")]  # none from the driver
    assert s.notes["resumable"] == "global_step2"
    assert s.notes["left_behind"] == []  # no vLLM process of the run outlives the kill


# ----------------------------------------------------------------------------- equal to the uninterrupted run
RESUMED_FROM = {"saving": 0, "policy": 1, "final": 2}
EXACT = ("sequences", "attention_mask", "action_mask", "advantages")
#: log-probs of the same sample forwarded beside others
LOGP_TOL = 1e-5
#: weights: 0 measured since a step's samples are in an order their tokens fix (extras.trainer.
#: ContentOrderMixin; before, the engines' finishing order made the micro-batches: gaps up to 4.8e-3 after
#: a resume); a lost optimizer state or reference is of the order of the step's update.
WEIGHT_TOL = 2e-3


def micro_batches(dump: Path, resumed_from: int) -> dict[int, list[dict]]:
    """Global step -> the micro-batches one start trained on (one optimizer step per rollout step)."""
    steps: dict[int, list[dict]] = {}
    for path in sorted(dump.glob("mb_rank0_*.pt")):
        record = torch.load(path, weights_only=False)
        steps.setdefault(resumed_from + record["optimizer_step"], []).append(record)
    return steps


def samples(records: list[dict]) -> list[dict]:
    """The step's samples, one dict per row, ordered by token sequence (not by arrival)."""
    rows = [
        {k: r[k][i] for k in (*EXACT, "old_logp", "ref_logp")}
        for r in records
        for i in range(len(r["sequences"]))
    ]
    return sorted(rows, key=lambda row: row["sequences"].tolist())


def prompt(row: dict, tokenizer) -> str:
    """The attended tokens that are not actions (``action_mask`` covers positions 1..T-1)."""
    is_prompt = row["attention_mask"].bool() & ~torch.cat(
        [torch.zeros(1, dtype=torch.bool), row["action_mask"].bool()]
    )
    return tokenizer.decode(row["sequences"][is_prompt], skip_special_tokens=True)


def test_every_attempt_of_a_step_trained_on_what_the_uninterrupted_run_did(
    runs: dict, tiny_vllm_model_dir
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_vllm_model_dir)
    expected = {step: samples(r) for step, r in micro_batches(runs["uninterrupted"].dump, 0).items()}
    assert sorted(expected) == [1, 2, 3, 4]
    tried: dict[int, int] = {}
    for name, start in RESUMED_FROM.items():
        for step, records in micro_batches(runs["segments"][name].dump, start).items():
            tried[step] = tried.get(step, 0) + 1
            got, want = samples(records), expected[step]
            assert [prompt(r, tokenizer) for r in got] == [prompt(r, tokenizer) for r in want], (name, step)
            for a, b in zip(got, want, strict=True):
                assert [k for k in EXACT if not torch.equal(a[k], b[k])] == [], (name, step)
                for k in ("old_logp", "ref_logp"):
                    torch.testing.assert_close(
                        a[k], b[k], rtol=0, atol=LOGP_TOL, msg=f"{name} step {step} {k}"
                    )
    prompts = {s: sorted({prompt(r, tokenizer) for r in rows}) for s, rows in expected.items()}
    print(f"[preempt] attempts per global step: {tried}; prompts per step: {prompts}")
    assert tried == {1: 1, 2: 2, 3: 2, 4: 1}  # step 2: killed saving, done; 3: policy killed, done


def relative_gap(mine: dict, theirs: dict, before: dict) -> float:
    """|mine - theirs| / |theirs - before| over all tensors (the step's update as the scale)."""
    flat = [torch.cat([d[k].double().flatten() for k in sorted(theirs)]) for d in (mine, theirs, before)]
    return float((flat[0] - flat[1]).norm() / (flat[1] - flat[2]).norm())


def test_the_killed_run_ends_where_the_uninterrupted_one_does(runs: dict, tiny_vllm_model_dir) -> None:
    from safetensors.torch import load_file

    final = runs["segments"]["final"]
    assert final.returncode == 0, explain(final.log)
    assert sorted(int(s) for s in re.findall(r"Global step (\d+):", final.log)) == [3, 4]
    assert (
        "reached --rpg.max_steps 4" in final.log
        and "resumed reference schedule: step 2, refreshes [2]" in final.log
    )
    mine, theirs = runs["ckpt"], runs["reference_ckpt"]
    hf = {
        c: {s: load_file(str(c / f"global_step{s}_hf" / "model.safetensors")) for s in (1, 2, 3, 4)}
        for c in (mine, theirs)
    }
    hf[theirs][0] = initial = load_file(str(tiny_vllm_model_dir / "model.safetensors"))
    initial.setdefault("lm_head.weight", initial["model.embed_tokens.weight"])  # tied: saved once
    gaps = {s: relative_gap(hf[mine][s], hf[theirs][s], hf[theirs][s - 1]) for s in (1, 2, 3, 4)}
    print(f"[preempt] weights |killed - uninterrupted| / |step's update|: {gaps}")
    assert all(gap <= WEIGHT_TOL for gap in gaps.values()), gaps
    tag = "global_step4"
    # --ckpt.max_num 1
    assert sorted(p.name for p in (mine / "_actor").iterdir()) == [tag, "latest", "zero_to_fp32.py"]
    model = [
        torch.load(c / "_actor" / tag / "mp_rank_00_model_states.pt", weights_only=False)
        for c in (mine, theirs)
    ]
    kept = ("lr_scheduler", "global_steps", "global_samples", "skipped_steps", "episode", "global_step",
            "total_consumed_prompts", "data_loader_state_dict", "rpg_ref_schedule", "rpg_ref_weights")  # fmt: skip
    assert differences(*({k: m[k] for k in kept} for m in model)) == []  # step, data, schedule: exact
    optim = [torch.load(c / "_actor" / tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
             ["optimizer_state_dict"] for c in (mine, theirs)]  # fmt: skip
    groups = [o["base_optimizer_state"]["param_groups"] for o in optim]
    # Schedule-Free's k, lr, ...
    assert groups[0] == groups[1] and [g["k"] for g in groups[0]] == [4] * len(groups[0])
    for a, b in zip(optim[0]["single_partition_of_fp32_groups"], optim[1]["single_partition_of_fp32_groups"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # fp32 master weights (x)
    for i, state in optim[1]["base_optimizer_state"]["state"].items():
        for name, value in state.items():  # Schedule-Free's z and second moment
            torch.testing.assert_close(
                optim[0]["base_optimizer_state"]["state"][i][name], value, rtol=1e-3, atol=1e-5
            )
    reference = [torch.load(c / "_rpg_reference" / f"{tag}.pt", weights_only=True) for c in (mine, theirs)]
    assert reference[0]["refresh_step"] == reference[1]["refresh_step"] == 4
    assert relative_gap(reference[0]["state_dict"], reference[1]["state_dict"], hf[theirs][3]) <= WEIGHT_TOL
    assert all(ck.is_complete(d) for d in (mine / "_actor" / tag, mine / f"{tag}_hf"))


def differences(a, b, where: str = "") -> list[str]:
    """Paths where two nested checkpoint entries differ (tensors compared exactly)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
        return [] if same and torch.equal(a, b) else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]
