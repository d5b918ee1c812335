"""The numpy mechanisms record the event of each release in a ledger, so an accountant bounds
what a program actually released."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from privacylab.accounting import make_accountant
from privacylab.accounting.events import (
    EventLedger,
    Gaussian,
    Laplace,
    RandomizedResponse,
    SelfComposed,
)
from privacylab.mechanisms import add_gaussian_noise, add_laplace_noise, randomized_response


def test_releases_are_recorded_and_draws_unchanged():
    ledger = EventLedger()
    value = np.arange(4.0)
    with_ledger = add_gaussian_noise(value, 3.0, 7, sensitivity=1.5, ledger=ledger)
    np.testing.assert_array_equal(with_ledger, add_gaussian_noise(value, 3.0, 7, sensitivity=1.5))
    add_gaussian_noise(value, 3.0, 8, sensitivity=1.5, ledger=ledger)
    lap = add_laplace_noise(value, 2.0, 7, sensitivity=4.0, ledger=ledger)
    np.testing.assert_array_equal(lap, add_laplace_noise(value, 2.0, 7))
    randomized_response([0, 1, 2], 1.5, 3, 0, ledger=ledger)
    assert ledger.runs == [
        (Gaussian(2.0), 2),
        (Laplace(0.5), 1),
        (RandomizedResponse(epsilon=1.5, k=3), 1),
    ]
    assert ledger.releases == 4


def test_two_gaussian_releases_compose_to_the_closed_form():
    """Two releases of Gaussian(σ) are one Gaussian(σ/√2) (Dong, Roth & Su 2019, μ = √2/σ): the
    ledger's event under PLD matches the exact (ε, δ) curve of μ-GDP within the discretisation."""
    ledger = EventLedger()
    for seed in range(2):
        add_gaussian_noise(np.zeros(3), 2.0, seed, ledger=ledger)
    assert ledger.event == SelfComposed(Gaussian(2.0), 2)
    mu = math.sqrt(2) / 2.0
    epsilon = make_accountant("pld").compose(ledger.event).epsilon(1e-5)
    exact_delta = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(
        -epsilon / mu - mu / 2
    )
    assert exact_delta <= 1e-5 * (1 + 1e-6)  # PLD is an upper bound on ε
    assert epsilon == pytest.approx(
        make_accountant("gdp").compose(ledger.event).epsilon(1e-5), rel=0.02
    )


def test_pure_releases_add_up_under_basic_composition():
    ledger = EventLedger()
    add_laplace_noise([0.0], 1.0, 0, ledger=ledger)  # ε = 1
    randomized_response([1, 0], 0.5, 2, 0, ledger=ledger)  # ε = 0.5
    assert make_accountant("naive").compose(ledger.event).epsilon(1e-5) == pytest.approx(1.5)
