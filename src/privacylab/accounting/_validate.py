"""Argument checks shared by the accountants: one clear line for every bad value."""

from __future__ import annotations

import math

from privacylab.errors import PrivacylabError


class PrivacyParameterError(PrivacylabError, ValueError):
    """A privacy parameter is outside its domain; the message is one line for the user."""


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise PrivacyParameterError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(number):
        raise PrivacyParameterError(f"{name} must be a number, got NaN")
    return number


def positive(name: str, value: object) -> float:
    """Return `value` as a finite float > 0, or raise PrivacyParameterError."""
    number = _as_float(name, value)
    if not math.isfinite(number) or number <= 0:
        raise PrivacyParameterError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def nonnegative(name: str, value: object) -> float:
    """Return `value` as a finite float >= 0, or raise PrivacyParameterError."""
    number = _as_float(name, value)
    if not math.isfinite(number) or number < 0:
        raise PrivacyParameterError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def sample_rate(value: object, name: str = "sample rate") -> float:
    """Return a sampling probability in (0, 1], or raise PrivacyParameterError."""
    number = _as_float(name, value)
    if not (0.0 < number <= 1.0):
        raise PrivacyParameterError(f"{name} must be in (0, 1], got {value!r}")
    return number


def delta(value: object, name: str = "delta") -> float:
    """Return δ in (0, 1), or raise PrivacyParameterError."""
    number = _as_float(name, value)
    if not (0.0 < number < 1.0):
        raise PrivacyParameterError(f"{name} must be in (0, 1), got {value!r}")
    return number


def count(value: object, name: str = "steps") -> int:
    """Return a whole number >= 1, or raise PrivacyParameterError."""
    if isinstance(value, bool):
        raise PrivacyParameterError(f"{name} must be a whole number >= 1, got {value!r}")
    number = _as_float(name, value)
    if not math.isfinite(number) or number < 1 or number != int(number):
        raise PrivacyParameterError(f"{name} must be a whole number >= 1, got {value!r}")
    return int(number)
