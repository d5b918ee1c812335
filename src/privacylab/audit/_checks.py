"""One-line ValueErrors for audit configurations."""

from __future__ import annotations

import math
from numbers import Integral, Real


def whole(name: str, value: object, low: int) -> int:
    """`value` as an int >= `low`, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return int(value)


def positive(name: str, value: object) -> float:
    """`value` as a finite float > 0, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number
