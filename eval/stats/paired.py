"""Two runs on the same problems: the paired difference of a score, its bootstrap interval and an
exact sign-flip (paired permutation) p-value.

With a_i and b_i the two runs' scores on problem i (mean@k: the share of its k samples right;
maj@k: 0 or 1), in the same problem order:

* difference ``D = (1/n) sum_i d_i`` with ``d_i = a_i - b_i``;
* 95% interval: percentile bootstrap of D, the n problems resampled with replacement and the same
  draw used for both runs (``metrics.bootstrap_ci`` on the d_i). A problem's difficulty moves a_i and
  b_i together; pairing cancels it, so the paired interval is narrower than two unpaired ones
  whenever the runs' per-problem scores are positively correlated (and wider when negatively);
* p-value: under "neither run is better on any problem" each d_i is as likely to be -d_i, so the
  2^n sign patterns s are equally likely and ``p = P(|sum_i s_i d_i| >= |sum_i d_i|)`` (two-sided).
  It is exact: ``d_i = m_i / q`` with integers m_i (q = k for mean@k, 1 for maj@k), and the
  distribution of ``sum_i s_i m_i`` is built by convolving the problems' two-point distributions
  {-m_i, +m_i} one after another (O(n * sum |m_i|) work; above MAX_EXACT_WORK a seeded Monte Carlo
  estimate ``(1 + #{|T*| >= |T|}) / (1 + R)`` over R = 100,000 sign patterns is used instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .metrics import bootstrap_ci

MAX_EXACT_WORK = 300_000_000  # n * sum|m_i| of the exact convolution (about a second of numpy)
MONTE_CARLO_DRAWS = 100_000


@dataclass(frozen=True)
class PairedDifference:
    """A - B of one score on the same n problems: mean difference, 95% paired bootstrap interval,
    sign-flip p-value (``exact``: by enumeration of the sign distribution, not Monte Carlo)."""

    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n_problems: int
    exact: bool = True

    @property
    def excludes_zero(self) -> bool:
        """Whether the 95% interval lies wholly above or below 0 (the runs differ at that level)."""
        return self.ci_low > 0 or self.ci_high < 0

    @property
    def direction(self) -> int:
        """+1: A above B (interval above 0), -1: below, 0: the interval holds 0."""
        return 1 if self.ci_low > 0 else -1 if self.ci_high < 0 else 0


def integer_differences(d: Sequence[float], denominator: int) -> np.ndarray:
    """The integers m_i with d_i = m_i / denominator (ValueError when the d_i are not such multiples:
    the two runs' scores were not counted over the same number of samples)."""
    scaled = np.asarray(d, dtype=float) * denominator
    m = np.rint(scaled)
    if not np.allclose(scaled, m, atol=1e-6):
        raise ValueError(f"per-problem differences are not multiples of 1/{denominator}")
    return m.astype(np.int64)


def sign_flip_p(m: Sequence[int], seed: int = 0) -> tuple[float, bool]:
    """Two-sided sign-flip p-value of integer differences ``m``: (p, exact)."""
    v = np.abs(np.asarray(m, dtype=np.int64))
    v = v[v != 0]  # a problem without a difference adds nothing to any sign pattern
    observed = abs(int(np.sum(m)))
    if v.size == 0:
        return 1.0, True
    total = int(v.sum())
    if v.size * total > MAX_EXACT_WORK:
        return _monte_carlo_p(v, observed, seed), False
    dist = np.zeros(2 * total + 1)  # dist[t + total] = P(sum s_i m_i = t)
    dist[total] = 1.0
    for x in v:
        shifted = np.zeros_like(dist)
        shifted[x:] += 0.5 * dist[:-x]  # s_i = +1
        shifted[:-x] += 0.5 * dist[x:]  # s_i = -1
        dist = shifted
    t = np.arange(-total, total + 1)
    return float(min(1.0, dist[np.abs(t) >= observed].sum())), True


def _monte_carlo_p(v: np.ndarray, observed: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    rows = max(1, (1 << 22) // v.size)
    while done < MONTE_CARLO_DRAWS:
        r = min(rows, MONTE_CARLO_DRAWS - done)
        signs = rng.integers(0, 2, size=(r, v.size)) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ v) >= observed))
        done += r
    return (1 + hits) / (1 + MONTE_CARLO_DRAWS)


def paired_difference(
    a: Sequence[float], b: Sequence[float], denominator: int, iters: int = 2000, seed: int = 0
) -> PairedDifference:
    """A - B over the same problems (``a[i]``, ``b[i]``: problem i), see the module docstring."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape or a_.size == 0:
        raise ValueError(f"paired scores need the same problems, got {a_.size} and {b_.size}")
    d = a_ - b_
    lo, hi = bootstrap_ci(d, iters=iters, seed=seed)
    p, exact = sign_flip_p(integer_differences(d, denominator), seed=seed)
    return PairedDifference(float(d.mean()), lo, hi, p, int(d.size), exact)
