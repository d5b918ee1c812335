"""Attacks on language models and the shape they share: the language-model instance of the
family-agnostic core (`privacylab.attacks.core`).

Three kinds live in one registry, `LANGUAGE_ATTACKS`, each attack declaring its `kind`:

- "extraction": training text from generations (Carlini et al. 2021, "Extracting Training Data
  from Large Language Models"): sample, rank by a membership metric, keep the top.
- "exposure": how far a planted secret stands out among all candidate secrets (Carlini et al.
  2019, "The Secret Sharer"), from the log-perplexity of each candidate.
- "membership": whether a document was trained on (loss, zlib, reference, lowercase, Min-K%,
  Min-K%++), returning the one `MembershipResult` of membership inference.

Each attack receives a `LanguageTarget` narrowed to its declared access (`scores` for all the
above: Carlini et al.'s black-box adversary computes the probability of any sequence) and a task
holding only what the attacker knows (`SIDE_INFORMATION`); the job attaches the truth from the
`Corpus` afterwards. Scoring goes through `privacylab.attacks.language.scoring`; the formulas
are `privacylab.stats.language`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from privacylab.attacks.core import Attack, ThreatModel
from privacylab.attacks.core import number_option as core_number
from privacylab.attacks.core import whole_option as core_whole
from privacylab.errors import PrivacylabError
from privacylab.registry import Registry

__all__ = [
    "KINDS",
    "LANGUAGE_ATTACKS",
    "SIDE_INFORMATION",
    "LanguageAttack",
    "LanguageError",
    "fraction_option",
    "language_class",
    "language_names",
    "make_language",
    "number_option",
    "register_language",
    "whole_option",
]

KINDS = ("extraction", "exposure", "membership")

SIDE_INFORMATION = ("public-text", "reference-models", "canary-formats")
"""What a language task may give beyond the target: `public-text`, documents the target never
trained on (prefixes for generation, non-member calibration); `reference-models`, smaller
models the attacker owns (white-box), trained on similar data; `canary-formats`, the template
and alphabet of a planted secret (never the secret)."""


class LanguageError(PrivacylabError, ValueError):
    """A language-model attack cannot run with this configuration, target or task; one line."""


def whole_option(attack: str, name: str, value: object, low: int = 1) -> int:
    """`value` as a whole number >= `low`, else a one-line LanguageError (bools refused)."""
    return core_whole(LanguageError, attack, name, value, low)


def number_option(attack: str, name: str, value: object, *, zero: bool = False) -> float:
    """`value` as a finite number > 0 (>= 0 with `zero`), else a one-line LanguageError."""
    return core_number(LanguageError, attack, name, value, zero=zero)


def fraction_option(attack: str, name: str, value: object) -> float:
    """`value` as a fraction in (0, 1], else a one-line LanguageError."""
    number = number_option(attack, name, value)
    if number > 1:
        raise LanguageError(f"{attack}: {name} must be in (0, 1], got {value!r}")
    return number


class LanguageAttack(Attack[Any, Any]):
    """An attack of this family: `kind` says which task it takes ("extraction", "exposure",
    "membership"); `paper` names what it follows."""

    name: ClassVar[str]
    kind: ClassVar[str] = "membership"
    threat_model: ClassVar[ThreatModel]
    paper: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()


LANGUAGE_ATTACKS: Registry[type[LanguageAttack]] = Registry(
    "language-model attack", error=LanguageError
)
"""Every language-model attack class by name (and its aliases), of all kinds."""


def register_language(name: str) -> Callable[[type[LanguageAttack]], type[LanguageAttack]]:
    """Class decorator: make an attack buildable by `make_language(name, **options)`."""

    def decorate(cls: type[LanguageAttack]) -> type[LanguageAttack]:
        if cls.kind not in KINDS:
            raise LanguageError(f"{name}: kind must be one of {', '.join(KINDS)}")
        unknown = set(cls.threat_model.side_information) - set(SIDE_INFORMATION)
        if unknown:
            raise LanguageError(f"{name}: unknown side information {', '.join(sorted(unknown))}")
        cls.name = name
        return LANGUAGE_ATTACKS.register(name, cls, aliases=tuple(getattr(cls, "aliases", ())))

    return decorate


def language_names(kind: str | None = None) -> list[str]:
    """Registered language-model attacks (of `kind`, if given), sorted."""
    return sorted(n for n, c in LANGUAGE_ATTACKS.items() if kind is None or c.kind == kind)


def language_class(name: str, kind: str | None = None) -> type[LanguageAttack]:
    """The class registered as `name`, or LanguageError naming the choices (of `kind`)."""
    if kind is not None and name not in LANGUAGE_ATTACKS:
        raise LanguageError(
            f"unknown {kind} attack {name!r}; choose one of {', '.join(language_names(kind))}"
        )
    cls = LANGUAGE_ATTACKS.get(name)
    if kind is not None and cls.kind != kind:
        raise LanguageError(
            f"{name} is a {cls.kind} attack; choose one of {', '.join(language_names(kind))}"
        )
    return cls


def make_language(name: str, kind: str | None = None, **options: Any) -> LanguageAttack:
    """The registered attack `name` built with `options`, or LanguageError."""
    return language_class(name, kind)(**options)
