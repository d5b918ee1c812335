"""The memorization report section (issue 18). Placeholder."""
