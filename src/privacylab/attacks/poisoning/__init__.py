"""Backdoors and poisoning (seed 000): BadNets (`badnets`, Gu et al. 2017), the trojaning
attack (`trojan`, Liu et al. NDSS'18), and targeted poisoning and patch backdoors of
contrastive image–text models (`clip-poison`, `clip-backdoor`, Carlini & Terzis ICLR'22).
Each declares its threat model; one registry (`BACKDOOR_ATTACKS`) holds them all; triggers are
stamped by one rule (`trigger.Trigger`).

Every module of this package is imported on import (`discover`), so an attack registered with
`@register_backdoor` in a new file joins `backdoor_names()` with no other edit.
"""

from privacylab.attacks.poisoning.base import (
    BACKDOOR_ATTACKS,
    MODES,
    SIDE_INFORMATION,
    BackdoorResult,
    DataPoisoningAttack,
    ModelTrojanAttack,
    PoisonError,
    Poisons,
    PoisonTask,
    ProbeOutput,
    ProbeTask,
    TrojanOutput,
    TrojanTask,
    backdoor_class,
    backdoor_names,
    check_poison_rate,
    make_backdoor,
    poison_count,
    predict_labels,
    register_backdoor,
    run_poisoning,
    run_trojan,
    target_labels,
)
from privacylab.attacks.poisoning.trigger import (
    SHAPES,
    Trigger,
    TriggerError,
    parse_trigger,
    shape_mask,
)
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "BACKDOOR_ATTACKS",
    "MODES",
    "SHAPES",
    "SIDE_INFORMATION",
    "BackdoorResult",
    "DataPoisoningAttack",
    "ModelTrojanAttack",
    "PoisonError",
    "PoisonTask",
    "Poisons",
    "ProbeOutput",
    "ProbeTask",
    "Trigger",
    "TriggerError",
    "TrojanOutput",
    "TrojanTask",
    "backdoor_class",
    "backdoor_names",
    "check_poison_rate",
    "make_backdoor",
    "parse_trigger",
    "poison_count",
    "predict_labels",
    "register_backdoor",
    "run_poisoning",
    "run_trojan",
    "shape_mask",
    "target_labels",
]
