"""Errors raised by the DP-SGD engine; each message is one line meant for the user."""

from __future__ import annotations


class DPSGDError(ValueError):
    """A DP-SGD setting or model is unusable; the message says which and why."""


class GhostClippingError(DPSGDError):
    """Ghost clipping cannot handle this model (a layer without a rule, tied weights, ...)."""
