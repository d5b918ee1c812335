"""The backdoor part of a report folder (issue 17)."""
