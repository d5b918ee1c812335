"""Membership inference attacks: each declares its access and returns a MembershipResult."""

from privacylab.attacks.membership import (  # noqa: F401  (register the attacks)
    boundary,
    label_only,
    lira,
    metric,
    rmia,
    shadow,
)
from privacylab.attacks.membership.base import (
    AttackScores,
    MembershipAttack,
    MembershipTask,
    attack_names,
    make_attack,
    register_attack,
    run_attack,
)
from privacylab.attacks.membership.result import AttackError, MembershipResult

__all__ = [
    "AttackError",
    "AttackScores",
    "MembershipAttack",
    "MembershipResult",
    "MembershipTask",
    "attack_names",
    "make_attack",
    "register_attack",
    "run_attack",
]
