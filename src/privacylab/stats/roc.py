"""ROC curves of membership scores, AUC and TPR at a fixed low FPR (Carlini et al. 2022,
"Membership Inference Attacks From First Principles", Sec. 4). numpy only."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privacylab.stats._checks import StatisticsError


def check_scores(scores: Any, membership: Any) -> tuple[np.ndarray, np.ndarray]:
    """Scores as float64 and membership as int64 0/1 arrays of one length with both classes
    present, or StatisticsError."""
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(membership)
    if s.ndim != 1 or m.ndim != 1:
        raise StatisticsError(
            f"scores and membership must be 1-D, got shapes {s.shape} and {m.shape}"
        )
    if s.shape != m.shape:
        raise StatisticsError(f"{s.size} scores but {m.size} membership labels")
    if np.isnan(s).any():
        raise StatisticsError("scores contain NaN")
    if m.dtype.kind == "f" and np.isnan(m).any():
        raise StatisticsError("membership labels contain NaN")
    if not np.isin(m, (0, 1)).all():
        raise StatisticsError("membership labels must be 0 or 1")
    m = m.astype(np.int64)
    members = int(m.sum())
    if members == 0 or members == m.size:
        raise StatisticsError(
            "membership labels contain one class only; need members and non-members"
        )
    return s, m


def roc_counts(
    scores: np.ndarray, membership: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """False and true positive counts at every distinct threshold, highest threshold first."""
    order = np.argsort(scores, kind="mergesort")[::-1]
    s = scores[order]
    y = membership[order]
    last_of_run = np.flatnonzero(s[1:] != s[:-1])
    idx = np.r_[last_of_run, y.size - 1]
    tps = np.cumsum(y)[idx]
    fps = 1 + idx - tps
    return (
        np.r_[0, fps].astype(np.int64),
        np.r_[0, tps].astype(np.int64),
        np.r_[np.inf, s[idx]],
    )


def roc_curve(scores: Any, membership: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve of the decision rule "member if score >= threshold".

    Returns `(fpr, tpr, thresholds)` with one point per distinct score (tied scores form one
    point), preceded by the point (0, 0) at threshold +inf — the same points as
    `sklearn.metrics.roc_curve(..., drop_intermediate=False)`. Infinite scores are allowed.
    """
    s, m = check_scores(scores, membership)
    fps, tps, thresholds = roc_counts(s, m)
    return fps / fps[-1], tps / tps[-1], thresholds


def auc(fpr: Any, tpr: Any) -> float:
    """Area under a ROC curve by the trapezoidal rule (ties count one half, as Mann–Whitney U)."""
    x = np.asarray(fpr, dtype=np.float64)
    y = np.asarray(tpr, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise StatisticsError(
            "fpr and tpr must be 1-D arrays of the same length, at least 2 points"
        )
    if np.isnan(x).any() or np.isnan(y).any():
        raise StatisticsError("fpr or tpr contain NaN")
    if (np.diff(x) < 0).any():
        raise StatisticsError("fpr must be non-decreasing")
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def roc_auc(scores: Any, membership: Any) -> float:
    """AUC of the ROC curve of `scores` against the truth `membership`."""
    fpr, tpr, _ = roc_curve(scores, membership)
    return auc(fpr, tpr)


def tpr_at_fpr(fpr: Any, tpr: Any, target_fpr: float) -> float:
    """The largest TPR among ROC points whose FPR is at most `target_fpr`.

    This is the low-FPR metric of Carlini et al. 2022 ("Membership Inference Attacks From First
    Principles", Sec. 4): the true positive rate an attacker reaches while wrongly accusing at
    most a `target_fpr` fraction of non-members. No interpolation between points is done.
    """
    if not 0.0 <= target_fpr <= 1.0 or math.isnan(target_fpr):
        raise StatisticsError(f"target FPR must be in [0, 1], got {target_fpr}")
    x = np.asarray(fpr, dtype=np.float64)
    y = np.asarray(tpr, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise StatisticsError("fpr and tpr must be 1-D arrays of the same, non-zero length")
    ok = x <= target_fpr
    return float(y[ok].max()) if ok.any() else 0.0
