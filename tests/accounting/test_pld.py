"""PLD accountant: an upper bound as tight as dp_accounting's, checked on a 47-setting grid
against dp_accounting (tightness), prv_accountant's lower bound and exact closed forms."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant
from prv_accountant.privacy_random_variables import GaussianMechanism

from privacylab.accounting import (
    Composed,
    Gaussian,
    Laplace,
    PldAccountant,
    PoissonSampled,
    PrivacyParameterError,
    RandomizedResponse,
    RdpAccountant,
    dp_sgd,
    steps_from_epochs,
)
from privacylab.accounting.gdp import gaussian_delta, gaussian_epsilon

# (σ, q, steps, δ): σ 0.5–10, q 1e-4–1, steps 1–1e5, δ 1e-5–1e-10.
GRID = [
    (0.5, 1e-4, 1, 1e-8),
    (0.5, 1e-4, 1, 1e-10),
    (0.5, 1e-4, 10, 1e-8),
    (0.5, 1e-4, 1000, 1e-10),
    (0.5, 1e-4, 10000, 1e-10),
    (0.5, 1e-4, 100000, 1e-8),
    (0.5, 1e-3, 1, 1e-8),
    (0.5, 1e-3, 100000, 1e-10),
    (0.5, 0.01, 10, 1e-8),
    (0.5, 0.01, 100, 1e-10),
    (0.5, 1.0, 1, 1e-10),
    (0.7, 1e-3, 1, 1e-8),
    (0.7, 1e-3, 10, 1e-10),
    (0.7, 0.2, 1, 1e-8),
    (1.0, 1e-4, 1, 1e-5),
    (1.0, 1e-4, 1000, 1e-8),
    (1.0, 1e-4, 100000, 1e-8),
    (1.0, 0.05, 100, 1e-8),
    (1.0, 0.2, 100, 1e-5),
    (1.5, 1e-4, 1, 1e-5),
    (1.5, 1e-3, 100, 1e-10),
    (1.5, 1e-3, 1000, 1e-5),
    (1.5, 1e-3, 1000, 1e-10),
    (1.5, 0.01, 10000, 1e-8),
    (1.5, 0.05, 1, 1e-10),
    (1.5, 0.05, 10, 1e-8),
    (1.5, 0.05, 10, 1e-10),
    (1.5, 1.0, 1, 1e-5),
    (2.0, 1e-4, 1, 1e-8),
    (2.0, 1e-4, 100, 1e-10),
    (2.0, 1e-4, 10000, 1e-8),
    (2.0, 1e-3, 10000, 1e-8),
    (2.0, 0.01, 1, 1e-5),
    (2.0, 0.01, 1000, 1e-8),
    (2.0, 0.05, 1, 1e-5),
    (2.0, 0.05, 1000, 1e-10),
    (2.0, 1.0, 1, 1e-5),
    (4.0, 1e-4, 1000, 1e-10),
    (4.0, 1e-3, 1000, 1e-8),
    (4.0, 1e-3, 1000, 1e-10),
    (4.0, 0.01, 100000, 1e-10),
    (4.0, 0.05, 1, 1e-5),
    (4.0, 0.05, 1000, 1e-8),
    (4.0, 0.05, 100000, 1e-5),
    (4.0, 1.0, 10, 1e-10),
    (10.0, 0.01, 10000, 1e-5),
    (10.0, 0.2, 10000, 1e-10),
]


def _dp_accounting_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    event = dp_accounting.GaussianDpEvent(sigma)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


def _prv_lower_bound(sigma: float, q: float, steps: int, delta: float) -> float:
    mech = (
        PoissonSubsampledGaussianMechanism(noise_multiplier=sigma, sampling_probability=q)
        if q < 1
        else GaussianMechanism(noise_multiplier=sigma)
    )
    # prv_accountant's cost grows with steps/accuracy: coarser (still valid) bounds at 1e5 steps.
    eps_error, delta_error = (0.01, delta / 1000) if steps < 100000 else (0.1, delta / 10)
    acc = PRVAccountant(
        prvs=[mech], max_self_compositions=[steps], eps_error=eps_error, delta_error=delta_error
    )
    return acc.compute_epsilon(delta=delta, num_self_compositions=[steps])[0]


@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), GRID)
def test_pld_is_tight_and_an_upper_bound(sigma: float, q: float, steps: int, delta: float) -> None:
    ours = PldAccountant().compose(dp_sgd(sigma, q, steps)).epsilon(delta)
    reference = _dp_accounting_epsilon(sigma, q, steps, delta)
    assert ours <= reference * 1.005 + 1e-9
    assert ours >= _prv_lower_bound(sigma, q, steps, delta)
    assert ours <= RdpAccountant().compose(dp_sgd(sigma, q, steps)).epsilon(delta) + 1e-9


@pytest.mark.parametrize(
    ("sigma", "steps", "delta"),
    [
        (0.5, 1, 1e-5),
        (1.0, 1, 1e-10),
        (1.0, 100, 1e-5),
        (2.0, 1000, 1e-8),
        (4.0, 10, 1e-10),
        (10.0, 1000, 1e-5),
        (10.0, 100000, 1e-10),
        (30.0, 100000, 1e-6),
    ],
)
def test_gaussian_composition_against_the_exact_value(
    sigma: float, steps: int, delta: float
) -> None:
    """T Gaussians with noise σ compose exactly to one with μ = √T/σ (Dong, Roth & Su 2019)."""
    exact = float(gaussian_epsilon(delta, math.sqrt(steps) / sigma))
    acc = PldAccountant().compose(Gaussian(sigma), steps)
    ours = acc.epsilon(delta)
    assert exact - 1e-12 <= ours <= exact * 1.005 + 1e-9
    for eps in (0.5 * exact, exact, 1.5 * exact):
        true_delta = float(gaussian_delta(eps, math.sqrt(steps) / sigma))
        if true_delta >= 1e-11:  # below that, float64 FFT noise (~1e-19 a bin) is comparable
            assert acc.delta(eps) >= true_delta * (1 - 1e-9)


@pytest.mark.parametrize(
    ("sigma", "q", "epochs", "expected"), [(1.1, 256 / 60000, 60, 2.38), (4.0, 0.01, 100, 0.947)]
)
def test_published_values(sigma: float, q: float, epochs: int, expected: float) -> None:
    eps = PldAccountant().compose(dp_sgd(sigma, q, steps_from_epochs(epochs, q))).epsilon(1e-5)
    assert eps == pytest.approx(expected, abs=0.006)


def test_laplace_matches_its_exact_privacy_profile() -> None:
    """Laplace with ε0 = 1/b: δ(ε) = 1 − e^{(ε − ε0)/2} for ε < ε0 (Balle et al. 2018)."""
    acc = PldAccountant().compose(Laplace(0.5))
    for eps in (0.0, 0.5, 1.0, 1.9):
        exact = 1 - math.exp((eps - 2.0) / 2)
        assert exact * (1 - 1e-12) <= acc.delta(eps) <= exact + 1e-7
    assert acc.delta(2.0) <= 1e-12
    assert acc.epsilon(1e-6) <= 2.0


def test_randomized_response_matches_its_exact_profile() -> None:
    rr = RandomizedResponse(epsilon=1.0)
    p = rr.keep_probability
    acc = PldAccountant().compose(rr)
    for eps in (0.0, 0.3, 0.9):
        exact = p - math.exp(eps) * (1 - p)
        assert exact * (1 - 1e-12) <= acc.delta(eps) <= exact + 1e-6


def test_subsampled_laplace_and_mixed_composition_match_dp_accounting() -> None:
    ours = PldAccountant().compose(
        Composed([PoissonSampled(0.01, Laplace(1.0)), Gaussian(5.0)]), 200
    )
    ref = pld_privacy_accountant.PLDAccountant()
    ref.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.ComposedDpEvent(
                [
                    dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.LaplaceDpEvent(1.0)),
                    dp_accounting.GaussianDpEvent(5.0),
                ]
            ),
            200,
        )
    )
    for delta in (1e-5, 1e-9):
        assert ours.epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=5e-3)


def test_epsilon_and_delta_are_inverse() -> None:
    acc = PldAccountant().compose(dp_sgd(1.0, 0.01, 3000))
    for delta in (1e-3, 1e-6, 1e-9):
        eps = acc.epsilon(delta)
        assert acc.delta(eps) == pytest.approx(delta, rel=1e-6)
        assert acc.delta(eps * 0.99) > delta


def test_mass_is_conserved_and_probabilities_are_valid() -> None:
    dist, _ = PldAccountant().compose(dp_sgd(0.8, 0.05, 500)).distributions()
    assert np.all(dist.pmf >= 0)
    assert dist.pmf.sum() + dist.infinity_mass == pytest.approx(1.0, abs=1e-9)
    q_mass = float(np.sum(dist.pmf * np.exp(-dist.losses)))
    assert q_mass <= 1.0 + 1e-9


def test_finer_grid_is_never_looser() -> None:
    coarse = PldAccountant(value_discretization_interval=1e-2).compose(dp_sgd(1.0, 0.02, 500))
    fine = PldAccountant(value_discretization_interval=1e-4).compose(dp_sgd(1.0, 0.02, 500))
    assert fine.epsilon(1e-6) <= coarse.epsilon(1e-6) + 1e-9


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_bad_discretisation(interval: float) -> None:
    with pytest.raises(PrivacyParameterError):
        PldAccountant(value_discretization_interval=interval)


def test_bad_delta_is_a_clear_error() -> None:
    acc = PldAccountant().compose(Gaussian(1.0))
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(PrivacyParameterError, match="delta"):
            acc.epsilon(bad)
