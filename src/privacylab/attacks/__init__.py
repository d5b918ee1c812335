"""Attacks on trained models; each family is a sub-package."""
