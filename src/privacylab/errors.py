"""The root of every error privacylab raises for bad input or a refused request.

`PrivacylabError` sits at the bottom of the import graph (it imports nothing), so every package,
`accounting` included, derives its own errors from it; the command line maps any of them to exit
code 2 and one `error: ...` line.
"""

from __future__ import annotations


class PrivacylabError(Exception):
    """Bad input, an unsupported request or a refused query: the caller can fix it."""
