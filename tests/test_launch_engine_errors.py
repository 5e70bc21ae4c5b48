"""rpg-train's CPU-engine failures are one line naming the model and what to change (issue #21);
``--debug`` / ``RPG_DEBUG=1`` shows the traceback instead. The failure may come from the driver
(the checks before an engine starts) or from inside a Ray actor (wrapped in Ray's errors)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg_openrlhf.common import train_ppo_ray
from rpg_openrlhf.common.vllm_cpu import VLLMCPUError

REPO = Path(__file__).resolve().parents[1]


class FakeActorError(RuntimeError):
    """Shaped like Ray's RayActorError / ActorDiedError: the original error in ``.cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("The actor died because of an error raised in its creation task")
        self.cause = cause


def _run_raising(monkeypatch, exc: BaseException, argv: list[str]) -> None:
    from rpg_openrlhf.common.deferred_main import DeferredMain

    def run(*args, **kwargs):  # in place of train_ppo_ray's code
        raise exc

    monkeypatch.setattr(DeferredMain, "run", run)
    monkeypatch.delenv("RPG_DEBUG", raising=False)
    train_ppo_ray.TrainPPORay("rpg-train", lambda p: None, lambda a, g: True).run(argv)


def test_one_line_without_debug_and_the_traceback_with_it(monkeypatch, capsys) -> None:
    failure = FakeActorError(
        VLLMCPUError("/m: attention head size 16 ... use a checkpoint with one of those")
    )
    with pytest.raises(SystemExit) as info:
        _run_raising(monkeypatch, failure, ["--actor.model_name_or_path", "/m"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("rpg-train: error: /m: attention head size 16") and "--debug" in err
    with pytest.raises(FakeActorError):  # --debug: the exception itself, with its traceback
        _run_raising(monkeypatch, failure, ["--debug", "--actor.model_name_or_path", "/m"])
    with pytest.raises(KeyError):  # anything else keeps its traceback: a training run must not hide it
        _run_raising(monkeypatch, KeyError("x"), [])


@pytest.mark.e2e
def test_a_head_size_the_cpu_engine_lacks_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The real path: Ray starts, OpenRLHF creates the engines, the CPU check refuses head size 16."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1+2=", "label": "3"}\n{"input": "4+4=", "label": "8"}\n')
    argv = [
        sys.executable, "-m", "rpg_openrlhf.launch.cli", "--backend", "cpu",
        "--actor.model_name_or_path", str(tiny_model_dir),
        "--reward.remote_url", str(REPO / "tests" / "helpers" / "reward_has_digit.py"),
        "--data.prompt_dataset", str(prompts), "--data.input_key", "input", "--data.label_key", "label",
        "--rpg.loss", "urkl", "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2",
        "--train.batch_size", "4", "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--rollout.max_new_tokens", "8", "--data.max_len", "32", "--ds.zero_stage", "0",
        "--ckpt.path", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    env = {**os.environ, "RPG_DEBUG": "0"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rpg-train: error: {tiny_model_dir}: attention head size 16"), proc.stderr[-3000:]
    assert "RPG_CPU_ROLLOUT=hf" in last and "Traceback" not in proc.stderr
