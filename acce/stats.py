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
