"""Ghost clipping: per-example gradient norms from activations and output gradients, with an
exact per-layer fallback for layers without a rule and tied weights summed per example."""

from privacylab.training.dp.ghost.clipper import (
    CallProbe,
    GhostClipping,
    ghost_layers,
    probe_batch_first,
    probe_calls,
)
from privacylab.training.dp.ghost.fallback import fallback_check, per_example_gradients
from privacylab.training.dp.ghost.registry import (
    LayerCall,
    LayerGradients,
    register_rule,
    registered_layer_types,
    rule_for,
)
from privacylab.training.dp.ghost.rules import PerExampleGradients

__all__ = [
    "CallProbe",
    "GhostClipping",
    "LayerCall",
    "LayerGradients",
    "PerExampleGradients",
    "fallback_check",
    "ghost_layers",
    "per_example_gradients",
    "probe_batch_first",
    "probe_calls",
    "register_rule",
    "registered_layer_types",
    "rule_for",
]
