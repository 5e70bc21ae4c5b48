"""Two runs on the same problems: the paired difference of a score, an exact sign-flip (paired
permutation) p-value, and the interval of shifts that same test does not reject.

With a_i and b_i the two runs' scores on problem i (mean@k: the share of its k samples right;
maj@k: 0 or 1), in the same problem order:

* difference ``D = (1/n) sum_i d_i`` with ``d_i = a_i - b_i``;
* p-value: under "neither run is better on any problem" each d_i is as likely to be -d_i, so the
  2^n sign patterns s are equally likely and ``p = P(|sum_i s_i d_i| >= |sum_i d_i|)`` (two-sided).
  It is exact: ``d_i = m_i / q`` with integers m_i (q = k for mean@k, 1 for maj@k), and the
  distribution of ``sum_i s_i m_i`` is built by convolving the problems' two-point distributions
  {-m_i, +m_i} one after another (O(n * sum |m_i|) work; above MAX_EXACT_WORK a seeded Monte Carlo
  estimate ``(1 + #{|T*| >= |T|}) / (1 + R)`` over R = 100,000 sign patterns is used instead);
* the verdict: the runs differ when that test rejects at ALPHA = 5% (``p <= 0.05``), nothing else;
* 95% interval: the shifts delta in [-1, 1] the same test does not reject when applied to
  ``d_i - delta`` (test inversion), so it excludes 0 exactly when the verdict says "differ". The
  statistic of a sign pattern at shift delta is ``sum_i s_i m_i / q - delta sum_i s_i``, so one
  joint distribution of (sum_i s_i m_i, sum_i s_i) serves every delta (exact below
  MAX_INTERVAL_WORK, else Monte Carlo draws); each end is found by bisection to 1e-7. (A percentile
  bootstrap interval can exclude 0 where this test does not reject: 4:0 discordant problems of 30.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # the verdict's level: "differ" when the sign-flip test rejects at 5%
MAX_EXACT_WORK = 300_000_000  # n * sum|m_i| of the exact convolution (about a second of numpy)
MAX_INTERVAL_WORK = 60_000_000  # n * cells of the exact joint distribution of the interval
MONTE_CARLO_DRAWS = 100_000
_TOLERANCE = 1e-7  # of the interval's ends (differences are printed to 3-4 digits)


@dataclass(frozen=True)
class PairedDifference:
    """A - B of one score on the same n problems: mean difference, the 95% interval of shifts the
    sign-flip test does not reject, its p-value (``exact``: by enumeration, not Monte Carlo)."""

    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    n_problems: int
    exact: bool = True

    @property
    def excludes_zero(self) -> bool:
        """The verdict "the runs differ": the sign-flip test rejects at 5% (the interval, its
        inversion, then lies wholly above or below 0)."""
        return self.p_value <= ALPHA

    @property
    def direction(self) -> int:
        """+1: A above B (the test rejects, D > 0), -1: below, 0: no difference shown."""
        return 0 if not self.excludes_zero else 1 if self.diff > 0 else -1


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


def _sign_draws(n: int, seed: int) -> Iterator[np.ndarray]:
    """MONTE_CARLO_DRAWS seeded sign patterns of n problems, in chunks of at most 2^22 signs."""
    rng = np.random.default_rng(seed)
    rows, done = max(1, (1 << 22) // n), 0
    while done < MONTE_CARLO_DRAWS:
        r = min(rows, MONTE_CARLO_DRAWS - done)
        yield rng.integers(0, 2, size=(r, n)) * 2 - 1
        done += r


def _monte_carlo_p(v: np.ndarray, observed: int, seed: int) -> float:
    hits = sum(int(np.count_nonzero(np.abs(signs @ v) >= observed)) for signs in _sign_draws(v.size, seed))
    return (1 + hits) / (1 + MONTE_CARLO_DRAWS)


def _joint_null(m: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Points (A, C, weight) of the distribution of (sum s_i m_i, sum s_i) over sign patterns, and
    the Monte Carlo count R (0: exact weights summing to 1; else R draws of weight 1)."""
    n, total = m.size, int(np.abs(m).sum())
    if n * (2 * total + 1) * (2 * n + 1) <= MAX_INTERVAL_WORK:
        dist = np.zeros((2 * total + 1, 2 * n + 1))  # dist[A + total, C + n]
        dist[total, n] = 1.0
        for x in m:  # the support never reaches an edge, so np.roll wraps only zeros
            dist = 0.5 * (np.roll(dist, (int(x), 1), (0, 1)) + np.roll(dist, (-int(x), -1), (0, 1)))
        a, c = np.nonzero(dist)
        return a - total, c - n, dist[a, c], 0
    a, c = (np.concatenate(x) for x in zip(*((s @ m, s.sum(axis=1)) for s in _sign_draws(n, seed))))
    return a, c, np.ones(a.size), MONTE_CARLO_DRAWS


def shifted_p(m: Sequence[int], denominator: int, seed: int = 0) -> Callable[[float], float]:
    """delta -> the sign-flip p-value of the differences ``m / denominator - delta``."""
    mm = np.asarray(m, dtype=np.int64)
    a, c, w, draws = _joint_null(mm, seed)
    n, s = mm.size, float(mm.sum())

    def p(delta: float) -> float:
        shift = delta * denominator  # in units of 1/denominator, where A and the observed sum live
        observed = abs(s - n * shift)
        hit = np.abs(a - shift * c) >= observed - 1e-9 * (1.0 + abs(s) + n)
        total = float(w[hit].sum())
        return min(1.0, total) if not draws else (1.0 + total) / (1.0 + draws)

    return p


def _end(p: Callable[[float], float], diff: float, side: int, zero_rejected: bool) -> float:
    """The end of the accepted shifts on ``side`` (-1 low, +1 high) of ``diff`` (accepted: p = 1),
    within [-1, 1]. 0, when it lies on that side, is taken as the verdict says (so the interval
    and the verdict agree even where Monte Carlo draws differ)."""
    accept, reject = diff, None
    if side * (0.0 - diff) > 0:
        if zero_rejected:
            reject = 0.0
        else:
            accept = 0.0
    if reject is None:
        bound = float(side)
        if p(bound) > ALPHA:
            return bound
        reject = bound
    while abs(reject - accept) > _TOLERANCE:
        mid = 0.5 * (accept + reject)
        if p(mid) > ALPHA:
            accept = mid
        else:
            reject = mid
    return accept


def paired_difference(
    a: Sequence[float], b: Sequence[float], denominator: int, seed: int = 0
) -> PairedDifference:
    """A - B over the same problems (``a[i]``, ``b[i]``: problem i), see the module docstring."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_.shape != b_.shape or a_.size == 0:
        raise ValueError(f"paired scores need the same problems, got {a_.size} and {b_.size}")
    d = a_ - b_
    m = integer_differences(d, denominator)
    p_value, exact = sign_flip_p(m, seed=seed)
    diff = float(m.sum()) / denominator / m.size
    rejected = p_value <= ALPHA
    p = shifted_p(m, denominator, seed)
    lo, hi = _end(p, diff, -1, rejected), _end(p, diff, +1, rejected)
    return PairedDifference(float(d.mean()), lo, hi, p_value, int(d.size), exact)
