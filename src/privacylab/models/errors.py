"""The one exception the models package raises for bad input."""

from __future__ import annotations

from privacylab.errors import PrivacylabError


class ModelError(PrivacylabError, ValueError):
    """A model cannot be built, saved or loaded as asked; the message is one line."""
