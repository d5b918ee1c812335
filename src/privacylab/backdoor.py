"""The backdoor job: `privacylab attack backdoor` and `privacylab defend backdoor` (issue 17)."""
