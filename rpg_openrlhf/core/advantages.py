"""Group baselines over the n samples of a prompt, and their broadcast to tokens."""

from __future__ import annotations

from torch import Tensor

BASELINES = ("mean", "mean_std", "loo", "none")


def group_advantages(rewards: Tensor, n_samples: int, baseline: str = "mean") -> Tensor:
    """A_ij = R_ij - b_i for the n samples j of prompt i (rows i*n .. i*n+n-1, prompt-major):
    mean:      A = R - mean_j R                      (RPG: group mean, no std division)
    mean_std:  A = (R - mean_j R) / (std_j R + 1e-9)  (GRPO; unbiased std, as OpenRLHF group_norm)
    loo:       A = R - (sum_j R - R) / (n - 1)        (leave-one-out, as OpenRLHF rloo)
    none:      A = R"""
    if baseline not in BASELINES:
        raise ValueError(f"baseline: unknown {baseline!r}, expected one of {BASELINES}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected a 1-D tensor [B], got shape {tuple(rewards.shape)}")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples: must be a positive int, got {n_samples!r}")
    if rewards.numel() % n_samples:
        raise ValueError(f"n_samples: {n_samples} does not divide the number of rewards {rewards.numel()}")
    if n_samples < 2 and baseline in ("mean_std", "loo"):
        raise ValueError(f"n_samples: baseline {baseline!r} needs at least 2 samples per prompt")
    if baseline == "none":
        return rewards.clone()
    r = rewards.reshape(-1, n_samples)
    if baseline == "loo":
        return (r - (r.sum(-1, keepdim=True) - r) / (n_samples - 1)).reshape(-1)
    adv = r - r.mean(-1, keepdim=True)
    return (adv if baseline == "mean" else adv / (r.std(-1, keepdim=True) + 1e-9)).reshape(-1)


def broadcast_to_tokens(advantages: Tensor, action_mask: Tensor) -> Tensor:
    """[B] sequence advantages -> [B, T] per-token advantages (0 at masked positions)."""
    if advantages.dim() != 1 or action_mask.dim() != 2 or advantages.shape[0] != action_mask.shape[0]:
        raise ValueError(f"advantages: shape {tuple(advantages.shape)} must be [B] for action_mask "
                         f"{tuple(action_mask.shape)}")  # fmt: skip
    return advantages.unsqueeze(-1) * action_mask.to(advantages.dtype)
