"""Metrics over per-problem sample counts: unbiased pass@k, bootstrap intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..limits import MAX_ITERS


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct out of ``n`` samples (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    # Product form: numerically stable for large n.
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_for(n: int) -> list[int]:
    """Powers of two up to n, plus n itself: {1, 2, 4, ..., n}."""
    ks = [1 << i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    if n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


_CHUNK_ELEMENTS = 1 << 22  # resampled indices drawn at once (32 MiB of int64)


def bootstrap_ci(
    per_problem: Sequence[float], iters: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over problems (problems resampled with
    replacement); reproducible for a seed.  Resamples are drawn in chunks of at most
    _CHUNK_ELEMENTS indices (numpy draws them one after another: the same numbers as one call)."""
    x = np.asarray(per_problem, dtype=float)
    if x.size == 0:
        raise ValueError("no problems")
    if isinstance(iters, bool) or not isinstance(iters, int) or not 1 <= iters <= MAX_ITERS:
        raise ValueError(
            f"bootstrap resamples (--iters) must be an integer in [1, {MAX_ITERS}], got {iters!r}"
        )
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // x.size)
    means = np.concatenate(
        [
            x[rng.integers(0, x.size, size=(min(rows, iters - i), x.size))].mean(axis=1)
            for i in range(0, iters, rows)
        ]
    )
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def pass_at_ks(correct: Sequence[Sequence[bool]]) -> dict[str, float]:
    """pass@k (k in ks_for(n)), averaged over problems, for per-problem verdict lists of length n."""
    n = len(correct[0])
    return {f"pass@{k}": float(np.mean([pass_at_k(n, int(sum(c)), k) for c in correct])) for k in ks_for(n)}
