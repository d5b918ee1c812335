"""Ghost clipping: per-example gradient norms from activations and output gradients."""

from privacylab.training.dp.ghost.clipper import GhostClipping, ghost_layers
from privacylab.training.dp.ghost.registry import (
    LayerCall,
    LayerGradients,
    register_rule,
    registered_layer_types,
    rule_for,
)
from privacylab.training.dp.ghost.rules import PerExampleGradients

__all__ = [
    "GhostClipping",
    "LayerCall",
    "LayerGradients",
    "PerExampleGradients",
    "ghost_layers",
    "register_rule",
    "registered_layer_types",
    "rule_for",
]
