"""What the CPU demo (``rpg-demo``) runs on: its sizes (:class:`DemoConfig`; ``--quick`` differs
only there), the two RL methods and their flags, and the addition problems (training and held-out)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BENCHMARK = "addition"
BENCHMARK_DISPLAY = "a+b held-out"
PROMPT_STYLE = "plain"

#: The two RL methods of the demo: run name -> (label, rpg-train flags).
METHODS: dict[str, tuple[str, list[str]]] = {
    "rpg_reinforce_urkl": (
        "RPG-REINFORCE-URKL (RPG-Style Clip)",
        [
            "--rpg.loss", "urkl", "--rpg.style", "reinforce_clip", "--rpg.ref_update", "rollout",
            "--rpg.beta", "1e-4", "--rpg.advantage", "mean", "--algo.kl.init_coef", "0",
            "--actor.eps_clip_low_high", "0.2", "0.28",
        ],
    ),
    "grpo": (
        "GRPO",
        [
            "--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
            "--algo.kl.init_coef", "1e-4", "--actor.eps_clip_low_high", "0.2", "0.2",
        ],
    ),
}  # fmt: skip


@dataclass
class DemoConfig:
    """Sizes of one demo run (the full demo and ``--quick`` differ only here)."""

    seed: int = 0
    heldout: int = 40  # held-out problems (never seen in SFT or RL)
    eval_n: int = 8  # samples per held-out problem
    sft_epochs: int = 44  # x 9 steps of 256 samples (~400 steps)
    sft_batch: int = 256
    sft_lr: float = 3e-3
    sft_target: float = 0.3  # stop the warm-up at the first checkpoint with this sampled accuracy
    sft_probe: int = 200  # training prompts used to measure it
    rl_steps: int = 30
    rl_prompts_per_step: int = 64
    rl_samples_per_prompt: int = 8
    rl_train_batch: int = 256  # two optimizer steps per rollout (off-policy data for the clip)
    rl_lr: float = 2e-4
    save_steps: int = 10
    max_new_tokens: int = 5
    methods: list[str] = field(default_factory=lambda: list(METHODS))

    @classmethod
    def quick(cls) -> DemoConfig:
        """The CI variant: same code path, fewer steps and problems (two SFT checkpoints to probe; a
        quarter of the RL batch, still two optimizer steps per rollout)."""
        return cls(
            heldout=16,
            eval_n=2,
            sft_epochs=2,
            rl_steps=4,
            rl_prompts_per_step=16,
            rl_train_batch=64,
            save_steps=2,
        )


def make_problems(seed: int, heldout: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """All pairs a, b in [0, 49] shuffled with ``seed``: (training rows, held-out rows).

    Rows are ``{"id", "input": "a+b=", "output"/"label": "c"}``; the held-out rows are disjoint from
    the training rows (SFT and RL both draw only from the training rows).
    """
    pairs = [(a, b) for a in range(50) for b in range(50)]
    random.Random(seed).shuffle(pairs)
    rows = [
        {"id": f"{a}+{b}", "input": f"{a}+{b}=", "output": str(a + b), "label": str(a + b)} for a, b in pairs
    ]
    return rows[heldout:], rows[:heldout]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as JSON lines (creating the folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mean_or_nan(xs: list[float]) -> float:
    """The mean of ``xs``; NaN for none (a run that logged no step)."""
    return sum(xs) / len(xs) if xs else float("nan")
