"""The memorization job: `privacylab attack memorization` (issue 18). Placeholder."""
