"""Privacy events round-trip through JSON and bad JSON is refused with one line."""

from __future__ import annotations

import json

import pytest

from privacylab.accounting import (
    Composed,
    Gaussian,
    Laplace,
    PoissonSampled,
    PrivacyParameterError,
    RandomizedResponse,
    SelfComposed,
    dp_sgd,
)
from privacylab.accounting.events import Event, EventLedger, event_from_dict

EVENTS = [
    Gaussian(1.1),
    Laplace(0.5),
    RandomizedResponse(epsilon=1.0, k=4),
    RandomizedResponse(keep_probability=0.8),
    dp_sgd(1.1, 0.01, 1000),
    dp_sgd(0.9, 1.0, 3),
    Composed([dp_sgd(1.0, 0.02, 10), SelfComposed(Laplace(2.0), 3), RandomizedResponse(2.0)]),
    Composed([]),
]


@pytest.mark.parametrize("event", EVENTS)
def test_round_trip_through_json(event: Event) -> None:
    data = json.loads(json.dumps(event.to_dict()))
    assert Event.from_dict(data) == event
    assert event_from_dict(data).to_dict() == data


BAD = [
    ([], "must be an object"),
    ({"type": "gauss", "noise_multiplier": 1.0}, "unknown privacy event type"),
    ({"noise_multiplier": 1.0}, "unknown privacy event type"),
    ({"type": "gaussian"}, "lacks keys"),
    ({"type": "gaussian", "noise_multiplier": 1.0, "x": 1}, "unknown keys"),
    ({"type": "gaussian", "noise_multiplier": "1.0"}, "must be a number"),
    ({"type": "gaussian", "noise_multiplier": True}, "must be a number"),
    ({"type": "gaussian", "noise_multiplier": -1.0}, "noise multiplier"),
    ({"type": "gaussian", "noise_multiplier": float("nan")}, "noise multiplier"),
    ({"type": "poisson_sampled", "sample_rate": 1.5, "event": {}}, "event"),
    (
        {"type": "poisson_sampled", "sample_rate": 1.5, "event": Gaussian(1.0).to_dict()},
        "sample rate",
    ),
    ({"type": "self_composed", "event": Gaussian(1.0).to_dict(), "count": 2.5}, "whole"),
    ({"type": "self_composed", "event": Gaussian(1.0).to_dict(), "count": 0}, "count"),
    ({"type": "composed", "events": {"a": 1}}, "must be a list"),
    (
        {"type": "randomized_response", "epsilon": 1.0, "k": 2, "keep_probability": 0.9},
        "does not match",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_json_is_one_line(data, message: str) -> None:
    with pytest.raises(PrivacyParameterError, match=message) as error:
        event_from_dict(data)
    assert "\n" not in str(error.value)


def test_deep_or_huge_trees_are_refused() -> None:
    deep: dict = Gaussian(1.0).to_dict()
    for _ in range(40):
        deep = {"type": "self_composed", "event": deep, "count": 2}
    with pytest.raises(PrivacyParameterError, match="nested deeper"):
        event_from_dict(deep)
    huge = {"type": "composed", "events": [Gaussian(1.0).to_dict()] * 100_001}
    with pytest.raises(PrivacyParameterError, match="more than"):
        event_from_dict(huge)


def test_ledger_composes_runs_in_order() -> None:
    step = PoissonSampled(0.1, Gaussian(1.0))
    ledger = EventLedger()
    assert ledger.event is None
    for _ in range(3):
        ledger.record(step)
    assert ledger.event == SelfComposed(step, 3) == dp_sgd(1.0, 0.1, 3)
    ledger.record(PoissonSampled(0.1, Gaussian(2.0)), 2)
    ledger.record(step)
    assert ledger.releases == 6
    assert ledger.event == Composed(
        [
            SelfComposed(step, 3),
            SelfComposed(PoissonSampled(0.1, Gaussian(2.0)), 2),
            SelfComposed(step, 1),
        ]
    )
    again = EventLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.runs == ledger.runs
    with pytest.raises(PrivacyParameterError):
        EventLedger.from_dict({"runs": [{"event": step.to_dict(), "count": "3"}]})
