"""Gaussian differential privacy: the (ε, δ) curve of μ-GDP (Dong, Roth & Su 2022, "Gaussian
Differential Privacy", Corollary 2.13) and the μ implied by a test's error rates (Nasr et al.
2023, "Tight Auditing of Differentially Private Machine Learning", Sec. 4). scipy only."""

from __future__ import annotations

import math

from scipy.special import log_ndtr, ndtr, ndtri

from privacylab.stats._checks import (
    StatisticsError,
    counts_of_trials,
    largest_true,
    real,
    unit_open,
)
from privacylab.stats.binomial import clopper_pearson_bounds


def gdp_delta(epsilon: float, mu: float) -> float:
    """δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2), Dong, Roth & Su 2022, Corollary 2.13."""
    return float(
        ndtr(-epsilon / mu + mu / 2.0) - math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2.0))
    )


def epsilon_from_gdp_mu(mu: float, delta: float) -> float:
    """ε of μ-GDP at `delta`: the solution of δ = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth &
    Su 2022, "Gaussian Differential Privacy", Corollary 2.13), found by bisection (δ(ε) decreases
    in ε); 0 when δ ≥ δ(0) = 2Φ(μ/2) − 1, inf for μ = inf.

    A Gaussian mechanism with noise multiplier σ is exactly (1/σ)-GDP, so this is its exact ε.
    """
    m = real("mu", mu)
    if m < 0.0:
        raise StatisticsError(f"mu must be >= 0, got {mu!r}")
    d = unit_open("delta", delta)
    if m == 0.0:
        return 0.0
    if math.isinf(m):
        return math.inf
    if gdp_delta(0.0, m) <= d:
        return 0.0
    high = max(1.0, m * m)
    while gdp_delta(high, m) > d:
        high *= 2.0
    return largest_true(lambda e: gdp_delta(e, m) > d, 0.0, high)


def gdp_mu_from_rates(fpr: float, fnr: float) -> float:
    """μ implied by a membership test's error rates under μ-GDP: μ = Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
    (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", Sec. 4; the
    trade-off curve of μ-GDP is FNR = Φ(Φ⁻¹(1 − FPR) − μ), Dong, Roth & Su 2022, Eq. 2.3).

    A test no better than chance (FPR + FNR ≥ 1) gives 0; a perfect one gives inf. Pass rates that
    are already confidence bounds (e.g. Clopper–Pearson upper bounds) to get a lower bound on μ.
    """
    a = real("fpr", fpr)
    b = real("fnr", fnr)
    for name, value in (("fpr", a), ("fnr", b)):
        if not 0.0 <= value <= 1.0:
            raise StatisticsError(f"{name} must be in [0, 1], got {value!r}")
    if a + b >= 1.0:
        return 0.0
    return float(ndtri(1.0 - a) - ndtri(b))


def epsilon_lower_bound_gdp(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Certified ε lower bound under the Gaussian-DP assumption (Nasr et al. 2023, "Tight
    Auditing of Differentially Private Machine Learning", Sec. 4): returns (ε_LB, μ_LB).

    FPR and FNR of a test whose threshold was fixed before the counts are bounded above by
    Clopper–Pearson, each one-sided at (1 − `confidence`)/2 (Bonferroni: both hold together with
    probability ≥ `confidence`); μ_LB = Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi) (Dong, Roth & Su 2022,
    Eq. 2.3) and ε_LB is the ε of μ_LB-GDP at `delta` (Cor. 2.13).

    The bound holds for mechanisms whose trade-off curve is Gaussian, as for DP-SGD without
    sampling (T steps of noise multiplier σ are exactly √T/σ-GDP); for other mechanisms it is an
    estimate, not a certificate.
    """
    fp, n0 = counts_of_trials("false_positives", false_positives, negatives)
    fn, n1 = counts_of_trials("false_negatives", false_negatives, positives)
    level = unit_open("confidence", confidence)
    d = unit_open("delta", delta)
    alpha = 1.0 - level
    fpr_hi = clopper_pearson_bounds(fp, n0, alpha)[1]
    fnr_hi = clopper_pearson_bounds(fn, n1, alpha)[1]
    mu = gdp_mu_from_rates(fpr_hi, fnr_hi)
    return epsilon_from_gdp_mu(mu, d), mu
