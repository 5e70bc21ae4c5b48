"""Several runs of one method, one per training seed, summarized together.

With x[j, i] the score of seed j's checkpoint (Last, or that seed's own Best) on problem i, the
same n problems for every seed:

* mean = (1/(J n)) sum_j sum_i x[j, i];
* std across seeds = the sample standard deviation (ddof = 1) of the J seeds' means (how far one
  training run lands from another; two seeds or more);
* 95% interval: a two-way (hierarchical) bootstrap. Each resample draws J seeds with replacement
  and, independently, n problems with replacement, and takes the mean over the drawn seeds x drawn
  problems; the interval is the 2.5% and 97.5% percentiles of 2,000 such means. It says how much the
  method's score would move with other training seeds *and* other problems like these. For an
  additive x[j, i] = a_j + b_i the resampled mean is mean(a over drawn seeds) + mean(b over drawn
  problems), whose variance is var(a)/J + var(b)/n (population variances): both sources add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_CHUNK_ELEMENTS = 1 << 22  # resampled (seed, problem) weights drawn at once


@dataclass(frozen=True)
class SeedSummary:
    """One method over its seeds: mean, std across seeds, the two-way bootstrap interval."""

    mean: float
    std: float
    ci_low: float
    ci_high: float
    n_seeds: int
    n_problems: int
    per_seed: tuple[float, ...]


def hierarchical_bootstrap(x: np.ndarray, iters: int = 2000, seed: int = 0) -> np.ndarray:
    """``iters`` resampled grand means of ``x`` [seeds, problems] (seeds and problems drawn with
    replacement, independently; the mean over drawn seeds x drawn problems is the weighted sum
    ``w_seeds^T x w_problems`` of the draws' multiplicities)."""
    x = np.asarray(x, dtype=float)
    if x.ndim != 2 or 0 in x.shape:
        raise ValueError(f"need a [seeds, problems] array, got shape {x.shape}")
    n_seeds, n_problems = x.shape
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_ELEMENTS // (n_seeds + n_problems))
    out = []
    for start in range(0, iters, rows):
        r = min(rows, iters - start)
        ws = _multiplicities(rng.integers(0, n_seeds, size=(r, n_seeds)), n_seeds)
        wp = _multiplicities(rng.integers(0, n_problems, size=(r, n_problems)), n_problems)
        out.append(np.einsum("rj,ji,ri->r", ws, x, wp) / (n_seeds * n_problems))
    return np.concatenate(out)


def _multiplicities(draws: np.ndarray, size: int) -> np.ndarray:
    """How often each index was drawn, per resample: [resamples, size]."""
    counts = np.zeros((draws.shape[0], size))
    np.add.at(counts, (np.arange(draws.shape[0])[:, None], draws), 1.0)
    return counts


def seed_summary(x: np.ndarray, iters: int = 2000, seed: int = 0, alpha: float = 0.05) -> SeedSummary:
    """The summary of ``x`` [seeds, problems] (see the module docstring)."""
    x = np.asarray(x, dtype=float)
    per_seed = x.mean(axis=1)
    means = hierarchical_bootstrap(x, iters=iters, seed=seed)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    if len(per_seed) < 2:  # no spread across seeds can be measured from one
        raise ValueError(f"a summary over seeds needs two seeds or more, got {len(per_seed)}")
    std = float(per_seed.std(ddof=1))
    return SeedSummary(float(x.mean()), std, float(lo), float(hi), x.shape[0], x.shape[1],
                       tuple(float(v) for v in per_seed))  # fmt: skip
