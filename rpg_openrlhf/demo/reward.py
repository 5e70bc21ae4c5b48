"""Reward file of the CPU demo (``rpg-train --reward.remote_url rpg_openrlhf/demo/reward.py``).

The demo task is two-number addition written as ``"a+b="`` with the answer ``"c"``. OpenRLHF loads
this file by path and calls ``reward_func(queries, prompts, labels)`` (one sample at a time, inside
the rollout engine). The reward is binary and exact: 1.0 when the response, with its trailing
special tokens and surrounding whitespace removed, is exactly the decimal answer, else 0.0.

It is the same rule as :func:`exact_answer` that the demo's evaluation uses, so the training
reward and the evaluation verdict agree. Imports only torch (no OpenRLHF, no eval package), so it
also loads inside Ray workers without side effects.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

# Special tokens a decoded query may end with (the tiny tokenizer's <eos>/<pad>, Qwen's <|...|>).
_TRAILING_SPECIAL = re.compile(r"(?:\s*(?:<\|[^|<>\s]{1,40}\|>|</s>|<eos>|<pad>|<unk>))+\s*$")
_LEADING_PAD = re.compile(r"^(?:<pad>)+")


def response_part(query: str, prompt: str) -> str:
    """The response in ``query`` (= prompt + response), without trailing special tokens."""
    query = _LEADING_PAD.sub("", query)
    if prompt and query.startswith(prompt):
        response = query[len(prompt) :]
    elif prompt and prompt in query:
        response = query[query.rfind(prompt) + len(prompt) :]
    else:
        response = query
    return _TRAILING_SPECIAL.sub("", response)


def exact_answer(response: str, gold: str) -> bool:
    """True when ``response`` (stripped of special tokens and whitespace) is exactly ``gold``."""
    return _TRAILING_SPECIAL.sub("", response).strip() == str(gold).strip()


def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[str]) -> dict:
    """OpenRLHF's reward-function API: ``{"rewards", "scores", "extra_logs"}`` (float tensors [B])."""
    if not (len(queries) == len(prompts) == len(labels)):
        raise ValueError(
            f"reward_func: queries, prompts and labels differ in length "
            f"({len(queries)}, {len(prompts)}, {len(labels)})"
        )
    rewards = [
        1.0 if exact_answer(response_part(q, p), label) else 0.0
        for q, p, label in zip(queries, prompts, labels)
    ]
    scores = torch.tensor(rewards, dtype=torch.float32)
    return {"rewards": scores, "scores": scores.clone(), "extra_logs": {"exact": scores.clone()}}
