"""`privacylab attack embedding`: inversion, attribute inference, membership (placeholder)."""
