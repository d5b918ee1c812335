"""Lower bounds on ε from the error rates of a membership (or distinguishing) test.

The hypothesis-testing view of DP (Kairouz, Oh & Viswanath 2015, Thm 2.1) with Clopper–Pearson
bounds on the error rates (Jagielski, Ullman & Oprea 2020, "Auditing Differentially Private
Machine Learning: How Private is Private SGD?", Alg. 2 / Thm 2; Nasr et al. 2021), a held-out
threshold choice, and group privacy over k poisoned points (Vadhan 2017, Lemma 2.2).
numpy/scipy only.
"""

from __future__ import annotations

import math

import numpy as np

from privacylab.stats._checks import (
    StatisticsError,
    check_confidence,
    count,
    counts_of_trials,
    delta_half_open,
    largest_true,
    real,
    unit_open,
)
from privacylab.stats.binomial import clopper_pearson, clopper_pearson_upper
from privacylab.stats.roc import check_scores, roc_counts


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
            raise StatisticsError(f"{name} must be a non-negative integer count, got {value}")
    if tp + fn == 0 or fp + tn == 0:
        raise StatisticsError(
            "need at least one member (tp + fn > 0) and one non-member (fp + tn > 0)"
        )
    if not 0.0 <= delta < 1.0:
        raise StatisticsError(f"delta must be in [0, 1), got {delta}")
    check_confidence(confidence)
    bound = epsilon_from_counts(
        np.asarray(tp), np.asarray(fn), np.asarray(fp), np.asarray(tn), delta, confidence
    )
    return float(bound)


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
    Clopper–Pearson bound is computed from the other half's counts alone (the held-out threshold
    choice of Jagielski et al. 2020, Sec. 4)."""
    scores, membership = check_scores(scores, membership)
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


def group_delta_factor(epsilon: float, k: int) -> float:
    """(e^{kε} − 1)/(e^ε − 1) = Σ_{i<k} e^{iε}, the δ multiplier of group privacy over k
    records (Vadhan 2017, Lemma 2.2); k at ε = 0."""
    if epsilon == 0.0 or k == 1:
        return float(k)
    return float(np.sum(np.exp(epsilon * np.arange(k))))


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(kε, δ·Σ_{i<k} e^{iε}): the guarantee an (ε, δ)-DP mechanism gives groups of k records
    (Vadhan 2017, Lemma 2.2)."""
    eps = real_nonnegative(epsilon)
    group = count("k", k, minimum=1)
    d = delta_half_open(delta)
    return group * eps, d * group_delta_factor(eps, group)


def real_nonnegative(epsilon: object) -> float:
    """ε as a float >= 0, or StatisticsError."""
    e = real("epsilon", epsilon)
    if e < 0.0:
        raise StatisticsError(f"epsilon must be >= 0, got {epsilon!r}")
    return e


def _poisoning_bound(p0: float, p1: float, k: int, delta: float) -> float:
    if p0 <= 0.0 or p0 <= p1:
        return 0.0
    log_ratio = math.log(p0 / p1)
    if delta == 0.0:
        return log_ratio / k
    if p0 <= p1 + k * delta:
        return 0.0

    def refuted(epsilon: float) -> bool:
        return p0 > math.exp(k * epsilon) * p1 + delta * group_delta_factor(epsilon, k)

    return largest_true(refuted, 0.0, log_ratio / k)


def epsilon_lower_bound_poisoning(
    count_d0: int,
    count_d1: int,
    trials_d0: int,
    trials_d1: int,
    *,
    k: int = 1,
    delta: float = 0.0,
    alpha: float = 0.05,
    two_sided: bool = False,
) -> float:
    """ε lower bound of a poisoning audit, Jagielski et al. 2020, Algorithm 2 / Theorem 2.

    The test "the backdoor fires" succeeded `count_d0` times in `trials_d0` models trained on D0
    (with the k poisoned points) and `count_d1` times in `trials_d1` models trained on D1
    (without them). With p̂0 = CLOPPERPEARSONLOWER(count_d0, trials_d0, α/2) and
    p̂1 = CLOPPERPEARSONUPPER(count_d1, trials_d1, α/2), an (ε, δ)-DP training algorithm obeys,
    by group privacy over k points (Lemma 1; δ_k the geometric sum of Vadhan 2017, Lemma 2.2),

        p0 ≤ e^{kε}·p1 + δ·(e^{kε} − 1)/(e^ε − 1),

    so with probability ≥ 1 − α every ε for which p̂0 exceeds the right-hand side is refuted.
    The sup of those ε is returned (0 when none): ln(p̂0/p̂1)/k exactly when δ = 0 (for k = 1 this
    is Algorithm 2's ε_LB), otherwise the root of the equality found by bisection on
    [0, ln(p̂0/p̂1)/k] (the right-hand side increases in ε).

    `two_sided=True` also runs the test with the roles of D0 and D1 swapped (DP bounds the ratio
    both ways) and returns the larger bound; each direction is then given α/2 (Bonferroni, so
    each Clopper–Pearson bound is one-sided at α/4) and the result still holds at 1 − α.
    """
    c0, t0 = counts_of_trials("D0", count_d0, trials_d0)
    c1, t1 = counts_of_trials("D1", count_d1, trials_d1)
    group = count("k", k, minimum=1)
    d = delta_half_open(delta)
    a = unit_open("alpha", alpha)
    if not isinstance(two_sided, bool):
        raise StatisticsError(f"two_sided must be True or False, got {two_sided!r}")
    per_direction = a / 2.0 if two_sided else a
    bound = _poisoning_bound(
        clopper_pearson(c0, t0, 1.0 - per_direction)[0],
        clopper_pearson(c1, t1, 1.0 - per_direction)[1],
        group,
        d,
    )
    if two_sided:
        swapped = _poisoning_bound(
            clopper_pearson(c1, t1, 1.0 - per_direction)[0],
            clopper_pearson(c0, t0, 1.0 - per_direction)[1],
            group,
            d,
        )
        bound = max(bound, swapped)
    return float(bound)
