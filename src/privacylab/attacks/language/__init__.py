"""Attacks on language models: training-data extraction (Carlini et al. 2021), exposure of
planted secrets (Carlini et al. 2019) and LM membership inference (loss, zlib, reference,
lowercase, Min-K%, Min-K%++). Each declares its threat model; one registry
(`LANGUAGE_ATTACKS`) holds all three kinds.

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_language` in a new file joins `language_names()` and the CLI with no other edit.
"""

from privacylab.attacks.language.base import (
    KINDS,
    LANGUAGE_ATTACKS,
    SIDE_INFORMATION,
    LanguageAttack,
    LanguageError,
    language_class,
    language_names,
    make_language,
    register_language,
)
from privacylab.attacks.language.scoring import TextScores, score_texts
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "KINDS",
    "LANGUAGE_ATTACKS",
    "SIDE_INFORMATION",
    "LanguageAttack",
    "LanguageError",
    "TextScores",
    "language_class",
    "language_names",
    "make_language",
    "register_language",
    "score_texts",
]
