"""How often the paired verdict says "differ": ``python -m rpg_eval.stats.simulate [--pairs 2000]``.

Each simulated pair of runs scores the same n problems with k samples each: problem i's accuracy
p_i ~ Beta(2, 2) for run B, and p_i + effect (clipped to [0, 1]) for run A; each run's correct count
is Binomial(k, p). With effect 0 (no true difference) the share of "differ" verdicts is the false
rate, which the exact sign-flip test keeps at or below 5%; with effect > 0 it is the power. The
verdict is ``paired.paired_difference``'s, as ``compare``, ``table --baseline`` and ``report`` use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from .paired import paired_difference

CONFIGS = ((30, 1), (30, 8), (40, 1), (40, 8))  # (problems, samples per problem)


def differ_rate(n: int, k: int, effect: float, pairs: int, seed: int = 0) -> float:
    """The share of ``pairs`` simulated pairs (see the module docstring) whose verdict is "differ"."""
    rng = np.random.default_rng(seed)
    cache: dict[tuple[int, ...], bool] = {}  # the verdict depends only on the multiset of differences
    hits = 0
    for _ in range(pairs):
        p = rng.beta(2.0, 2.0, n)
        a, b = rng.binomial(k, np.clip(p + effect, 0.0, 1.0)), rng.binomial(k, p)
        key = tuple(sorted((a - b).tolist()))
        if key not in cache:
            cache[key] = paired_difference(np.array(key) / k, np.zeros(n), k).excludes_zero
        hits += cache[key]
    return hits / pairs


def main(argv: Sequence[str] | None = None) -> int:
    """Print the false "differ" rate (effect 0) and the power at each effect, per configuration."""
    ap = argparse.ArgumentParser(
        prog="python -m rpg_eval.stats.simulate", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--pairs", type=int, default=2000, help="simulated pairs per cell (default 2000)")
    ap.add_argument("--effects", default="0,0.1,0.2", help="true differences of accuracy (default 0,0.1,0.2)")
    a = ap.parse_args(argv)
    effects = [float(x) for x in a.effects.split(",")]
    print("| problems | k | " + " | ".join(f"differ at +{e:g}" for e in effects) + " |")
    print("|---|---|" + "---|" * len(effects))
    for n, k in CONFIGS:
        rates = [differ_rate(n, k, e, a.pairs, seed=i) for i, e in enumerate(effects)]
        print(f"| {n} | {k} | " + " | ".join(f"{100 * r:.1f}%" for r in rates) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
