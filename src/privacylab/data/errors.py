"""The one exception the data package raises for bad input."""

from __future__ import annotations

from privacylab.errors import PrivacylabError


class DataError(PrivacylabError, ValueError):
    """A dataset cannot be loaded, split or modified as asked; the message is one line."""
