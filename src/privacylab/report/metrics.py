"""The one metrics path of every membership inference attack.

ROC curve and AUC, TPR at a fixed low FPR (Carlini et al. 2022, "Membership Inference Attacks
From First Principles"), balanced accuracy, membership advantage (Yeom et al. 2018, "Privacy Risk
in Machine Learning: Analyzing the Connection to Overfitting") and the lower bound on ε that an
attack's error rates imply (Kairouz et al. 2015; Jagielski et al. 2020; Nasr et al. 2021).
The statistics themselves live in `privacylab.stats` and are re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from privacylab.stats import (
    StatisticsError,
    auc,
    clopper_pearson,
    clopper_pearson_upper,
    epsilon_from_counts,
    epsilon_lower_bound,
    held_out_epsilon,
    roc_auc,
    roc_counts,
    roc_curve,
    tpr_at_fpr,
)
from privacylab.stats._checks import check_confidence as _check_confidence
from privacylab.stats.roc import check_scores as _check_scores

__all__ = [
    "THRESHOLD_FROM_ATTACK",
    "THRESHOLD_HELD_OUT",
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

THRESHOLD_FROM_ATTACK = "attack"
THRESHOLD_HELD_OUT = "held-out half"


class ScoredResult(Protocol):
    """What the metrics and plots need of an attack's result (`MembershipResult` has it): the
    report depends on this shape, not on the attacks package."""

    attack: str
    access: str
    queries: int
    seconds: float
    scores: np.ndarray
    membership: np.ndarray
    predictions: np.ndarray | None


@dataclass(frozen=True)
class MembershipMetrics:
    """Every number reported about one membership attack on one target.

    `threshold_source` is "attack" when balanced accuracy and the ε bound come from the attack's
    own hard decisions, and "held-out half" when the attack chose no threshold: the ε bound then
    uses a threshold picked on one half of the examples and counted on the other, and balanced
    accuracy is the best over thresholds (optimistic; see `membership_metrics`).
    """

    attack: str
    access: str
    queries: int
    seconds: float
    examples: int
    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float
    balanced_accuracy: float
    advantage: float
    threshold_source: str
    epsilon_lower_bound: float
    confidence: float
    delta: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: NaN and ±inf become None."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def membership_metrics(
    result: ScoredResult, *, delta: float = 1e-5, confidence: float = 0.95
) -> MembershipMetrics:
    """Compute all metrics of one `MembershipResult` on one path.

    - AUC and TPR at 1% and 0.1% FPR from the full ROC curve (Carlini et al. 2022, Sec. 4).
    - Advantage max_t (TPR − FPR) over all thresholds (membership advantage, Yeom et al. 2018).
    - Balanced accuracy and the ε lower bound (`epsilon_lower_bound`, Jagielski et al. 2020):
      when `result.predictions` is given, the attack chose its threshold on other data, and both
      use those decisions (threshold_source "attack"; the bound then holds at `confidence`).
      Otherwise (threshold_source "held-out half") the ε bound is made valid by sample
      splitting: the threshold with the largest bound on a seeded, stratified half of the
      examples is counted on the other half (as the held-out threshold choice of Jagielski et al.
      2020, Sec. 4, and Nasr et al. 2023); balanced accuracy is the best over all thresholds,
      which looks at the truth and is optimistic, as reported by Choquette-Choo et al. 2021.
    """
    if not 0.0 <= delta < 1.0:
        raise StatisticsError(f"delta must be in [0, 1), got {delta}")
    _check_confidence(confidence)
    scores, membership = _check_scores(result.scores, result.membership)
    fps, tps, _ = roc_counts(scores, membership)
    positives = int(tps[-1])
    negatives = int(fps[-1])
    fpr = fps / negatives
    tpr = tps / positives

    if result.predictions is not None:
        pred = np.asarray(result.predictions).reshape(-1)
        if pred.shape != membership.shape or not np.isin(pred, (0, 1)).all():
            raise StatisticsError("predictions must be 0/1 decisions, one per example")
        tp = int(np.sum((pred == 1) & (membership == 1)))
        fp = int(np.sum((pred == 1) & (membership == 0)))
        balanced = 0.5 * (tp / positives + (negatives - fp) / negatives)
        eps_lb = epsilon_lower_bound(
            tp, positives - tp, fp, negatives - fp, delta=delta, confidence=confidence
        )
        source = THRESHOLD_FROM_ATTACK
    else:
        balanced = float(np.max(0.5 * (tpr + 1.0 - fpr)))
        eps_lb = held_out_epsilon(scores, membership, delta=delta, confidence=confidence)
        source = THRESHOLD_HELD_OUT

    return MembershipMetrics(
        attack=str(result.attack),
        access=str(result.access),
        queries=int(result.queries),
        seconds=float(result.seconds),
        examples=int(scores.size),
        auc=auc(fpr, tpr),
        tpr_at_1pct_fpr=tpr_at_fpr(fpr, tpr, 0.01),
        tpr_at_01pct_fpr=tpr_at_fpr(fpr, tpr, 0.001),
        balanced_accuracy=float(balanced),
        advantage=float(np.max(tpr - fpr)),
        threshold_source=source,
        epsilon_lower_bound=eps_lb,
        confidence=float(confidence),
        delta=float(delta),
    )
