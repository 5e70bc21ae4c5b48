"""Reward file for the E2E tests (``--reward.remote_url tests/helpers/reward_has_digit.py``).

OpenRLHF loads it by path and calls ``reward_func(queries, prompts, labels)``. The reward is
mostly "the response (the query minus its prompt) contains a digit" (0.9), plus 0.1 times the
share of printable ASCII characters in the response: a tie-breaker that makes the two samples of
a group almost never score the same, so group-normalised advantages are non-zero and every step
really changes the weights. Values lie in [0, 1]. The E2E tests check the pipeline runs and
trains, not that a random tiny model learns arithmetic.
"""

from __future__ import annotations

import torch


def _response(query: str, prompt: str) -> str:
    return query[len(prompt) :] if query.startswith(prompt) else query


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    """One reward per query in [0, 1]; ``extra_logs.has_digit`` is the 0/1 digit indicator."""
    digits, rewards = [], []
    for query, prompt in zip(queries, prompts):
        response = _response(query, prompt)
        has_digit = float(any(ch.isdigit() for ch in response))
        printable = sum(" " <= ch <= "~" for ch in response) / max(len(response), 1)
        digits.append(has_digit)
        rewards.append(0.9 * has_digit + 0.1 * printable)
    scores = torch.tensor(rewards, dtype=torch.float)
    return {"rewards": scores, "scores": scores, "extra_logs": {"has_digit": torch.tensor(digits)}}
