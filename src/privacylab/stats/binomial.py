"""Clopper–Pearson (1934) exact binomial confidence bounds. scipy only."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import beta

from privacylab.stats._checks import (
    check_confidence,
    check_counts,
    counts_of_trials,
    unit_open,
)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson (1934) interval for a binomial proportion from k successes in n.

    With α = 1 − confidence: low = Beta⁻¹(α/2; k, n−k+1) (0 when k = 0) and
    high = Beta⁻¹(1−α/2; k+1, n−k) (1 when k = n).
    """
    check_counts(k, n)
    check_confidence(confidence)
    alpha = 1.0 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2.0, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
    return low, high


def clopper_pearson_upper(k: Any, n: Any, confidence: float = 0.95) -> Any:
    """One-sided Clopper–Pearson upper bound Beta⁻¹(confidence; k+1, n−k); 1 when k = n.

    For k = 0 this is 1 − (1 − confidence)^(1/n). Accepts arrays of counts.
    """
    check_confidence(confidence)
    k_arr = np.asarray(k, dtype=np.float64)
    n_arr = np.asarray(n, dtype=np.float64)
    full = k_arr >= n_arr
    with np.errstate(invalid="ignore", divide="ignore"):
        high = beta.ppf(confidence, k_arr + 1.0, np.where(full, 1.0, n_arr - k_arr))
    high = np.where(full, 1.0, high)
    return float(high) if high.ndim == 0 else high


def clopper_pearson_bounds(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Clopper–Pearson (1934) lower and upper bounds on a binomial proportion, each one-sided at
    level α/2, as CLOPPERPEARSONLOWER(·, T, α/2) and CLOPPERPEARSONUPPER(·, T, α/2) in
    Jagielski et al. 2020, Algorithm 2.

    low = Beta⁻¹(α/2; k, n−k+1) (0 when k = 0) and high = Beta⁻¹(1−α/2; k+1, n−k) (1 when
    k = n); together a two-sided interval at confidence 1 − α.
    """
    k, n = counts_of_trials("successes", k, n)
    a = unit_open("alpha", alpha)
    return clopper_pearson(k, n, confidence=1.0 - a)
