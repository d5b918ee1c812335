"""Reconstruction attacks: training data from federated updates (DLG, iDLG, Inverting
Gradients, analytic), class representatives from a model (MI-Face), properties of the
training set (property inference). Each declares its threat model; one registry
(`INVERSION_ATTACKS`) holds all three kinds.

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_inversion` in a new file joins `inversion_names()` and the CLI with no other edit.
"""

from privacylab.attacks.inversion.base import (
    INVERSION_ATTACKS,
    KINDS,
    SIDE_INFORMATION,
    GradientAttack,
    GradientTask,
    GradientTruth,
    InversionAttack,
    InversionError,
    Reconstruction,
    ReconstructionResult,
    inversion_class,
    inversion_names,
    make_inversion,
    non_smooth_layer,
    register_inversion,
    replay,
    run_reconstruction,
)
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "INVERSION_ATTACKS",
    "KINDS",
    "SIDE_INFORMATION",
    "GradientAttack",
    "GradientTask",
    "GradientTruth",
    "InversionAttack",
    "InversionError",
    "Reconstruction",
    "ReconstructionResult",
    "inversion_class",
    "inversion_names",
    "make_inversion",
    "non_smooth_layer",
    "register_inversion",
    "replay",
    "run_reconstruction",
]
