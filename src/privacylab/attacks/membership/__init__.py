"""Membership inference attacks: each declares its threat model and returns a MembershipResult.

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_attack` in a new file here joins `attack_names()`, the CLI and — unless its class
sets `in_default_suite = False` — the default suite of `privacylab run`, with no other edit.
"""

from privacylab.attacks.membership.base import (
    ATTACKS,
    AttackScores,
    MembershipAttack,
    MembershipTask,
    attack_aliases,
    attack_class,
    attack_names,
    default_suite,
    make_attack,
    register_attack,
    run_attack,
    subsampled_attacks,
)
from privacylab.attacks.membership.references import reference_keep
from privacylab.attacks.membership.result import AttackError, MembershipResult
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "ATTACKS",
    "AttackError",
    "AttackScores",
    "MembershipAttack",
    "MembershipResult",
    "MembershipTask",
    "attack_aliases",
    "attack_class",
    "attack_names",
    "default_suite",
    "discover",
    "make_attack",
    "reference_keep",
    "register_attack",
    "run_attack",
    "subsampled_attacks",
]
