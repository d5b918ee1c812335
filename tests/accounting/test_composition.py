from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.accounting.composition import (
    AdvancedCompositionAccountant,
    NaiveCompositionAccountant,
    advanced_composition_epsilon,
    amplify_by_subsampling,
)
from privacylab.accounting.events import (
    Composed,
    Event,
    Gaussian,
    Laplace,
    PoissonSampled,
    RandomizedResponse,
    dp_sgd,
)
from privacylab.accounting.gdp import gaussian_epsilon


def kov_homogeneous(eps: float, k: int, delta: float) -> float:
    """Kairouz, Oh & Viswanath 2015, Theorem 3.5 for k identical ε-DP steps, δ'' = δ."""
    drift = k * eps * (math.exp(eps) - 1) / (math.exp(eps) + 1)
    second = drift + math.sqrt(2 * k * eps**2 * math.log(math.e + math.sqrt(k * eps**2) / delta))
    third = drift + math.sqrt(2 * k * eps**2 * math.log(1 / delta))
    return min(k * eps, second, third)


def test_amplification_closed_form() -> None:
    for eps in [1e-6, 0.1, 1.0, 5.0, 50.0]:
        for q in [1e-4, 0.01, 0.5, 1.0]:
            expected = float(mpmath.log(1 + q * (mpmath.exp(eps) - 1)))
            assert amplify_by_subsampling(eps, q) == pytest.approx(expected, rel=1e-13)
    big = amplify_by_subsampling(1000.0, 0.01)
    assert big == pytest.approx(float(mpmath.log(1 + 0.01 * (mpmath.exp(1000) - 1))), rel=1e-14)


def test_naive_pure_dp_sums_epsilons() -> None:
    acc = NaiveCompositionAccountant().compose(Laplace(4.0), 10).compose(RandomizedResponse(0.5))
    assert acc.epsilon(1e-5) == pytest.approx(10 / 4 + 0.5, rel=1e-14)
    assert acc.delta(3.0) == 0.0
    assert acc.delta(2.9) == 1.0
    assert acc.guarantee(1e-5).accountant == "naive"


def test_naive_gaussian_spends_delta_evenly() -> None:
    acc = NaiveCompositionAccountant().compose(Gaussian(3.0), 50)
    assert acc.epsilon(1e-5) == pytest.approx(50 * gaussian_epsilon(1e-5 / 50, 1 / 3), rel=1e-13)


def test_naive_subsampled_gaussian() -> None:
    acc = NaiveCompositionAccountant().compose(dp_sgd(4.0, 0.01, 1000))
    eps0 = gaussian_epsilon(1e-5 / (1000 * 0.01), 0.25)
    assert acc.epsilon(1e-5) == pytest.approx(1000 * math.log1p(0.01 * math.expm1(eps0)))


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 2.0])
@pytest.mark.parametrize("k", [1, 10, 1000])
def test_advanced_homogeneous_pure_dp_closed_form(eps: float, k: int) -> None:
    acc = AdvancedCompositionAccountant().compose(Laplace(1 / eps), k)
    assert acc.epsilon(1e-6) == pytest.approx(kov_homogeneous(eps, k, 1e-6), rel=1e-12)


def test_advanced_beats_dwork_rothblum_vadhan() -> None:
    eps, k, delta = 0.05, 5000, 1e-5
    drv = eps * math.sqrt(2 * k * math.log(1 / delta)) + k * eps * math.expm1(eps)
    acc = AdvancedCompositionAccountant().compose(Laplace(1 / eps), k)
    assert acc.epsilon(delta) <= drv
    assert acc.epsilon(delta) < 0.2 * k * eps


def test_advanced_pure_delta_inverts_epsilon() -> None:
    acc = AdvancedCompositionAccountant().compose(RandomizedResponse(0.1, k=4), 200)
    for target in [1e-3, 1e-8, 1e-20]:
        eps = acc.epsilon(target)
        assert acc.delta(eps) == pytest.approx(target, rel=1e-9)
    assert acc.delta(20.0) == 0.0
    assert acc.delta(0.5) == 1.0


def test_advanced_function_matches_formula() -> None:
    e = np.array([0.1, 0.3])
    n = np.array([5.0, 2.0])
    drift = float(np.sum(n * e * np.expm1(e) / (np.exp(e) + 1)))
    energy = float(np.sum(n * e * e))
    expected = min(1.1, drift + math.sqrt(2 * energy * math.log(1e4)))
    assert advanced_composition_epsilon(e, n, 1e-4) == pytest.approx(expected, rel=1e-14)
    assert advanced_composition_epsilon(e, n, 0.0) == pytest.approx(1.1)


@settings(max_examples=25, deadline=None)
@given(
    sigma=st.floats(0.6, 8.0),
    q=st.floats(1e-3, 1.0),
    steps=st.integers(1, 3000),
    log10_delta=st.floats(-12.0, -2.0),
)
def test_advanced_never_worse_than_naive(sigma, q, steps, log10_delta) -> None:
    event = dp_sgd(sigma, q, steps)
    delta = 10.0**log10_delta
    naive = NaiveCompositionAccountant().compose(event).epsilon(delta)
    advanced = AdvancedCompositionAccountant().compose(event).epsilon(delta)
    assert advanced <= naive * (1 + 1e-12)


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 10), (5.0, 400)])
def test_bounds_are_above_the_exact_gaussian_epsilon(sigma: float, steps: int) -> None:
    exact = gaussian_epsilon(1e-5, math.sqrt(steps) / sigma)
    for cls in (NaiveCompositionAccountant, AdvancedCompositionAccountant):
        assert cls().compose(Gaussian(sigma), steps).epsilon(1e-5) >= exact


def test_advanced_is_above_an_optimistic_pld_for_dp_sgd() -> None:
    from dp_accounting.pld import privacy_loss_distribution as pld

    sigma, q, steps = 1.0, 0.05, 200
    lower = (
        pld.from_gaussian_mechanism(
            sigma, sampling_prob=q, pessimistic_estimate=False, value_discretization_interval=1e-3
        )
        .self_compose(steps)
        .get_epsilon_for_delta(1e-5)
    )
    acc = AdvancedCompositionAccountant().compose(dp_sgd(sigma, q, steps))
    assert acc.epsilon(1e-5) >= lower


def test_abadi_figure_2_ordering() -> None:
    """q = 0.01, σ = 4, δ = 1e-5 (Abadi et al. 2016, Fig. 2): advanced ≪ naive, both grow."""
    previous = 0.0
    for epochs in [1, 10, 100]:
        event = dp_sgd(4.0, 0.01, epochs * 100)
        advanced = AdvancedCompositionAccountant().compose(event).epsilon(1e-5)
        naive = NaiveCompositionAccountant().compose(event).epsilon(1e-5)
        assert previous < advanced < naive
        previous = advanced
    assert advanced < 0.1 * naive


def test_delta_inverts_epsilon_with_gaussians() -> None:
    for cls in (NaiveCompositionAccountant, AdvancedCompositionAccountant):
        acc = cls().compose(dp_sgd(2.0, 0.02, 500)).compose(Laplace(50.0), 3)
        eps = acc.epsilon(1e-6)
        delta = acc.delta(eps)
        assert delta == pytest.approx(1e-6, rel=1e-6)
        assert acc.epsilon(delta) <= eps
        assert acc.delta(0.0) == 1.0
        assert acc.delta(1e6) < 1e-250


def test_composed_and_nested_events() -> None:
    event = Composed([Gaussian(2.0), PoissonSampled(0.5, PoissonSampled(0.2, Laplace(1.0)))])
    acc = NaiveCompositionAccountant().compose(event)
    nested = amplify_by_subsampling(amplify_by_subsampling(1.0, 0.2), 0.5)
    assert acc.epsilon(1e-5) == pytest.approx(gaussian_epsilon(1e-5, 0.5) + nested)


def test_empty_accountant() -> None:
    assert AdvancedCompositionAccountant().epsilon(1e-5) == 0.0
    assert NaiveCompositionAccountant().delta(0.0) == 0.0


def test_unknown_events_are_rejected() -> None:
    class Exotic(Event):
        pass

    for cls in (NaiveCompositionAccountant, AdvancedCompositionAccountant):
        with pytest.raises(PrivacyParameterError) as info:
            cls().compose(Exotic())
        assert "\n" not in str(info.value)
    with pytest.raises(PrivacyParameterError):
        NaiveCompositionAccountant().compose(Gaussian(1.0)).epsilon(0.0)
    with pytest.raises(PrivacyParameterError):
        AdvancedCompositionAccountant().compose(Gaussian(1.0)).delta(float("nan"))
