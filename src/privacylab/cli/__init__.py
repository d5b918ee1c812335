"""The `privacylab` command line: one typer app whose sub-commands mirror the packages.

Every command prints its result on stdout (one JSON object with
`--json`), progress and notes on stderr, and answers bad input with exit code 2 and exactly one
`error: ...` line on stderr.
"""

from privacylab.cli import (  # noqa: F401  (register commands)
    account,
    attack,
    audit,
    backdoor,
    defend,
    dpforward,
    embedding,
    exposure,
    extraction,
    gradients,
    lm,
    lm_extraction,
    lm_membership,
    memorization,
    model_inversion,
    property_inference,
    run,
    train,
    watermark,
)
from privacylab.cli._common import BAD_INPUT, app

__all__ = ["BAD_INPUT", "app"]
