"""Defences a federated client applies to its update (`privacylab.federated.ClientDefense`):
Gaussian and Laplace noise, gradient pruning, fp16 and int8 quantisation (Zhu et al. 2019,
Sec. 5) and DP-SGD in the client's local training (Abadi et al. 2016, Alg. 1).

Built from the CLI's spelling with `parse_update_defense("noise:1e-2")` (None for "none").
Every module of this package is imported here, so a class registered with
`@register_update_defense` in a new file joins `UPDATE_DEFENSES` with no other edit.
"""

from privacylab.defenses.update.base import (
    UPDATE_DEFENSES,
    UpdateDefense,
    check_update,
    make_update_defense,
    parse_update_defense,
    register_update_defense,
    update_defense_names,
)
from privacylab.registry import discover

discover("privacylab.defenses.update")

__all__ = [
    "UPDATE_DEFENSES",
    "UpdateDefense",
    "check_update",
    "make_update_defense",
    "parse_update_defense",
    "register_update_defense",
    "update_defense_names",
]
