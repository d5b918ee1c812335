"""Memorization attacks (seed 004; Song, Ristenpart & Shmatikov, "Machine Learning Models that
Remember Too Much", CCS 2017): training code that hides its training data in the model —
least significant bits (`lsb`), correlated value encoding (`correlation`), sign encoding
(`sign`) — or in its answers to chosen synthetic inputs (`capacity`). Each declares its threat
model; one registry (`MEMORIZATION_ATTACKS`) holds them all.

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_memorization` in a new file joins `memorization_names()` with no other edit.
"""

from privacylab.attacks.memorization.base import (
    KINDS,
    MEMORIZATION_ATTACKS,
    Decoded,
    MaliciousTraining,
    MemorizationAttack,
    MemorizationError,
    MemorizationResult,
    MemorizationTask,
    Secret,
    SecretLayout,
    channel_bits,
    choose_secret,
    load_parameter_vector,
    make_memorization,
    memorization_class,
    memorization_names,
    parameter_count,
    parameter_vector,
    register_memorization,
    run_memorization,
)
from privacylab.attacks.memorization.training import train_encoded, train_honest
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "KINDS",
    "MEMORIZATION_ATTACKS",
    "Decoded",
    "MaliciousTraining",
    "MemorizationAttack",
    "MemorizationError",
    "MemorizationResult",
    "MemorizationTask",
    "Secret",
    "SecretLayout",
    "channel_bits",
    "choose_secret",
    "load_parameter_vector",
    "make_memorization",
    "memorization_class",
    "memorization_names",
    "parameter_count",
    "parameter_vector",
    "register_memorization",
    "run_memorization",
    "train_encoded",
    "train_honest",
]
