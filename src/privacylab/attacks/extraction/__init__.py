"""Model extraction attacks: each declares its threat model, counts its queries and returns
`Stolen`; `run_extraction` compares the copy with the victim (`ExtractionResult`).

Every module of this package (and of `relu/`) is imported on import (`discover`), so an
attack registered with `@register_extraction` in a new file joins `extraction_names()` and the
CLI with no other edit.
"""

from privacylab.attacks.extraction.base import (
    EXTRACTION_ATTACKS,
    SIDE_INFORMATION,
    CurvePoint,
    ExtractionAttack,
    ExtractionError,
    ExtractionResult,
    ExtractionTask,
    Layer,
    Stolen,
    Truth,
    agreement,
    extraction_class,
    extraction_names,
    layers_module,
    make_extraction,
    predicted_labels,
    register_extraction,
    relu_layers,
    run_extraction,
)
from privacylab.registry import discover

discover(__name__)

__all__ = [
    "EXTRACTION_ATTACKS",
    "SIDE_INFORMATION",
    "CurvePoint",
    "ExtractionAttack",
    "ExtractionError",
    "ExtractionResult",
    "ExtractionTask",
    "Layer",
    "Stolen",
    "Truth",
    "agreement",
    "extraction_class",
    "extraction_names",
    "layers_module",
    "make_extraction",
    "predicted_labels",
    "register_extraction",
    "relu_layers",
    "run_extraction",
]
