"""Custom benchmarks in ``rpg-eval run``: ``--benchmarks demo --data demo=FILE`` with the ``plain``
prompt style (problem text verbatim, no chat template) and math-verify's anchor-free fallback,
through the real runner (lm-eval, hf backend) on a tiny arithmetic model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from rpg_eval import records as rec
from rpg_eval.cli import main as cli_main
from rpg_eval.graders import grade
from rpg_eval.run import lm_models
from rpg_eval.run.runner import RunConfig
from rpg_eval.run.taskgen import task_yaml
from rpg_eval.run.tasks.utils import grade_responses

PROBLEMS = [("p1", "12+7=", "19"), ("p2", "3+4=", "7"), ("p3", "40+9=", "49")]


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "demo.jsonl"
    path.write_text("".join(json.dumps({"id": i, "problem": p, "answer": a}) + "\n" for i, p, a in PROBLEMS))
    return path


@pytest.fixture(scope="module")
def arith_ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rpg_openrlhf.tinymodel import ARITHMETIC_ALPHABET, build_tiny_model

    root = tmp_path_factory.mktemp("ckpts")
    for step in (0, 5):
        build_tiny_model(
            root / f"global_step{step}_hf", alphabet=ARITHMETIC_ALPHABET, seed=step, chat_template=False
        )
    return root


def test_bare_number_grading() -> None:
    """Fallback on: a bare "19" is right, "18" wrong; the paper grader (no anchor) says wrong."""
    v = grade_responses(["19", "18", ""], "19", allow_fallback=True)
    assert v["math_verify"] == [True, False, False]
    assert v["paper"] == [False, False, False]
    # Without the fallback math-verify needs an anchor too (built-in behaviour unchanged).
    assert grade_responses(["19"], "19")["math_verify"] == [False]


def test_custom_task_yaml_and_validation(demo_file: Path) -> None:
    y = task_yaml("demo", "plain", n=2, max_tokens=4, allow_fallback=True)
    assert "task: rpg_demo_plain" in y and "  benchmark: demo" in y and "  allow_fallback: true" in y
    assert "max_gen_toks: 4" in y and "allow_fallback" not in task_yaml("aime24", "boxed")
    with pytest.raises(ValueError, match="--data NAME=FILE"):
        RunConfig(checkpoints="x", out="y", benchmarks=["demo"]).validate()
    with pytest.raises(ValueError, match="custom name"):
        RunConfig(
            checkpoints="x", out="y", benchmarks=["../x"], data_files={"../x": str(demo_file)}
        ).validate()
    RunConfig(checkpoints="x", out="y", benchmarks=["demo"], data_files={"demo": str(demo_file)}).validate()


@pytest.mark.slow
def test_run_custom_benchmark_plain(
    arith_ckpts: Path, demo_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    contexts: list[str] = []
    original = lm_models.RPGHFLM.generate_until

    def spy(self, requests, disable_tqdm=False):  # the exact model input lm-eval built
        contexts.extend(r.args[0] for r in requests)
        return original(self, requests, disable_tqdm)

    monkeypatch.setattr(lm_models.RPGHFLM, "generate_until", spy)
    out = tmp_path / "eval"
    argv = [
        "run", "--checkpoints", str(arith_ckpts), "--out", str(out), "--benchmarks", "demo",
        "--data", f"demo={demo_file}", "--prompt-style", "plain", "--allow-fallback", "--backend", "hf",
        "--n", "2", "--max-tokens", "4", "--device", "cpu", "--run", "arith"
    ]  # fmt: skip
    assert cli_main(argv) == 0
    assert (out / "tasks" / "rpg_demo_plain.yaml").is_file()
    assert json.loads((out / "run.json").read_text())["grading"]["allow_fallback"] is True

    # The model input is the problem text verbatim: no instruction, no chat template.
    problems = {i: (p, a) for i, p, a in PROBLEMS}
    assert sorted(set(contexts)) == sorted(p for _, p, _ in PROBLEMS)

    records = list(rec.read(out / "samples.jsonl"))
    assert len(records) == 2 * len(PROBLEMS) * 2  # checkpoints x problems x n
    assert {r["step"] for r in records} == {0, 5}
    for r in records:
        problem, answer = problems[r["problem_id"]]
        assert r["benchmark"] == "demo" and r["task"] == "rpg_demo_plain" and r["prompt_style"] == "plain"
        assert r["gold"] == answer and r["run"] == "arith"
        assert r["prompt_hash"] == hashlib.sha256(problem.encode()).hexdigest()
        assert len(r["response"]) <= 4  # one character per token, at most --max-tokens
        # Verdicts are those of grading the stored response (math-verify with the fallback).
        mv = grade(r["response"], answer, "math_verify", allow_fallback=True)
        pa = grade(r["response"], answer, "paper")
        assert r["correct"] == {"math_verify": bool(mv.correct), "paper": bool(pa.correct)}

    # The summary knows the custom benchmark.
    text = (out / "last_best.csv").read_text()
    assert "demo" in text and "arith" in text
