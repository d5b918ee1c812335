"""`privacylab attack model inversion` (being written)."""
