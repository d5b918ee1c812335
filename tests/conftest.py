"""Test-wide settings: hypothesis runs the same examples every time, so CI is reproducible."""

from hypothesis import settings

settings.register_profile("privacylab", derandomize=True, print_blob=True)
settings.load_profile("privacylab")
