"""The one exception the models package raises for bad input."""

from __future__ import annotations


class ModelError(ValueError):
    """A model cannot be built, saved or loaded as asked; the message is one line."""
