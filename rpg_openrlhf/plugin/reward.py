"""Math reward for OpenRLHF's ``--reward.remote_url /path/to/reward.py``.

OpenRLHF loads this file by path and calls ``reward_func(queries, prompts, labels)`` (inside the
rollout engine, one sample at a time, in a worker thread). ``query`` is the decoded prompt +
response (special tokens kept); ``prompt`` is the prompt text; ``label`` the gold answer.

Grader, chosen by the environment variable ``RPG_REWARD_GRADER`` (read at every call):

* ``math_verify`` (default): math-verify on the final answer (the last ``\\boxed{...}`` or
  ``Answer:`` line) -> reward 1 / 0;
* ``paper``: the RPG paper's grader (last ``Answer:`` line in the final 300 characters, Minerva
  normalization, exact match) -> reward +1 / -1.

Both are ``rpg_eval.graders.grade``, so the training reward is the evaluation verdict.

Failures are never a missing reward: an exception while grading is logged (with traceback),
counted (``extra_logs["reward_error"]`` = 1 for that sample, which OpenRLHF logs), and the sample
gets the grader's "wrong" reward (0 or -1). Grader timeouts and responses without an answer are
counted the same way (``reward_timeout``, ``reward_no_answer``).

Path for the flag: ``python -c "import rpg_openrlhf.plugin.reward as r; print(r.__file__)"``
(or :func:`reward_file`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

import torch

logger = logging.getLogger("rpg_openrlhf.reward")

GRADER_ENV = "RPG_REWARD_GRADER"
GRADERS = ("math_verify", "paper")
WRONG_REWARD = {"math_verify": 0.0, "paper": -1.0}
# Special tokens a decoded query can end with (<|im_end|>, <|endoftext|>, </s>, <eos>, <pad>...).
_TRAILING_SPECIAL = re.compile(r"(?:\s*(?:<\|[^|<>\s]{1,40}\|>|</s>|<eos>|<pad>|<\|?end[^<>\s]{0,20}>))+\s*$")


def reward_file() -> str:
    """The path to pass to ``--reward.remote_url``."""
    return os.path.abspath(__file__)


def grader_name() -> str:
    """The grader selected by ``RPG_REWARD_GRADER`` (default math_verify); ValueError if unknown."""
    name = os.environ.get(GRADER_ENV, "math_verify").strip() or "math_verify"
    if name not in GRADERS:
        raise ValueError(f"{GRADER_ENV}={name!r} is unknown; choose one of {', '.join(GRADERS)}")
    return name


def split_response(query: str, prompt: str) -> str:
    """The response part of ``query`` (= prompt + response), without trailing special tokens."""
    if prompt and query.startswith(prompt):
        response = query[len(prompt) :]
    elif prompt and prompt in query:
        response = query[query.rfind(prompt) + len(prompt) :]
    else:  # decoding does not always reproduce the prompt text exactly: cut at the longest common prefix
        response = query[len(os.path.commonprefix([query, prompt or ""])) :]
    return _TRAILING_SPECIAL.sub("", response)


def score_one(query: str, prompt: str, label: str, grader: str) -> tuple[float, float, dict[str, float]]:
    """Reward, accuracy (1/0) and per-sample log values for one sample (never raises)."""
    logs = {"reward_error": 0.0, "reward_timeout": 0.0, "reward_no_answer": 0.0}
    try:
        from rpg_eval.graders import grade

        response = split_response(query, prompt)
        verdict = grade(response, str(label), grader=grader)
    except Exception:
        logger.exception(
            "reward: grading failed (counted as reward_error; the sample gets the wrong-answer reward)"
        )
        logs["reward_error"] = 1.0
        return WRONG_REWARD[grader], 0.0, logs
    if verdict.error == "timeout":
        logs["reward_timeout"] = 1.0
    elif verdict.error == "no answer" or verdict.extracted is None:
        logs["reward_no_answer"] = 1.0
    elif verdict.error:
        logger.warning(f"reward: grader reported {verdict.error!r} (counted as reward_error)")
        logs["reward_error"] = 1.0
    return float(verdict.reward), 1.0 if verdict.correct else 0.0, logs


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str]) -> dict:
    """OpenRLHF's reward-function API: ``{"rewards", "scores", "extra_logs"}`` (tensors [B]).

    ``scores`` is the accuracy (1 / 0) with either grader, so OpenRLHF's dynamic filtering with
    ``--algo.dynamic_filtering_range 0 1`` drops exactly the groups whose accuracy std is 0."""
    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(
            f"reward_func: queries, prompts and labels differ in length ({len(queries)}, {len(prompts)}, {len(labels)})"
        )
    grader = grader_name()
    rewards: list[float] = []
    accuracy: list[float] = []
    logs: dict[str, list[float]] = {}
    for query, prompt, label in zip(queries, prompts, labels):
        r, acc, sample_logs = score_one(query, prompt, label, grader)
        rewards.append(r)
        accuracy.append(acc)
        for key, value in sample_logs.items():
            logs.setdefault(key, []).append(value)
    return {
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "scores": torch.tensor(accuracy, dtype=torch.float32),
        "extra_logs": {k: torch.tensor(v, dtype=torch.float32) for k, v in logs.items()},
    }
