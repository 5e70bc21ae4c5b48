"""Reward file of docs/training.md's kill-and-resume command: ``reward_has_digit``'s reward. The kill
test's hold points are the trainer's own (``RPG_HOLD_AT=commit:N`` / ``optimizer_step:N``,
``rpg_openrlhf.extras.hold``); a hold mid-rollout (a kill there leaves less behind than one while
saving) is no longer exercised.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# OpenRLHF loads reward files by path: load the sibling the same way.
_spec = importlib.util.spec_from_file_location(
    "reward_has_digit", Path(__file__).with_name("reward_has_digit.py")
)
_scored = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scored)


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict:
    """``reward_has_digit.reward_func`` (rpg-train checks for a top-level function of this name)."""
    return _scored.reward_func(queries, prompts, labels)
