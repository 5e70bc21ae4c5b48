"""What the E2E tests share about one ``rpg-train`` pipeline: its command (docs/training.md's, or the
tests' RPG command), its run (its own process group, the whole Ray tree killed on a timeout; a failure
shows the run's first error, then the log's end: run_log.explain) and what it dumped; and a fresh
interpreter for a snippet (``run_python``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from run_log import explain

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = [sys.executable, "-m", "rpg_openrlhf.launch.cli"]
#: docs/training.md's four prompts (its ``printf`` line).
PROMPTS = [("1+2=", "3"), ("4+4=", "8"), ("2+5=", "7"), ("9+0=", "9")]
REWARD = REPO / "tests" / "helpers" / "reward_has_digit.py"


def write_prompts(path: Path) -> Path:
    """The 4-prompt jsonl dataset with OpenRLHF's default keys (input, label)."""
    path.write_text("".join(json.dumps({"input": q, "label": a}) + "\n" for q, a in PROMPTS))
    return path


def docs_command(after: str, model: Path, prompts: Path, run: Path) -> list[str]:
    """The ``rpg-train`` command of docs/training.md's first bash block after the text ``after``, run as
    ``python -m rpg_openrlhf.launch.cli``: its /tmp/tiny, /tmp/prompts.jsonl and /tmp/run/ replaced,
    its tests/ files named from the repository root."""
    text = (REPO / "docs" / "training.md").read_text()
    block = text.split(after, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    argv = shlex.split(block[block.index("rpg-train") :].replace("\\\n", " "))
    assert argv[0] == "rpg-train", argv
    paths = (("/tmp/tiny", str(model)), ("/tmp/prompts.jsonl", str(prompts)), ("/tmp/run/", f"{run}/"))
    for old, new in paths:
        argv = [arg.replace(old, new) for arg in argv]
    return [*LAUNCHER, *(str(REPO / arg) if arg.startswith("tests/") else arg for arg in argv[1:])]


def rpg_argv(model: Path, prompts: Path, run: Path, *flags: str) -> list[str]:
    """The tests' RPG run on the CPU backend: the 4 prompts x 4 samples, one actor and one reference
    rank, 2 rollout steps of 8 samples, one vLLM engine, a Hugging Face checkpoint each step under
    ``run`` (ckpt/, final/); ``flags`` last (a later flag wins)."""
    return [
        *LAUNCHER, "--rpg.backend", "cpu",
        "--actor.model_name_or_path", str(model), "--reward.remote_url", str(REWARD),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--rollout.n_samples_per_prompt", "4",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--train.batch_size", "4",
        "--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32", "--vllm.num_engines", "1",
        "--ckpt.save_hf", "--ckpt.save_steps", "1",
        "--ckpt.path", str(run / "ckpt"), "--ckpt.output_dir", str(run / "final"),
        "--train.num_episodes", "1", "--actor.adam.lr", "1e-3", "--actor.lr_scheduler", "constant",
        "--rollout.temperature", "1.0",
        *flags,
    ]  # fmt: skip


def dump_env(run: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the run's records under ``run``: the loss every worker computed
    (capture/), the engines' log-probs after each sync (sync/, engine_sync.py), the micro-batches (dump/)."""
    env = {
        **os.environ,
        "RPG_CAPTURE_DIR": str(run / "capture"),
        "RPG_SYNC_CHECK_DIR": str(run / "sync"),
        "RPG_STEP_DUMP_DIR": str(run / "dump"),
        **extra,
    }
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    return env


def run_pipeline(argv: list[str], env: dict[str, str], timeout: float) -> str:
    """The combined stdout/stderr of ``argv`` run from the repository root; fails the test on a
    timeout or a non-zero exit."""
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"rpg-train timed out after {timeout}s; {explain(log, 'rpg-train')}")
    assert proc.returncode == 0, f"rpg-train exited {proc.returncode}; {explain(log, 'rpg-train')}"
    return log


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    """The stdout of ``code`` (dedented, with ``args``) run by a fresh interpreter in the repository root;
    fails the test with its output when it fails."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc.stdout


def global_steps(log: str) -> list[int]:
    """The global steps OpenRLHF's trainer logged ("Global step N: {...}")."""
    return sorted(int(s) for s in re.findall(r"Global step (\d+):", log))


def load_all(folder: Path, pattern: str) -> list[dict]:
    """Every record in ``folder`` matching ``pattern``, in name order (rank, then call)."""
    return [torch.load(p, weights_only=False) for p in sorted(folder.glob(pattern))]


def assert_loss_is_core(records: list[dict]) -> None:
    """What each worker computed (a ``loss_rank*`` record) is rpg_openrlhf.core on the captured tensors."""
    from rpg_openrlhf import core

    assert records, "no loss records"
    for rec in records:
        loss, metrics = core.compute_loss(
            rec["name"], rec["style"], rec["logp"], rec["old_logp"], rec["advantages"], rec["action_mask"],
            rec["ref_logp"], config=core.LossConfig(**rec["config"]), dp_size=rec["dp_size"],
            batch_num_tokens=rec["batch_num_tokens"], global_batch_size=rec["global_batch_size"],
            rollout_logp=rec["rollout_logp"],
        )  # fmt: skip
        assert torch.equal(loss, rec["loss"]) and metrics == pytest.approx(rec["metrics"], nan_ok=True)
