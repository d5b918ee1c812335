"""Argument checks shared by the statistics: one-line `StatisticsError`s for bad input."""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

from privacylab.errors import PrivacylabError

BISECTION_STEPS = 200


class StatisticsError(PrivacylabError, ValueError):
    """Bad input to a statistic (NaN, counts out of range, a level outside (0, 1))."""


def check_confidence(confidence: float) -> None:
    """StatisticsError unless 0 < confidence < 1."""
    if not 0.0 < confidence < 1.0:
        raise StatisticsError(f"confidence must be in (0, 1), got {confidence}")


def check_counts(k: int, n: int) -> None:
    """StatisticsError unless k and n are integers with 0 <= k <= n and n > 0."""
    if int(k) != k or int(n) != n or n <= 0 or not 0 <= k <= n:
        raise StatisticsError(f"need integer counts with 0 <= k <= n and n > 0, got k={k}, n={n}")


def count(name: str, value: object, *, minimum: int = 0) -> int:
    """`value` as an int >= `minimum`, or StatisticsError."""
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise StatisticsError(f"{name} must be an integer, got {value!r}")
    number = float(value)
    if math.isnan(number) or not number.is_integer() or number < minimum:
        raise StatisticsError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def real(name: str, value: object) -> float:
    """`value` as a float that is not NaN, or StatisticsError."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise StatisticsError(f"{name} must be a real number, got {value!r}")
    number = float(value)
    if math.isnan(number):
        raise StatisticsError(f"{name} is NaN")
    return number


def unit_open(name: str, value: object) -> float:
    """`value` in (0, 1), or StatisticsError."""
    number = real(name, value)
    if not 0.0 < number < 1.0:
        raise StatisticsError(f"{name} must be in (0, 1), got {value!r}")
    return number


def delta_half_open(value: object) -> float:
    """δ in [0, 1), or StatisticsError."""
    number = real("delta", value)
    if not 0.0 <= number < 1.0:
        raise StatisticsError(f"delta must be in [0, 1), got {value!r}")
    return number


def counts_of_trials(name: str, k: object, trials: object) -> tuple[int, int]:
    """(k, n) with 0 <= k <= n and n >= 1, or StatisticsError."""
    n = count(f"trials of {name}", trials, minimum=1)
    c = count(f"count of {name}", k)
    if c > n:
        raise StatisticsError(f"count of {name} ({c}) exceeds its trials ({n})")
    return c, n


def largest_true(holds: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection for a monotone predicate with holds(low) and not holds(high): returns a point
    where it holds, within float resolution of the switch."""
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if mid <= low or mid >= high:
            break
        if holds(mid):
            low = mid
        else:
            high = mid
    return low
