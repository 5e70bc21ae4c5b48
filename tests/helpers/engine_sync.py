"""The check every E2E training test makes on the CPU backend's vLLM weight sync.

After each sync, rank 0 wrote (``RPG_SYNC_CHECK_DIR``) the log-probs that each engine gives a
few fixed token sequences (vLLM ``prompt_logprobs``, fp32 engine) beside a Hugging Face fp32
forward of the actor's (bf16) weights. They must agree to float tolerance at every sync, and the
actor must move by far more than that between syncs, so an engine left with the previous
weights (a stale sync) or with wrong ones fails.
"""

from __future__ import annotations

from pathlib import Path

import torch

#: vLLM's and HF's fp32 CPU kernels agree to ~1e-5 on these log-probs.
FP32_TOLERANCE = 1e-4


def _max_diff(rows_a: list[torch.Tensor], rows_b: list[torch.Tensor]) -> float:
    assert len(rows_a) == len(rows_b)
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(rows_a, rows_b))


def assert_engines_follow_actor(
    check_dir: Path, syncs: int, tol: float = FP32_TOLERANCE, moved: float | None = None
) -> None:
    """Every sync record: engine == actor within ``tol``; the actor moved by > ``moved`` (default
    100 tol) in between. The records are written by rpg_openrlhf/common/sync_check.py."""
    least_move = 100 * tol if moved is None else moved
    paths = sorted(check_dir.glob("sync_*.pt"))
    assert len(paths) >= syncs, f"{len(paths)} sync records in {check_dir}, expected >= {syncs}"
    previous = None
    for path in paths:
        record = torch.load(path, weights_only=False)
        assert record["engines"], path
        for engine_rows in record["engines"]:
            err = _max_diff(engine_rows, record["actor"])
            assert err <= tol, f"{path.name}: engine log-probs differ from the actor's by {err:.4g}"
        if previous is not None:
            move = _max_diff(record["actor"], previous["actor"])
            assert move > least_move, (
                f"{path.name}: the actor moved only {move:.4g}: staleness would not show"
            )
        previous = record
