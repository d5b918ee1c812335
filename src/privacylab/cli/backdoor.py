"""`privacylab attack backdoor` and `privacylab defend backdoor`."""
