"""k-ary randomized response and its unbiased frequency estimator.

Warner 1965; k-ary form of Kairouz, Bonawitz & Ramage 2016 ("Discrete distribution estimation
under local privacy") and Wang, Blocki, Li & Jha 2017 ("Locally differentially private protocols
for frequency estimation", direct encoding).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from privacylab.accounting import _validate as check
from privacylab.accounting.events import EventLedger, RandomizedResponse
from privacylab.mechanisms._checks import generator


def _categories(k: object) -> int:
    count = check.count(k, "number of categories k")
    if count < 2:
        raise check.PrivacyParameterError(f"number of categories k must be >= 2, got {count}")
    return count


def _labels(name: str, values: ArrayLike, k: int) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind == "b" or array.dtype.kind not in "iuf":
        raise check.PrivacyParameterError(f"{name} must be integers in [0, {k}), got {array.dtype}")
    whole = array.dtype.kind != "f" or bool((np.isfinite(array) & (array == np.round(array))).all())
    if not whole:
        raise check.PrivacyParameterError(f"{name} must be integers in [0, {k})")
    if array.size and (array.min() < 0 or array.max() >= k):
        raise check.PrivacyParameterError(
            f"{name} must be integers in [0, {k}), got values in [{array.min()}, {array.max()}]"
        )
    return array.astype(np.int64)


def rr_keep_probability(epsilon: float, k: int) -> float:
    """p = e^ε / (e^ε + k − 1): chance that k-ary RR reports the true value.

    Every other value is reported with probability 1 / (e^ε + k − 1), so the ratio is e^ε and the
    mechanism is ε-LDP (Wang et al. 2017, Eq. (2); Kairouz et al. 2016, Eq. (7)).
    """
    epsilon = check.positive("epsilon", epsilon)
    k = _categories(k)
    return 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))


def randomized_response(
    values: ArrayLike,
    epsilon: float,
    k: int,
    rng: np.random.Generator | int,
    *,
    ledger: EventLedger | None = None,
) -> np.ndarray:
    """Report each value in [0, k) truthfully w.p. p = `rr_keep_probability(ε, k)`, else a
    uniformly random *other* value (Wang et al. 2017, direct encoding). Shape is kept.

    With a `ledger`, the call is recorded as one `RandomizedResponse(ε, k)` event: each
    individual's value is randomised once (one value per individual; a call that reports
    several values of one individual is several releases and must be recorded as such)."""
    k = _categories(k)
    p = rr_keep_probability(epsilon, k)
    truth = _labels("values", values, k)
    gen = generator(rng)
    keep = gen.random(truth.shape) < p
    other = gen.integers(0, k - 1, size=truth.shape)
    other = other + (other >= truth)
    if ledger is not None:
        ledger.record(RandomizedResponse(epsilon=float(epsilon), k=k))
    return np.where(keep, truth, other)


def rr_estimate_frequencies(reports: ArrayLike, epsilon: float, k: int) -> np.ndarray:
    """Unbiased estimate of the fraction of each value 0..k−1 from k-ary RR reports.

    f̂_v = (c_v / n − q) / (p − q), with p = e^ε/(e^ε + k − 1), q = 1/(e^ε + k − 1) and c_v the
    count of reports equal to v (Wang et al. 2017, Eq. (3); Kairouz et al. 2016). The estimates
    sum to 1 but may be negative.
    """
    k = _categories(k)
    p = rr_keep_probability(epsilon, k)
    observed = _labels("reports", reports, k).ravel()
    if observed.size == 0:
        raise check.PrivacyParameterError("reports must not be empty")
    q = (1.0 - p) / (k - 1)
    share = np.bincount(observed, minlength=k) / observed.size
    return (share - q) / (p - q)
