"""Defences against membership inference: output post-processors and training-time defences,
one small module each behind `OutputDefense` / `TrainingDefense` (`privacylab.defenses.base`);
watches on the query stream against model extraction (query budgets, PRADA) behind
`QueryDefense`; ownership watermarks (`privacylab.defenses.watermark`).

Every module of `privacylab.defenses.output`, `.training` and `.query` is imported
here, so a defence registered with `@register_defense` in a new file there joins
`defense_names()`, `parse_defense`, the CLI and the contract tests with no other edit.
"""

from privacylab.defenses.base import (
    DEFENSES,
    Defense,
    DefenseData,
    DefenseError,
    Fitted,
    ModelBuilder,
    NoDefense,
    OutputDefense,
    Parameter,
    QueryDefense,
    TrainingDefense,
    defense_names,
    make_defense,
    parse_defense,
    parse_defenses,
    register_defense,
)
from privacylab.registry import discover

discover("privacylab.defenses.output")
discover("privacylab.defenses.training")
discover("privacylab.defenses.query")

__all__ = [
    "DEFENSES",
    "Defense",
    "DefenseData",
    "DefenseError",
    "Fitted",
    "ModelBuilder",
    "NoDefense",
    "OutputDefense",
    "Parameter",
    "QueryDefense",
    "TrainingDefense",
    "defense_names",
    "make_defense",
    "parse_defense",
    "parse_defenses",
    "register_defense",
]
