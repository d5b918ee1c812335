"""`privacylab attack memorization` (issue 18). Placeholder."""
