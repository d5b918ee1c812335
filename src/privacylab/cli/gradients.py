"""`privacylab attack gradients` (being written)."""
