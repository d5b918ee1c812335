"""The MatrixGaussian event (aMGM, Du et al. 2023, Theorem 2): JSON, validation, and every
accountant bounding it exactly as the vector Gaussian with the same worst-case privacy loss.

Oracles: the same accountant on Gaussian(σ); Balle & Wang 2018, Theorem 8 (exact ε of one
Gaussian release, and of k releases via μ = √k/σ); dp_accounting's PLD accountant on
GaussianDpEvent (test-only dependency).
"""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from privacylab.accounting import (
    Composed,
    Gaussian,
    MatrixGaussian,
    PoissonSampled,
    PrivacyParameterError,
    RandomizedResponse,
    SelfComposed,
    make_accountant,
)
from privacylab.accounting.events import Event, EventLedger, event_from_dict, flatten
from privacylab.accounting.gdp import gaussian_epsilon

ACCOUNTANTS = ("pld", "rdp", "rdp-classic", "gdp", "naive", "advanced")


def as_vector(event: Event) -> Event:
    """The same event tree with every MatrixGaussian replaced by Gaussian(σ)."""
    if isinstance(event, MatrixGaussian):
        return Gaussian(event.noise_multiplier)
    if isinstance(event, PoissonSampled):
        return PoissonSampled(event.sample_rate, as_vector(event.event))
    if isinstance(event, SelfComposed):
        return SelfComposed(as_vector(event.event), event.count)
    if isinstance(event, Composed):
        return Composed(as_vector(e) for e in event.events)
    return event


EVENTS = [
    MatrixGaussian(1.3, 48, 384),
    SelfComposed(MatrixGaussian(2.5, 1, 384), 3),
    SelfComposed(PoissonSampled(0.01, MatrixGaussian(1.1, 16, 32)), 200),
    Composed([SelfComposed(MatrixGaussian(4.0, 4, 8), 3), RandomizedResponse(epsilon=1.0, k=2)]),
]


@pytest.mark.parametrize("event", EVENTS)
def test_round_trip_through_json(event: Event) -> None:
    data = json.loads(json.dumps(event.to_dict()))
    assert Event.from_dict(data) == event
    assert event_from_dict(data).to_dict() == data


def test_json_form_names_the_shape() -> None:
    assert MatrixGaussian(0.5, 3, 7).to_dict() == {
        "type": "matrix_gaussian",
        "noise_multiplier": 0.5,
        "rows": 3,
        "columns": 7,
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "matrix_gaussian", "noise_multiplier": 0.0, "rows": 2, "columns": 3}, "> 0"),
        ({"type": "matrix_gaussian", "noise_multiplier": -1.0, "rows": 2, "columns": 3}, "> 0"),
        (
            {"type": "matrix_gaussian", "noise_multiplier": float("nan"), "rows": 2, "columns": 3},
            "NaN",
        ),
        ({"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": 0, "columns": 3}, "rows"),
        ({"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": 2, "columns": -3}, "columns"),
        ({"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": 2.5, "columns": 3}, "whole"),
        ({"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": True, "columns": 3}, "whole"),
        ({"type": "matrix_gaussian", "noise_multiplier": "1", "rows": 2, "columns": 3}, "number"),
        ({"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": 2}, "lacks keys"),
        (
            {"type": "matrix_gaussian", "noise_multiplier": 1.0, "rows": 2, "columns": 3, "x": 0},
            "unknown keys",
        ),
    ],
)
def test_bad_json_is_refused_with_one_line(data: dict, message: str) -> None:
    with pytest.raises(PrivacyParameterError, match=message) as error:
        event_from_dict(json.loads(json.dumps(data)))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("sigma", "rows", "columns"),
    [(0.0, 1, 1), (float("nan"), 1, 1), (float("inf"), 1, 1), (1.0, 0, 1), (1.0, 1, 1.5)],
)
def test_bad_values_are_refused_with_one_line(sigma: float, rows: int, columns: float) -> None:
    with pytest.raises(PrivacyParameterError) as error:
        MatrixGaussian(sigma, rows, columns)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


def test_flatten_reduces_to_the_worst_case_gaussian_and_merges() -> None:
    event = Composed([MatrixGaussian(1.5, 2, 3), MatrixGaussian(1.5, 4, 5), Gaussian(1.5)])
    assert flatten(event) == [(Gaussian(1.5), 3)]
    sampled = SelfComposed(PoissonSampled(0.1, MatrixGaussian(2.0, 2, 2)), 7)
    assert flatten(sampled) == [(PoissonSampled(0.1, Gaussian(2.0)), 7)]


@pytest.mark.parametrize("name", ACCOUNTANTS)
@pytest.mark.parametrize("event", EVENTS[:3])
def test_every_accountant_bounds_it_as_the_vector_gaussian(name: str, event: Event) -> None:
    matrix = make_accountant(name).compose(event)
    vector = make_accountant(name).compose(as_vector(event))
    for delta in (1e-5, 1e-9):
        assert matrix.epsilon(delta) == vector.epsilon(delta)
    assert matrix.delta(1.0) == vector.delta(1.0)


def test_composition_with_randomized_response_labels() -> None:
    event = EVENTS[3]
    matrix = make_accountant("pld").compose(event).epsilon(1e-5)
    assert matrix == make_accountant("pld").compose(as_vector(event)).epsilon(1e-5)
    assert matrix > make_accountant("pld").compose(SelfComposed(Gaussian(4.0), 3)).epsilon(1e-5)


@pytest.mark.parametrize(("sigma", "count"), [(0.8, 1), (1.3, 1), (2.0, 3), (5.0, 30)])
def test_pld_is_an_upper_bound_as_tight_as_dp_accounting(sigma: float, count: int) -> None:
    delta = 1e-5
    ours = make_accountant("pld").compose(SelfComposed(MatrixGaussian(sigma, 48, 384), count))
    exact = float(gaussian_epsilon(delta, math.sqrt(count) / sigma))
    reference = pld_privacy_accountant.PLDAccountant()
    reference.compose(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count)
    )
    assert exact * (1 - 1e-9) <= ours.epsilon(delta) <= exact * 1.01
    assert ours.epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=0.01)
    gdp = make_accountant("gdp").compose(SelfComposed(MatrixGaussian(sigma, 2, 2), count))
    assert gdp.epsilon(delta) == pytest.approx(exact, rel=1e-9)


def test_poisson_sampled_matrix_gaussian_matches_dp_accounting() -> None:
    sigma, rate, steps, delta = 1.1, 0.01, 1000, 1e-5
    ours = make_accountant("pld").compose(
        SelfComposed(PoissonSampled(rate, MatrixGaussian(sigma, 8, 8)), steps)
    )
    reference = pld_privacy_accountant.PLDAccountant()
    reference.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps
        )
    )
    assert ours.epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=0.02)


def test_ledger_records_what_the_mechanism_released() -> None:
    ledger = EventLedger()
    for _ in range(3):
        ledger.record(MatrixGaussian(1.2, 4, 8))
    ledger.record(RandomizedResponse(epsilon=2.0, k=2))
    assert ledger.event == Composed(
        [SelfComposed(MatrixGaussian(1.2, 4, 8), 3), SelfComposed(RandomizedResponse(2.0), 1)]
    )
    restored = EventLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert restored.runs == ledger.runs
