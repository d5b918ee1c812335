"""privacylab: train, attack, audit, defend and report on the privacy of ML models."""

__version__ = "0.1.0"
