"""The memorization report section renderer (issue 18). Placeholder."""
