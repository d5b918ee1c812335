"""The backdoor section of the report page (issue 17)."""
