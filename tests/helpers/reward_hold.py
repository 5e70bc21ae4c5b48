"""Reward file for the kill tests: ``reward_has_digit``'s reward, and a hold in the middle of a rollout.

Each rollout engine counts its calls (OpenRLHF calls the reward once per sample, inside the engine's
``generate_responses``); with ``RPG_HOLD_AT=reward_call:N`` the N-th call of an engine process never
returns (``rpg_openrlhf.extras.hold``), so the engine, and the trainer waiting for its samples, stand
in the rollout until the test kills them.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from rpg_openrlhf.extras.hold import hold

# OpenRLHF loads reward files by path: load the sibling the same way.
_spec = importlib.util.spec_from_file_location(
    "reward_has_digit", Path(__file__).with_name("reward_has_digit.py")
)
_scored = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scored)
_calls = 0
_lock = threading.Lock()


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    """``reward_has_digit.reward_func``; holds at the call named by ``RPG_HOLD_AT=reward_call:N``."""
    global _calls
    with _lock:
        _calls += 1
        n = _calls
    hold("reward_call", n)
    return _scored.reward_func(queries, prompts, labels)
