"""Errors raised by the DP-SGD engine; each message is one line meant for the user."""

from __future__ import annotations

import math

from privacylab.errors import PrivacylabError


class DPSGDError(PrivacylabError, ValueError):
    """A DP-SGD setting or model is unusable; the message says which and why."""


class GhostClippingError(DPSGDError):
    """Ghost clipping cannot handle this model (a layer without a rule, tied weights, ...)."""


def check_count(name: str, value: object) -> int:
    """``value`` as a whole number >= 1, or DPSGDError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DPSGDError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def check_number(name: str, value: object, *, positive: bool) -> float:
    """``value`` as a finite float that is > 0 (``positive``) or >= 0, or DPSGDError."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DPSGDError(f"{name} must be a number, got {value!r}") from None
    too_small = number <= 0 if positive else number < 0
    if isinstance(value, bool) or not math.isfinite(number) or too_small:
        bound = "> 0" if positive else ">= 0"
        raise DPSGDError(f"{name} must be a finite number {bound}, got {value!r}")
    return number
