"""Reporting: the one metrics path for membership attacks, plots, JSON results and HTML.

Plots and HTML are imported lazily by their modules (`privacylab.report.plots`,
`privacylab.report.html`) so that computing metrics never loads matplotlib. The statistics
live in `privacylab.stats`; the report depends on an attack's result only through the
`ScoredResult` protocol, never on `privacylab.attacks`.
"""

from privacylab.report.metrics import (
    MembershipMetrics,
    ScoredResult,
    auc,
    clopper_pearson,
    clopper_pearson_upper,
    epsilon_from_counts,
    epsilon_lower_bound,
    held_out_epsilon,
    membership_metrics,
    roc_auc,
    roc_counts,
    roc_curve,
    tpr_at_fpr,
)

__all__ = [
    "MembershipMetrics",
    "ScoredResult",
    "auc",
    "clopper_pearson",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_lower_bound",
    "held_out_epsilon",
    "membership_metrics",
    "roc_auc",
    "roc_counts",
    "roc_curve",
    "tpr_at_fpr",
]
