"""Tests of the audit statistics layer (Jagielski et al. 2020; Dong, Roth & Su 2022;
Nasr et al. 2023; Steinke, Nasr & Jagielski 2023)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom, norm

from privacylab.accounting import Gaussian, make_accountant
from privacylab.audit import (
    clopper_pearson_bounds,
    epsilon_from_gdp_mu,
    epsilon_lower_bound_gdp,
    epsilon_lower_bound_poisoning,
    gdp_mu_from_rates,
    one_run_epsilon_lower_bound,
    one_run_p_value,
)
from privacylab.report.metrics import clopper_pearson

# --- Clopper–Pearson -------------------------------------------------------------------------


def test_clopper_pearson_bounds_are_one_sided_at_half_alpha() -> None:
    low, high = clopper_pearson_bounds(30, 100, 0.1)
    assert binom.sf(29, 100, low) == pytest.approx(0.05, rel=1e-6)
    assert binom.cdf(30, 100, high) == pytest.approx(0.05, rel=1e-6)
    assert clopper_pearson_bounds(0, 10, 0.1)[0] == 0.0
    assert clopper_pearson_bounds(10, 10, 0.1)[1] == 1.0


# --- poisoning audit (Jagielski et al. 2020, Alg. 2) -----------------------------------------


def test_poisoning_closed_form_is_log_ratio() -> None:
    p0 = clopper_pearson(900, 1000, 0.95)[0]
    p1 = clopper_pearson(100, 1000, 0.95)[1]
    assert epsilon_lower_bound_poisoning(900, 100, 1000, 1000) == math.log(p0 / p1)


def test_poisoning_unequal_trials_and_alpha() -> None:
    p0 = clopper_pearson(450, 500, 0.99)[0]
    p1 = clopper_pearson(30, 800, 0.99)[1]
    got = epsilon_lower_bound_poisoning(450, 30, 500, 800, alpha=0.01)
    assert got == pytest.approx(math.log(p0 / p1), rel=1e-12)


def test_poisoning_group_privacy_divides_by_k_without_delta() -> None:
    one = epsilon_lower_bound_poisoning(950, 20, 1000, 1000)
    for k in (2, 4, 8):
        assert epsilon_lower_bound_poisoning(950, 20, 1000, 1000, k=k) == pytest.approx(one / k)


def test_poisoning_delta_makes_bound_smaller_and_solves_the_equality() -> None:
    p0 = clopper_pearson(950, 1000, 0.95)[0]
    p1 = clopper_pearson(20, 1000, 0.95)[1]
    base = epsilon_lower_bound_poisoning(950, 20, 1000, 1000, k=3)
    previous = base
    for delta in (1e-5, 1e-3, 1e-2, 0.1):
        eps = epsilon_lower_bound_poisoning(950, 20, 1000, 1000, k=3, delta=delta)
        assert 0.0 < eps < previous
        factor = math.expm1(3 * eps) / math.expm1(eps)
        assert math.exp(3 * eps) * p1 + delta * factor == pytest.approx(p0, rel=1e-9)
        previous = eps
    assert epsilon_lower_bound_poisoning(950, 20, 1000, 1000, delta=0.95) == 0.0


def test_poisoning_no_signal_gives_zero() -> None:
    assert epsilon_lower_bound_poisoning(50, 50, 100, 100) == 0.0
    assert epsilon_lower_bound_poisoning(0, 0, 100, 100) == 0.0
    assert epsilon_lower_bound_poisoning(10, 90, 100, 100) == 0.0


def test_poisoning_two_sided_catches_reverse_direction_and_pays_bonferroni() -> None:
    assert epsilon_lower_bound_poisoning(20, 950, 1000, 1000) == 0.0
    reverse = epsilon_lower_bound_poisoning(20, 950, 1000, 1000, two_sided=True)
    forward = epsilon_lower_bound_poisoning(950, 20, 1000, 1000, two_sided=True)
    assert reverse == pytest.approx(forward)
    assert 0.0 < forward < epsilon_lower_bound_poisoning(950, 20, 1000, 1000)
    assert forward == pytest.approx(epsilon_lower_bound_poisoning(950, 20, 1000, 1000, alpha=0.025))


@settings(max_examples=40, deadline=None)
@given(
    c0=st.integers(0, 200),
    c1=st.integers(0, 200),
    step=st.integers(1, 50),
    delta=st.sampled_from([0.0, 1e-5, 1e-2]),
    k=st.integers(1, 4),
)
def test_poisoning_monotone_in_counts(c0: int, c1: int, step: int, delta: float, k: int) -> None:
    n = 300
    base = epsilon_lower_bound_poisoning(c0, c1, n, n, k=k, delta=delta)
    assert base >= 0.0
    assert epsilon_lower_bound_poisoning(c0 + step, c1, n, n, k=k, delta=delta) >= base
    assert epsilon_lower_bound_poisoning(c0, c1 + step, n, n, k=k, delta=delta) <= base


@pytest.mark.parametrize("two_sided", [False, True])
def test_poisoning_soundness_simulation(two_sided: bool) -> None:
    epsilon, trials, reps = 1.0, 300, 300
    p1 = 0.1
    p0 = math.exp(epsilon) * p1
    rng = np.random.default_rng(2020)
    c0 = rng.binomial(trials, p0, size=reps)
    c1 = rng.binomial(trials, p1, size=reps)
    bounds = [
        epsilon_lower_bound_poisoning(int(a), int(b), trials, trials, two_sided=two_sided)
        for a, b in zip(c0, c1, strict=True)
    ]
    assert np.mean(np.asarray(bounds) > epsilon) <= 0.05 + 0.03
    assert np.median(bounds) > 0.3


# --- GDP (Dong, Roth & Su 2022; Nasr et al. 2023) --------------------------------------------


@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.0, 5.0])
def test_gdp_matches_exact_gaussian_from_pld(sigma: float) -> None:
    delta = 1e-5
    ours = epsilon_from_gdp_mu(1.0 / sigma, delta)
    pld = make_accountant("pld").compose(Gaussian(noise_multiplier=sigma)).epsilon(delta)
    assert ours <= pld * (1 + 1e-9)
    assert ours == pytest.approx(pld, rel=1e-3)


def test_gdp_curve_round_trip() -> None:
    for mu in (0.3, 1.0, 2.5):
        for delta in (1e-6, 1e-3, 0.05):
            eps = epsilon_from_gdp_mu(mu, delta)
            back = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
            assert back == pytest.approx(delta, rel=1e-6)
    assert epsilon_from_gdp_mu(0.0, 1e-5) == 0.0
    assert epsilon_from_gdp_mu(0.1, 0.5) == 0.0
    assert epsilon_from_gdp_mu(math.inf, 1e-5) == math.inf


def test_gdp_mu_from_rates_round_trip() -> None:
    for mu in (0.2, 1.0, 3.0):
        for fpr in (1e-3, 0.05, 0.3):
            fnr = norm.cdf(norm.ppf(1 - fpr) - mu)
            assert gdp_mu_from_rates(fpr, fnr) == pytest.approx(mu, rel=1e-9)
    assert gdp_mu_from_rates(0.5, 0.5) == 0.0
    assert gdp_mu_from_rates(0.0, 1.0) == 0.0
    assert gdp_mu_from_rates(0.0, 0.0) == math.inf


@settings(max_examples=30, deadline=None)
@given(mu=st.floats(0.05, 5.0), d1=st.floats(1e-8, 0.5), d2=st.floats(1e-8, 0.5))
def test_gdp_epsilon_monotone(mu: float, d1: float, d2: float) -> None:
    lo, hi = sorted((d1, d2))
    assert epsilon_from_gdp_mu(mu, lo) >= epsilon_from_gdp_mu(mu, hi)
    assert epsilon_from_gdp_mu(mu * 1.5, lo) >= epsilon_from_gdp_mu(mu, lo)


def test_gdp_bound_is_the_mu_of_the_clopper_pearson_upper_rates() -> None:
    fp, n0, fn, n1 = 300, 1000, 250, 1000
    _, fpr_hi = clopper_pearson_bounds(fp, n0, 0.05)
    _, fnr_hi = clopper_pearson_bounds(fn, n1, 0.05)
    mu = norm.ppf(1 - fpr_hi) - norm.ppf(fnr_hi)
    eps, mu_lb = epsilon_lower_bound_gdp(fp, n0, fn, n1, 1e-5, 0.95)
    assert mu_lb == pytest.approx(mu, rel=1e-9)
    assert eps == pytest.approx(epsilon_from_gdp_mu(mu, 1e-5), rel=1e-9)
    assert mu_lb < gdp_mu_from_rates(fp / n0, fn / n1)
    assert epsilon_lower_bound_gdp(500, 1000, 500, 1000, 1e-5) == (0.0, 0.0)


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.0])
def test_gdp_bound_soundness_simulation(mu: float) -> None:
    """Coverage: with Gaussian scores (exactly μ-GDP) the certified μ_LB exceeds μ in at most
    α of repeated audits (Bonferroni makes it conservative)."""
    rng = np.random.default_rng(7)
    n, reps, threshold = 400, 2000, mu / 2
    fp = rng.binomial(n, norm.sf(threshold), size=reps)
    fn = rng.binomial(n, norm.cdf(threshold - mu), size=reps)
    over = [epsilon_lower_bound_gdp(a, n, b, n, 1e-5)[1] > mu for a, b in zip(fp, fn, strict=True)]
    assert np.mean(over) <= 0.05
    assert np.mean(over) > 0.0 or mu < 0.5  # not vacuous: the bound comes near μ


# --- one-run audit (Steinke, Nasr & Jagielski 2023) ------------------------------------------


def test_one_run_p_value_closed_form_without_delta() -> None:
    for r, v, eps in ((100, 80, 1.0), (500, 300, 0.5), (50, 50, 3.0), (10, 0, 1.0)):
        q = math.exp(eps) / (1 + math.exp(eps))
        assert one_run_p_value(1000, r, v, eps) == pytest.approx(binom.sf(v - 1, r, q), rel=1e-12)


def test_one_run_delta_term() -> None:
    m, r, v, eps, delta = 1000, 100, 80, 1.0, 1e-5
    q = math.exp(eps) / (1 + math.exp(eps))
    spread = max(sum(binom.pmf(v - j, r, q) for j in range(1, i + 1)) / i for i in range(1, v + 1))
    expected = binom.sf(v - 1, r, q) + 2 * m * delta * spread
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(expected, rel=1e-9)
    assert one_run_p_value(m, r, v, eps, 0.4) == 1.0
    assert one_run_epsilon_lower_bound(m, r, v, 1e-5) < one_run_epsilon_lower_bound(m, r, v)


@settings(max_examples=40, deadline=None)
@given(
    r=st.integers(1, 300),
    frac=st.floats(0.0, 1.0),
    e1=st.floats(0.0, 6.0),
    e2=st.floats(0.0, 6.0),
    delta=st.sampled_from([0.0, 1e-6]),
)
def test_one_run_monotone(r: int, frac: float, e1: float, e2: float, delta: float) -> None:
    v = round(frac * r)
    lo, hi = sorted((e1, e2))
    assert one_run_p_value(2 * r, r, v, hi, delta) >= one_run_p_value(2 * r, r, v, lo, delta)
    bound = one_run_epsilon_lower_bound(2 * r, r, v, delta)
    if v < r:
        assert one_run_epsilon_lower_bound(2 * r, r, v + 1, delta) >= bound


def test_one_run_chance_accuracy_gives_zero() -> None:
    assert one_run_epsilon_lower_bound(2000, 1000, 500) == 0.0
    assert one_run_epsilon_lower_bound(200, 100, 50, delta=1e-5) == 0.0


def test_one_run_bound_is_valid_and_grows_with_perfect_guesses() -> None:
    bounds = [one_run_epsilon_lower_bound(10_000, r, r) for r in (10, 100, 1000, 10_000)]
    assert all(b2 > b1 for b1, b2 in itertools.pairwise(bounds))
    for r, bound in zip((10, 100, 1000, 10_000), bounds, strict=True):
        assert one_run_p_value(10_000, r, r, bound) <= 0.05
        assert one_run_p_value(10_000, r, r, bound * (1 + 1e-6) + 1e-9) > 0.05


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_one_run_soundness_simulation(delta: float) -> None:
    epsilon, m, reps, confidence = 1.0, 200, 200, 0.95
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    rng = np.random.default_rng(2023)
    included = rng.random((reps, m)) < 0.5
    correct = rng.random((reps, m)) < q
    guesses = np.where(correct, included, ~included)
    v = (guesses == included).sum(axis=1)
    bounds = np.array([one_run_epsilon_lower_bound(m, m, int(x), delta, confidence) for x in v])
    assert np.mean(bounds > epsilon) <= (1 - confidence) + 0.03
    assert np.median(bounds) > 0.3


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: clopper_pearson_bounds(-1, 10, 0.05), "count"),
        (lambda: clopper_pearson_bounds(11, 10, 0.05), "exceeds"),
        (lambda: clopper_pearson_bounds(3, 10, 1.0), "alpha"),
        (lambda: epsilon_lower_bound_poisoning(float("nan"), 1, 10, 10), "D0"),
        (lambda: epsilon_lower_bound_poisoning(1, -1, 10, 10), "D1"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 0, 10), "trials"),
        (lambda: epsilon_lower_bound_poisoning(1.5, 1, 10, 10), "integer"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, k=0), "k"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, delta=1.0), "delta"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, delta=-0.1), "delta"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, delta=float("nan")), "NaN"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, alpha=0.0), "alpha"),
        (lambda: epsilon_lower_bound_poisoning(1, 1, 10, 10, two_sided="yes"), "two_sided"),
        (lambda: epsilon_from_gdp_mu(-1.0, 1e-5), "mu"),
        (lambda: epsilon_from_gdp_mu(float("nan"), 1e-5), "NaN"),
        (lambda: epsilon_from_gdp_mu(1.0, 0.0), "delta"),
        (lambda: epsilon_from_gdp_mu(1.0, 1.0), "delta"),
        (lambda: gdp_mu_from_rates(1.5, 0.1), "fpr"),
        (lambda: gdp_mu_from_rates(0.1, float("nan")), "NaN"),
        (lambda: epsilon_lower_bound_gdp(11, 10, 1, 10, 1e-5), "exceeds"),
        (lambda: epsilon_lower_bound_gdp(1, 10, 1, 10, 1e-5, confidence=1.0), "confidence"),
        (lambda: one_run_p_value(10, 11, 5, 1.0), "exceed"),
        (lambda: one_run_p_value(10, 5, 6, 1.0), "exceed"),
        (lambda: one_run_p_value(0, 0, 0, 1.0), "m"),
        (lambda: one_run_p_value(10, 5, 3, -1.0), "epsilon"),
        (lambda: one_run_p_value(10, 5, 3, 1.0, delta=1.0), "delta"),
        (lambda: one_run_epsilon_lower_bound(10, 5, 3, confidence=1.0), "confidence"),
        (lambda: one_run_epsilon_lower_bound(10, 5, 3, confidence=float("nan")), "NaN"),
    ],
)
def test_bad_input_is_one_line_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
