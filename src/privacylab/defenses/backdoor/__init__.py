"""Defences that find and remove backdoors (seed 000, "Possible Defenses"; BackdoorBench's
defence suite): Neural Cleanse (Wang et al. 2019), STRIP (Gao et al. 2019), activation
clustering (Chen et al. 2019), spectral signatures (Tran et al. 2018), fine-pruning (Liu,
Dolan-Gavitt & Garg 2018), and DP-SGD as a poisoning defence with its group-privacy bound.

Every module of this package is imported on import (`discover`), so a defence registered with
`@register_backdoor_defense` in a new file joins `backdoor_defense_names()` with no other edit.
"""

from privacylab.defenses.backdoor.base import (
    BACKDOOR_DEFENSES,
    EVIDENCE,
    BackdoorDefense,
    BackdoorDefenseError,
    BackdoorEvidence,
    Detection,
    Mitigation,
    backdoor_defense_names,
    evaluate_mitigation,
    feature_layer,
    layer_activations,
    make_backdoor_defense,
    register_backdoor_defense,
)
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "BACKDOOR_DEFENSES",
    "EVIDENCE",
    "BackdoorDefense",
    "BackdoorDefenseError",
    "BackdoorEvidence",
    "Detection",
    "Mitigation",
    "backdoor_defense_names",
    "evaluate_mitigation",
    "feature_layer",
    "layer_activations",
    "make_backdoor_defense",
    "register_backdoor_defense",
]
