"""Checks and defences against memorization attacks (issue 18). Placeholder."""
