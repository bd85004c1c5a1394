"""Small statistics used in reports: Wilson intervals for success rates (every rate is reported with n and a CI)."""
from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % (z=1.96) Wilson score interval for a binomial proportion; (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def format_rate(successes: int, n: int) -> str:
    lo, hi = wilson_interval(successes, n)
    return f"{successes / max(n, 1):6.1%} [{lo:5.1%}, {hi:5.1%}] n={n}"


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
"""Student t 97.5 % quantiles for 1..20 degrees of freedom (a table: scipy is not a dependency of acce)"""


def seed_interval(rates: list[float]) -> tuple[float, float, list[float] | None]:
    """(mean, standard deviation, 95 % t interval) of per-seed rates: seeds are the independent units (episodes of one
    seed share its policy and its evaluation layouts, so pooling them overstates what is known). The interval is
    mean ± t(0.975, n-1) · sd / sqrt(n), clipped to [0, 1]; None below two seeds (JSON has no NaN). Beyond 21 seeds
    the normal 1.96."""
    n = len(rates)
    if n == 0:
        raise ValueError("seed_interval needs at least one per-seed rate")
    mean = sum(rates) / n
    if n < 2:
        return mean, 0.0, None
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    half = (T975[n - 2] if n - 1 <= len(T975) else 1.96) * sd / math.sqrt(n)
    return mean, sd, [max(0.0, mean - half), min(1.0, mean + half)]
