"""Statistics that turn audit outcomes into empirical lower bounds on ε.

- Clopper–Pearson bounds and the poisoning-audit ε lower bound of Jagielski, Ullman & Oprea
  2020 ("Auditing Differentially Private Machine Learning: How Private is Private SGD?",
  Algorithm 2 / Theorem 2), extended to δ > 0 and to k poisoned points by group privacy.
- The (ε, δ) curve of μ-GDP (Dong, Roth & Su 2022, "Gaussian Differential Privacy",
  Corollary 2.13) and the μ implied by an attack's error rates (Nasr et al. 2023, "Tight Auditing
  of Differentially Private Machine Learning", Sec. 4).
- The one-run audit of Steinke, Nasr & Jagielski 2023 ("Privacy Auditing with One (1) Training
  Run", Theorem 3 and its p-value algorithm).

Every returned ε is a lower bound: bisections return the end of their bracket that is certain
to satisfy the refuting inequality. numpy/scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Integral, Real

import numpy as np
from scipy.special import expit, log_ndtr, ndtr, ndtri
from scipy.stats import binom

from privacylab.report.metrics import clopper_pearson

__all__ = [
    "clopper_pearson_bounds",
    "epsilon_from_gdp_mu",
    "epsilon_lower_bound_gdp",
    "epsilon_lower_bound_poisoning",
    "gdp_mu_from_rates",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
]

_BISECTION_STEPS = 200


def _count(name: str, value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    number = float(value)
    if math.isnan(number) or not number.is_integer() or number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{name} is NaN")
    return number


def _unit_open(name: str, value: object) -> float:
    number = _real(name, value)
    if not 0.0 < number < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return number


def _delta_half_open(value: object) -> float:
    number = _real("delta", value)
    if not 0.0 <= number < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {value!r}")
    return number


def _counts_of_trials(name: str, count: object, trials: object) -> tuple[int, int]:
    n = _count(f"trials of {name}", trials, minimum=1)
    k = _count(f"count of {name}", count)
    if k > n:
        raise ValueError(f"count of {name} ({k}) exceeds its trials ({n})")
    return k, n


def _largest_true(holds: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection for a monotone predicate with holds(low) and not holds(high): returns a point
    where it holds, within float resolution of the switch."""
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        if mid <= low or mid >= high:
            break
        if holds(mid):
            low = mid
        else:
            high = mid
    return low


def clopper_pearson_bounds(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Clopper–Pearson (1934) lower and upper bounds on a binomial proportion, each one-sided at
    level α/2, as CLOPPERPEARSONLOWER(·, T, α/2) and CLOPPERPEARSONUPPER(·, T, α/2) in
    Jagielski et al. 2020, Algorithm 2.

    low = Beta⁻¹(α/2; k, n−k+1) (0 when k = 0) and high = Beta⁻¹(1−α/2; k+1, n−k) (1 when
    k = n); together a two-sided interval at confidence 1 − α.
    """
    k, n = _counts_of_trials("successes", k, n)
    a = _unit_open("alpha", alpha)
    return clopper_pearson(k, n, confidence=1.0 - a)


def _group_delta_factor(epsilon: float, k: int) -> float:
    """(e^{kε} − 1)/(e^ε − 1) = Σ_{i<k} e^{iε}, the δ multiplier of group privacy; k at ε = 0."""
    if epsilon == 0.0 or k == 1:
        return float(k)
    return float(np.sum(np.exp(epsilon * np.arange(k))))


def _poisoning_bound(p0: float, p1: float, k: int, delta: float) -> float:
    if p0 <= 0.0 or p0 <= p1:
        return 0.0
    log_ratio = math.log(p0 / p1)
    if delta == 0.0:
        return log_ratio / k
    if p0 <= p1 + k * delta:
        return 0.0

    def refuted(epsilon: float) -> bool:
        return p0 > math.exp(k * epsilon) * p1 + delta * _group_delta_factor(epsilon, k)

    return _largest_true(refuted, 0.0, log_ratio / k)


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
    c0, t0 = _counts_of_trials("D0", count_d0, trials_d0)
    c1, t1 = _counts_of_trials("D1", count_d1, trials_d1)
    group = _count("k", k, minimum=1)
    d = _delta_half_open(delta)
    a = _unit_open("alpha", alpha)
    if not isinstance(two_sided, bool):
        raise ValueError(f"two_sided must be True or False, got {two_sided!r}")
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


def _gdp_delta(epsilon: float, mu: float) -> float:
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
    m = _real("mu", mu)
    if m < 0.0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    d = _unit_open("delta", delta)
    if m == 0.0:
        return 0.0
    if math.isinf(m):
        return math.inf
    if _gdp_delta(0.0, m) <= d:
        return 0.0
    high = max(1.0, m * m)
    while _gdp_delta(high, m) > d:
        high *= 2.0
    return _largest_true(lambda e: _gdp_delta(e, m) > d, 0.0, high)


def gdp_mu_from_rates(fpr: float, fnr: float) -> float:
    """μ implied by a membership test's error rates under μ-GDP: μ = Φ⁻¹(1 − FPR) − Φ⁻¹(FNR)
    (Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", Sec. 4; the
    trade-off curve of μ-GDP is FNR = Φ(Φ⁻¹(1 − FPR) − μ), Dong, Roth & Su 2022, Eq. 2.3).

    A test no better than chance (FPR + FNR ≥ 1) gives 0; a perfect one gives inf. Pass rates that
    are already confidence bounds (e.g. Clopper–Pearson upper bounds) to get a lower bound on μ.
    """
    a = _real("fpr", fpr)
    b = _real("fnr", fnr)
    for name, value in (("fpr", a), ("fnr", b)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")
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
    fp, n0 = _counts_of_trials("false_positives", false_positives, negatives)
    fn, n1 = _counts_of_trials("false_negatives", false_negatives, positives)
    level = _unit_open("confidence", confidence)
    d = _unit_open("delta", delta)
    alpha = 1.0 - level
    fpr_hi = clopper_pearson_bounds(fp, n0, alpha)[1]
    fnr_hi = clopper_pearson_bounds(fn, n1, alpha)[1]
    mu = gdp_mu_from_rates(fpr_hi, fnr_hi)
    return epsilon_from_gdp_mu(mu, d), mu


def _check_guesses(m: object, r: object, v: object) -> tuple[int, int, int]:
    canaries = _count("m", m, minimum=1)
    guesses = _count("r", r)
    correct = _count("v", v)
    if guesses > canaries:
        raise ValueError(f"r ({guesses}) guesses exceed the m ({canaries}) canaries")
    if correct > guesses:
        raise ValueError(f"v ({correct}) correct guesses exceed the r ({guesses}) guesses")
    return canaries, guesses, correct


def _one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    if v == 0:
        return 1.0
    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0.0:
        return min(tail, 1.0)
    below = binom.pmf(np.arange(v - 1, -1, -1), r, q)
    spread = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * spread, 1.0)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """p-value of v correct guesses out of r under the null "(ε, δ)-DP", Steinke, Nasr &
    Jagielski 2023, "Privacy Auditing with One (1) Training Run", Theorem 3 (its p-value
    algorithm, Sec. 5 / Proposition 5.2).

    m canaries are each included with probability ½; the auditor guesses r of them and v are
    right. With q = e^ε/(1 + e^ε) and W' ~ Binomial(r, q), the bound is

        P[W ≥ v] ≤ P[W' ≥ v] + 2mδ · max_{i=1..v} P[v − i ≤ W' < v] / i,

    which for δ = 0 is the Binomial tail alone. Clipped to 1.
    """
    mm, rr, vv = _check_guesses(m, r, v)
    e = _real("epsilon", epsilon)
    if e < 0.0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return _one_run_p_value(mm, rr, vv, e, _delta_half_open(delta))


def one_run_epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """Largest ε whose (ε, δ)-DP null is rejected at level 1 − `confidence` by `one_run_p_value`
    (Steinke, Nasr & Jagielski 2023, Theorem 3 and their ε-lower-bound search), by bisection on
    ε (the p-value grows with ε); 0 when even ε = 0 is not rejected.
    """
    mm, rr, vv = _check_guesses(m, r, v)
    d = _delta_half_open(delta)
    level = 1.0 - _unit_open("confidence", confidence)

    def rejected(epsilon: float) -> bool:
        return _one_run_p_value(mm, rr, vv, epsilon, d) <= level

    if not rejected(0.0):
        return 0.0
    high = 1.0
    while rejected(high):
        high *= 2.0
        if high > 1e6:
            return math.inf
    return _largest_true(rejected, 0.0, high)
