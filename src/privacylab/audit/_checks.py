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


def finite(name: str, value: object) -> float:
    """`value` as a finite float, or ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


def confidence_level(value: object) -> float:
    """The confidence of an audit's bound: a number in (0, 1), or ValueError."""
    level = finite("confidence", value)
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {value!r}")
    return level
