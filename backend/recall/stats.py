"""Paired statistics: the exact two-sided McNemar test and a percentile bootstrap CI of a mean."""
from __future__ import annotations

from math import comb

import numpy as np


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b (A right, B wrong) and c (A wrong,
    B right): a binomial test of min(b, c) in b + c trials at p = 1/2, doubled, capped at 1."""
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be >= 0")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def paired_table(a: list[bool], b: list[bool]) -> dict:
    """The 2x2 agreement table of two paired lists of outcomes, and McNemar's p."""
    if len(a) != len(b):
        raise ValueError("paired outcomes must have the same length")
    both = sum(x and y for x, y in zip(a, b))
    a_only = sum(x and not y for x, y in zip(a, b))
    b_only = sum(y and not x for x, y in zip(a, b))
    neither = len(a) - both - a_only - b_only
    return {"n": len(a), "both": both, "a_only": a_only, "b_only": b_only, "neither": neither,
            "p_mcnemar": mcnemar_exact(a_only, b_only)}


def bootstrap_ci(values, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (resampling the paired differences). Seeded."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
