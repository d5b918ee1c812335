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


MIN_NOISE_MULTIPLIER = 1e-6
MAX_NOISE_MULTIPLIER = 1e6
"""Noise multipliers the accountants take: below 1e-6 ε is astronomically large (and 1/σ²
overflows near 1e-154), above 1e6 ε is 0 to double precision (and σ² overflows near 1e154)."""

MAX_TARGET_EPSILON = 1e4
"""Largest target ε that noise calibration and the step budget search for."""

MAX_STEPS = 10**12
"""Largest number of composed steps accounted."""


def noise_multiplier(value: object, name: str = "noise multiplier") -> float:
    """Return σ in [1e-6, 1e6], or raise PrivacyParameterError."""
    number = positive(name, value)
    if not MIN_NOISE_MULTIPLIER <= number <= MAX_NOISE_MULTIPLIER:
        raise PrivacyParameterError(
            f"{name} must be in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}], got {value!r}"
        )
    return number


def target_epsilon(value: object, name: str = "target epsilon") -> float:
    """Return a target ε in (0, 1e4], or raise PrivacyParameterError."""
    number = positive(name, value)
    if number > MAX_TARGET_EPSILON:
        raise PrivacyParameterError(
            f"{name} must be at most {MAX_TARGET_EPSILON:g} (larger budgets mean no privacy), "
            f"got {value!r}"
        )
    return number


def steps(value: object, name: str = "steps") -> int:
    """Return a step count in [1, 1e12], or raise PrivacyParameterError."""
    number = count(value, name)
    if number > MAX_STEPS:
        raise PrivacyParameterError(f"{name} must be at most {MAX_STEPS:g}, got {value!r}")
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
