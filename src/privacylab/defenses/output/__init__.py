"""Output (post-processing) defences: one module per defence, each registered with
`@register_defense`; every module here is imported by `privacylab.defenses`."""
