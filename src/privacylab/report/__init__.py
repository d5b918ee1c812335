"""Reporting: the one metrics path for membership attacks, plots, JSON results and HTML.

Plots and HTML are imported lazily by their modules (`privacylab.report.plots`,
`privacylab.report.html`) so that computing metrics never loads matplotlib.
"""

from privacylab.report.metrics import (
    MembershipMetrics,
    auc,
    clopper_pearson,
    clopper_pearson_upper,
    epsilon_lower_bound,
    membership_metrics,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)

__all__ = [
    "MembershipMetrics",
    "auc",
    "clopper_pearson",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "membership_metrics",
    "roc_auc",
    "roc_curve",
    "tpr_at_fpr",
]
