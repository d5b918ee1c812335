"""`privacylab attack property` (being written)."""
