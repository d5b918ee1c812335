"""The one-run audit bound of Steinke, Nasr & Jagielski 2023 ("Privacy Auditing with One (1)
Training Run", Theorem 3 and its p-value algorithm). numpy/scipy only."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit
from scipy.stats import binom

from privacylab.stats._checks import (
    StatisticsError,
    count,
    delta_half_open,
    largest_true,
    real,
    unit_open,
)


def _check_guesses(m: object, r: object, v: object) -> tuple[int, int, int]:
    canaries = count("m", m, minimum=1)
    guesses = count("r", r)
    correct = count("v", v)
    if guesses > canaries:
        raise StatisticsError(f"r ({guesses}) guesses exceed the m ({canaries}) canaries")
    if correct > guesses:
        raise StatisticsError(f"v ({correct}) correct guesses exceed the r ({guesses}) guesses")
    return canaries, guesses, correct


def _one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    if v == 0:
        return 1.0
    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0.0:
        return min(tail, 1.0)
    below = binom.pmf(np.arange(v - 1, -1, -1), r, q)
    spread = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * spread, 1.0)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """p-value of v correct guesses out of r under the null "(ε, δ)-DP", Steinke, Nasr &
    Jagielski 2023, "Privacy Auditing with One (1) Training Run", Theorem 3 (its p-value
    algorithm, Sec. 5 / Proposition 5.2).

    m canaries are each included with probability ½; the auditor guesses r of them and v are
    right. With q = e^ε/(1 + e^ε) and W' ~ Binomial(r, q), the bound is

        P[W ≥ v] ≤ P[W' ≥ v] + 2mδ · max_{i=1..v} P[v − i ≤ W' < v] / i,

    which for δ = 0 is the Binomial tail alone. Clipped to 1.
    """
    mm, rr, vv = _check_guesses(m, r, v)
    e = real("epsilon", epsilon)
    if e < 0.0:
        raise StatisticsError(f"epsilon must be >= 0, got {epsilon!r}")
    return _one_run_p_value(mm, rr, vv, e, delta_half_open(delta))


def one_run_epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """Largest ε whose (ε, δ)-DP null is rejected at level 1 − `confidence` by `one_run_p_value`
    (Steinke, Nasr & Jagielski 2023, Theorem 3 and their ε-lower-bound search), by bisection on
    ε (the p-value grows with ε); 0 when even ε = 0 is not rejected.
    """
    mm, rr, vv = _check_guesses(m, r, v)
    d = delta_half_open(delta)
    level = 1.0 - unit_open("confidence", confidence)

    def rejected(epsilon: float) -> bool:
        return _one_run_p_value(mm, rr, vv, epsilon, d) <= level

    if not rejected(0.0):
        return 0.0
    high = 1.0
    while rejected(high):
        high *= 2.0
        if high > 1e6:
            return math.inf
    return largest_true(rejected, 0.0, high)
