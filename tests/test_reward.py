"""The reward file for --reward.remote_url: both graders, response extraction, exceptions counted."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rpg_openrlhf.plugin import reward

PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(reward.GRADER_ENV, raising=False)


def _load_by_path():
    """The module as OpenRLHF loads it: by file path, under the name 'reward_func'."""
    spec = importlib.util.spec_from_file_location("reward_func", reward.reward_file())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_math_verify_default_boxed_one_zero():
    fn = _load_by_path().reward_func
    queries = [PROMPT + "6*7 = 42, so \\boxed{42}<|im_end|>", PROMPT + "I think \\boxed{41}.<|im_end|>"]
    out = fn(queries, [PROMPT, PROMPT], ["42", "42"])
    assert set(out) == {"rewards", "scores", "extra_logs"}
    assert out["rewards"].tolist() == [1.0, 0.0] and out["scores"].tolist() == [1.0, 0.0]
    assert out["rewards"].dtype == torch.float32 and out["rewards"].shape == (2,)
    assert out["extra_logs"]["reward_error"].tolist() == [0.0, 0.0]


def test_paper_grader_answer_line_plus_minus_one(monkeypatch):
    monkeypatch.setenv(reward.GRADER_ENV, "paper")
    queries = [
        PROMPT + "Reasoning...\nAnswer: 42<|im_end|>",
        PROMPT + "Reasoning...\nAnswer: 41<|endoftext|>",
    ]
    out = reward.reward_func(queries, [PROMPT, PROMPT], ["42", "42"])
    assert out["rewards"].tolist() == [1.0, -1.0]
    assert out["scores"].tolist() == [1.0, 0.0]  # accuracy, for dynamic filtering with range (0, 1)


def test_paper_grader_needs_answer_line(monkeypatch):
    monkeypatch.setenv(reward.GRADER_ENV, "paper")
    out = reward.reward_func([PROMPT + "the answer is \\boxed{42}"], [PROMPT], ["42"])
    assert out["rewards"].tolist() == [-1.0]
    assert out["extra_logs"]["reward_no_answer"].tolist() == [1.0]


def test_response_is_taken_after_the_prompt():
    # The prompt contains a boxed 7; only the response's answer counts.
    prompt = "Example: \\boxed{7}. Now solve 6*7.\n"
    assert reward.split_response(prompt + "so \\boxed{42}</s>", prompt) == "so \\boxed{42}"
    out = reward.reward_func([prompt + "no idea"], [prompt], ["7"])
    assert out["rewards"].tolist() == [0.0]
    # Decoding that does not reproduce the prompt exactly: cut at the common prefix.
    assert reward.split_response("Q: 1+1 ?A: \\boxed{2}", "Q: 1+1?") == " ?A: \\boxed{2}"


def test_exceptions_are_logged_and_counted_not_missing(monkeypatch, caplog):
    import rpg_eval.graders as graders

    def boom(*a, **k):
        raise RuntimeError("grader exploded")

    monkeypatch.setattr(graders, "grade", boom)
    with caplog.at_level("ERROR", logger="rpg_openrlhf.reward"):
        out = reward.reward_func(
            [PROMPT + "\\boxed{42}", PROMPT + "\\boxed{1}"], [PROMPT, PROMPT], ["42", "42"]
        )
    assert out["rewards"].tolist() == [0.0, 0.0]  # a reward for every sample, never None
    assert out["extra_logs"]["reward_error"].tolist() == [1.0, 1.0]
    assert "grader exploded" in caplog.text

    monkeypatch.setenv(reward.GRADER_ENV, "paper")
    out = reward.reward_func([PROMPT + "Answer: 42"], [PROMPT], ["42"])
    assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["reward_error"].tolist() == [1.0]


def test_unknown_grader_and_bad_lengths(monkeypatch):
    monkeypatch.setenv(reward.GRADER_ENV, "exact")
    with pytest.raises(ValueError, match=reward.GRADER_ENV):
        reward.reward_func(["q"], ["p"], ["1"])
    monkeypatch.delenv(reward.GRADER_ENV)
    with pytest.raises(ValueError, match="differ in length"):
        reward.reward_func(["q", "r"], ["p"], ["1"])
