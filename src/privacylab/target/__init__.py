"""The threat model: what an attacker may query (labels, scores, logits, white-box), query
budgets, and where output defences and query monitors plug in.

`EmbeddingTarget` (`privacylab.target.embedding`) is exported lazily: it imports the encoder
models, which the other targets do not need."""

from typing import Any

from privacylab.target.access import Access, AccessError, QueryBudgetError, TargetError
from privacylab.target.target import (
    LabelledMonitor,
    OutputDefense,
    Outputs,
    Precision,
    QueryMonitor,
    Target,
)

__all__ = [
    "Access",
    "AccessError",
    "EmbeddingTarget",
    "LabelledMonitor",
    "OutputDefense",
    "Outputs",
    "Precision",
    "QueryBudgetError",
    "QueryMonitor",
    "Target",
    "TargetError",
]


def __getattr__(name: str) -> Any:
    if name == "EmbeddingTarget":
        from privacylab.target.embedding import EmbeddingTarget

        return EmbeddingTarget
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
