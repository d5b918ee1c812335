"""The one metrics path of every membership inference attack.

ROC curve and AUC, TPR at a fixed low FPR (Carlini et al. 2022, "Membership Inference Attacks
From First Principles"), balanced accuracy, membership advantage (Yeom et al. 2018, "Privacy Risk
in Machine Learning: Analyzing the Connection to Overfitting") and the lower bound on ε that an
attack's error rates imply (Kairouz et al. 2015; Jagielski et al. 2020; Nasr et al. 2021).
numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import beta

if TYPE_CHECKING:
    from privacylab.attacks.membership.result import MembershipResult

THRESHOLD_FROM_ATTACK = "attack"
THRESHOLD_HELD_OUT = "held-out half"


def _check_scores(scores: Any, membership: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(membership)
    if s.ndim != 1 or m.ndim != 1:
        raise ValueError(f"scores and membership must be 1-D, got shapes {s.shape} and {m.shape}")
    if s.shape != m.shape:
        raise ValueError(f"{s.size} scores but {m.size} membership labels")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if m.dtype.kind == "f" and np.isnan(m).any():
        raise ValueError("membership labels contain NaN")
    if not np.isin(m, (0, 1)).all():
        raise ValueError("membership labels must be 0 or 1")
    m = m.astype(np.int64)
    members = int(m.sum())
    if members == 0 or members == m.size:
        raise ValueError("membership labels contain one class only; need members and non-members")
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
    s, m = _check_scores(scores, membership)
    fps, tps, thresholds = roc_counts(s, m)
    return fps / fps[-1], tps / tps[-1], thresholds


def auc(fpr: Any, tpr: Any) -> float:
    """Area under a ROC curve by the trapezoidal rule (ties count one half, as Mann–Whitney U)."""
    x = np.asarray(fpr, dtype=np.float64)
    y = np.asarray(tpr, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise ValueError("fpr and tpr must be 1-D arrays of the same length, at least 2 points")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("fpr or tpr contain NaN")
    if (np.diff(x) < 0).any():
        raise ValueError("fpr must be non-decreasing")
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
        raise ValueError(f"target FPR must be in [0, 1], got {target_fpr}")
    x = np.asarray(fpr, dtype=np.float64)
    y = np.asarray(tpr, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError("fpr and tpr must be 1-D arrays of the same, non-zero length")
    ok = x <= target_fpr
    return float(y[ok].max()) if ok.any() else 0.0


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson (1934) interval for a binomial proportion from k successes in n.

    With α = 1 − confidence: low = Beta⁻¹(α/2; k, n−k+1) (0 when k = 0) and
    high = Beta⁻¹(1−α/2; k+1, n−k) (1 when k = n).
    """
    _check_counts(k, n)
    _check_confidence(confidence)
    alpha = 1.0 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2.0, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
    return low, high


def clopper_pearson_upper(k: Any, n: Any, confidence: float = 0.95) -> Any:
    """One-sided Clopper–Pearson upper bound Beta⁻¹(confidence; k+1, n−k); 1 when k = n.

    For k = 0 this is 1 − (1 − confidence)^(1/n). Accepts arrays of counts.
    """
    _check_confidence(confidence)
    k_arr = np.asarray(k, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    full = k_arr >= n_arr
    with np.errstate(invalid="ignore", divide="ignore"):
        high = beta.ppf(confidence, k_arr + 1.0, np.where(full, 1.0, n_arr - k_arr))
    high = np.where(full, 1.0, high)
    return float(high) if high.ndim == 0 else high


def _check_counts(k: int, n: int) -> None:
    if int(k) != k or int(n) != n or n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need integer counts with 0 <= k <= n and n > 0, got k={k}, n={n}")


def epsilon_from_counts(
    tp: np.ndarray,
    fn: np.ndarray,
    fp: np.ndarray,
    tn: np.ndarray,
    delta: float,
    confidence: float,
) -> np.ndarray:
    """`epsilon_lower_bound` for arrays of counts (one bound per element), without the checks."""
    per_bound = 1.0 - (1.0 - confidence) / 2.0
    fpr_hi = np.asarray(clopper_pearson_upper(fp, fp + tn, per_bound), dtype=np.float64)
    fnr_hi = np.asarray(clopper_pearson_upper(fn, fn + tp, per_bound), dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.log(np.maximum(1.0 - delta - fnr_hi, 0.0) / fpr_hi)
        second = np.log(np.maximum(1.0 - delta - fpr_hi, 0.0) / fnr_hi)
    best = np.maximum(
        np.nan_to_num(first, nan=0.0, neginf=0.0), np.nan_to_num(second, nan=0.0, neginf=0.0)
    )
    return np.maximum(best, 0.0)


def held_out_epsilon(
    scores: np.ndarray,
    membership: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    seed: int = 0,
) -> float:
    """ε lower bound of a score-only attack, valid at `confidence`: the threshold is chosen on
    a seeded half of the members and of the non-members (largest bound there), and the
    Clopper–Pearson bound is computed from the other half's counts alone."""
    scores, membership = _check_scores(scores, membership)
    rng = np.random.default_rng(seed)
    choose = np.zeros(scores.size, dtype=bool)
    for side in (0, 1):
        rows = rng.permutation(np.flatnonzero(membership == side))
        choose[rows[: rows.size // 2]] = True
    held = ~choose
    if len(np.unique(membership[choose])) < 2 or len(np.unique(membership[held])) < 2:
        return 0.0
    fps, tps, thresholds = roc_counts(scores[choose], membership[choose])
    pos, neg = int(tps[-1]), int(fps[-1])
    bounds = epsilon_from_counts(tps, pos - tps, fps, neg - fps, delta, confidence)
    best = int(np.argmax(bounds))
    if bounds[best] <= 0.0:
        return 0.0
    guess = scores[held] >= thresholds[best]
    truth = membership[held] == 1
    tp, fp = int(np.sum(guess & truth)), int(np.sum(guess & ~truth))
    return epsilon_lower_bound(
        tp, int(truth.sum()) - tp, fp, int((~truth).sum()) - fp, delta, confidence
    )


def epsilon_lower_bound(
    tp: int, fn: int, fp: int, tn: int, delta: float, confidence: float = 0.95
) -> float:
    """Lower bound on ε implied by a membership test's confusion counts, at `confidence`.

    A mechanism that is (ε, δ)-DP forces every test of "member" against "non-member" to satisfy
    FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ (Kairouz, Oh & Viswanath 2015, Thm 2.1, the
    hypothesis-testing view of DP). Replacing FPR and FNR by one-sided Clopper–Pearson upper
    bounds FPR_hi and FNR_hi gives, as in Jagielski et al. 2020 ("Auditing Differentially Private
    Machine Learning", Thm 2 / Alg. 2) and Nasr et al. 2021,

        ε_LB = max(log((1 − δ − FNR_hi) / FPR_hi), log((1 − δ − FPR_hi) / FNR_hi), 0).

    Both upper bounds are used jointly, so each is taken at level 1 − (1 − confidence)/2
    (Bonferroni); then ε_LB ≤ ε holds with probability at least `confidence` for a test whose
    decision rule was fixed before seeing these counts.
    """
    for name, value in (("tp", tp), ("fn", fn), ("fp", fp), ("tn", tn)):
        if int(value) != value or value < 0:
            raise ValueError(f"{name} must be a non-negative integer count, got {value}")
    if tp + fn == 0 or fp + tn == 0:
        raise ValueError("need at least one member (tp + fn > 0) and one non-member (fp + tn > 0)")
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    _check_confidence(confidence)
    bound = epsilon_from_counts(
        np.asarray(tp), np.asarray(fn), np.asarray(fp), np.asarray(tn), delta, confidence
    )
    return float(bound)


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
    result: MembershipResult, *, delta: float = 1e-5, confidence: float = 0.95
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
        raise ValueError(f"delta must be in [0, 1), got {delta}")
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
            raise ValueError("predictions must be 0/1 decisions, one per example")
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
