from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.accounting.gdp import gaussian_delta
from privacylab.mechanisms import (
    add_gaussian_noise,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_epsilon_for,
)

mpmath.mp.dps = 50


def brute_force_sigma(epsilon: float, delta: float, iterations: int = 200) -> float:
    """Independent oracle: bisection on σ of the high-precision δ(ε) (Balle & Wang 2018, Thm 8)."""
    e, d = mpmath.mpf(epsilon), mpmath.mpf(delta)

    def excess(sigma: mpmath.mpf) -> mpmath.mpf:
        m = 1 / sigma
        return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2) - d

    lo, hi = mpmath.mpf("1e-6"), mpmath.mpf("1e6")
    for _ in range(iterations):
        mid = mpmath.sqrt(lo * hi)
        lo, hi = (lo, mid) if excess(mid) <= 0 else (mid, hi)
    return float(hi)


def test_classic_formula() -> None:
    assert classic_gaussian_sigma(0.5, 1e-5, 2.0) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-15
    )


def test_classic_refuses_epsilon_at_least_one() -> None:
    with pytest.raises(PrivacyParameterError, match="analytic_gaussian_sigma"):
        classic_gaussian_sigma(1.0, 1e-5)


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.1, 1e-5), (1.0, 1e-5), (3.0, 1e-10), (10.0, 1e-3), (0.5, 0.3)]
)
def test_analytic_matches_brute_force_bisection(epsilon: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(epsilon, delta)
    truth = brute_force_sigma(epsilon, delta)
    assert truth <= sigma <= truth * (1 + 1e-10)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-8)])
def test_analytic_matches_dp_accounting(epsilon: float, delta: float) -> None:
    from dp_accounting.pld import common
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    reference = GaussianPrivacyLoss.from_privacy_guarantee(
        common.DifferentialPrivacyParameters(epsilon, delta)
    ).standard_deviation
    assert analytic_gaussian_sigma(epsilon, delta) == pytest.approx(reference, rel=1e-5)


@settings(max_examples=50, deadline=None)
@given(
    epsilon=st.floats(1e-3, 50.0),
    log10_delta=st.floats(-200.0, -0.5),
    sensitivity=st.floats(1e-3, 1e3),
)
def test_analytic_is_the_tight_root(epsilon: float, log10_delta: float, sensitivity: float) -> None:
    delta = 10.0**log10_delta
    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    assert gaussian_delta(epsilon, sensitivity / sigma) <= delta
    assert gaussian_delta(epsilon, sensitivity / (sigma * (1 - 1e-10))) > delta
    unit = analytic_gaussian_sigma(epsilon, delta)
    assert sigma == pytest.approx(sensitivity * unit, rel=1e-11)


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(1e-2, 20.0),
    log10_delta=st.floats(-30.0, -1.0),
    factor=st.floats(1.01, 3.0),
)
def test_analytic_decreases_in_epsilon_and_delta(epsilon, log10_delta, factor) -> None:
    delta = 10.0**log10_delta
    sigma = analytic_gaussian_sigma(epsilon, delta)
    assert analytic_gaussian_sigma(epsilon * factor, delta) < sigma
    assert analytic_gaussian_sigma(epsilon, min(delta * factor, 0.99)) < sigma


@settings(max_examples=40, deadline=None)
@given(epsilon=st.floats(1e-3, 0.999), log10_delta=st.floats(-50.0, -1.0))
def test_classic_is_never_tighter_than_analytic(epsilon: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    assert classic_gaussian_sigma(epsilon, delta) >= analytic_gaussian_sigma(epsilon, delta)


def test_epsilon_for_inverts_analytic_sigma() -> None:
    for epsilon, delta, sensitivity in [(0.3, 1e-5, 1.0), (2.0, 1e-9, 0.1), (8.0, 1e-3, 5.0)]:
        sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
        eps = gaussian_epsilon_for(sigma, delta, sensitivity)
        assert eps <= epsilon
        assert eps == pytest.approx(epsilon, rel=1e-9)


def test_noise_is_seeded_and_has_the_right_scale() -> None:
    value = np.zeros((200, 100))
    first = add_gaussian_noise(value, 2.0, 7)
    again = add_gaussian_noise(value, 2.0, np.random.default_rng(7))
    assert first.shape == value.shape
    np.testing.assert_array_equal(first, again)
    assert first.std() == pytest.approx(2.0, rel=0.03)
    assert abs(first.mean()) < 0.05
    assert add_gaussian_noise(3.0, 1.0, 0).shape == ()


@pytest.mark.parametrize(
    "call",
    [
        lambda: analytic_gaussian_sigma(0.0, 1e-5),
        lambda: analytic_gaussian_sigma(1.0, 0.0),
        lambda: analytic_gaussian_sigma(1.0, 1.0),
        lambda: analytic_gaussian_sigma(float("nan"), 1e-5),
        lambda: analytic_gaussian_sigma(1.0, 1e-5, sensitivity=-1.0),
        lambda: classic_gaussian_sigma(-0.5, 1e-5),
        lambda: gaussian_epsilon_for(0.0, 1e-5),
        lambda: gaussian_epsilon_for(1.0, 2.0),
        lambda: add_gaussian_noise([1.0, float("nan")], 1.0, 0),
        lambda: add_gaussian_noise([1.0], 0.0, 0),
        lambda: add_gaussian_noise([1.0], 1.0, None),
        lambda: add_gaussian_noise("abc", 1.0, 0),
    ],
)
def test_bad_input_raises_one_line(call) -> None:
    with pytest.raises(PrivacyParameterError) as info:
        call()
    assert "\n" not in str(info.value)
