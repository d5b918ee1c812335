"""The threat model: what an attacker may query (labels, scores, logits, white-box), query
budgets, and where output defences and query monitors plug in."""

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
    "LabelledMonitor",
    "OutputDefense",
    "Outputs",
    "Precision",
    "QueryBudgetError",
    "QueryMonitor",
    "Target",
    "TargetError",
]
