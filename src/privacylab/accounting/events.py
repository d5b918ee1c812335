"""Privacy events: *what happened*, kept apart from the accountants that bound it.

The split follows dp_accounting's DpEvent design. Every event is about one record under
add/remove adjacency with sensitivity 1 (scale noise by the L2/L1 sensitivity before building
the event). Events are immutable, hashable and validated on construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from privacylab.accounting import _validate as check

MAX_EVENT_DEPTH = 32
"""Deepest nesting `event_from_dict` accepts (DP-SGD needs 3: SelfComposed(PoissonSampled(...)))."""

MAX_EVENT_NODES = 100_000
"""Most events one serialised event may hold, so that a small file cannot ask for a huge tree."""


class Event:
    """Base class of privacy events."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form ``{"type": ..., <parameters>}``; `event_from_dict` is its inverse."""
        return event_to_dict(self)

    @staticmethod
    def from_dict(data: object) -> Event:
        """The event serialised by `to_dict`; see `event_from_dict`."""
        return event_from_dict(data)


@dataclass(frozen=True)
class Gaussian(Event):
    """Gaussian mechanism with noise standard deviation `noise_multiplier` × sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check.positive("noise multiplier", self.noise_multiplier)
        )


@dataclass(frozen=True)
class MatrixGaussian(Event):
    """Matrix Gaussian release f(X) + Z, Z ~ MN(0, BBᵀ, CCᵀ), with σ_min(B)·σ_min(C) equal to
    `noise_multiplier` × the L2 (Frobenius) sensitivity of f.

    Du et al. 2023 (DP-Forward, Theorem 2, the analytic matrix Gaussian mechanism): the privacy
    loss of vec(Z) ~ N(0, CCᵀ ⊗ BBᵀ) for a shift Δ is Gaussian with mean-to-scale
    ‖(CCᵀ ⊗ BBᵀ)^(-1/2) vec(Δ)‖ ≤ ‖Δ‖_F / (σ_min(B)σ_min(C)), with equality for Δ along the
    least-noisy direction, so every accountant bounds this event exactly as
    `Gaussian(noise_multiplier)` (see `flatten`). `rows` × `columns` is the matrix shape.
    """

    noise_multiplier: float
    rows: int = 1
    columns: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check.positive("noise multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "rows", check.count(self.rows, "matrix rows"))
        object.__setattr__(self, "columns", check.count(self.columns, "matrix columns"))

    def as_gaussian(self) -> Gaussian:
        """The vector Gaussian event with the same worst-case privacy loss."""
        return Gaussian(self.noise_multiplier)


@dataclass(frozen=True)
class Laplace(Event):
    """Laplace mechanism with scale `scale` × L1 sensitivity (pure (1/scale)-DP)."""

    scale: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check.positive("Laplace scale", self.scale))


@dataclass(frozen=True)
class RandomizedResponse(Event):
    """k-ary randomized response (Warner 1965; Kairouz et al. 2016).

    The true value is reported with probability e^ε / (e^ε + k − 1), each other value with
    probability 1 / (e^ε + k − 1). Give `epsilon` directly, or `keep_probability` (the chance
    the true value is reported) from which ε is derived.
    """

    epsilon: float | None = None
    k: int = 2
    keep_probability: float | None = None

    def __post_init__(self) -> None:
        k = check.count(self.k, "number of categories k")
        if k < 2:
            raise check.PrivacyParameterError(f"number of categories k must be >= 2, got {k}")
        object.__setattr__(self, "k", k)
        if (self.epsilon is None) == (self.keep_probability is None):
            raise check.PrivacyParameterError(
                "randomized response needs exactly one of epsilon or keep_probability"
            )
        if self.keep_probability is not None:
            p = check._as_float("keep probability", self.keep_probability)
            if not (1.0 / k < p < 1.0):
                raise check.PrivacyParameterError(
                    f"keep probability must be in (1/k, 1) = ({1.0 / k:g}, 1), got {p!r}"
                )
            eps = math.log(p * (k - 1) / (1.0 - p))
            object.__setattr__(self, "epsilon", eps)
            object.__setattr__(self, "keep_probability", p)
        else:
            eps = check.positive("randomized response epsilon", self.epsilon)
            object.__setattr__(self, "epsilon", eps)
            object.__setattr__(self, "keep_probability", 1.0 / (1.0 + (k - 1) * math.exp(-eps)))

    @property
    def eps(self) -> float:
        """ε of the mechanism (never None after construction)."""
        assert self.epsilon is not None
        return float(self.epsilon)


@dataclass(frozen=True)
class PoissonSampled(Event):
    """`event` run on a Poisson subsample: each record is included independently w.p. q."""

    sample_rate: float
    event: Event

    def __post_init__(self) -> None:
        object.__setattr__(self, "sample_rate", check.sample_rate(self.sample_rate))
        if not isinstance(self.event, Event):
            raise check.PrivacyParameterError(
                f"PoissonSampled needs an Event, got {type(self.event).__name__}"
            )


@dataclass(frozen=True)
class SelfComposed(Event):
    """`event` repeated `count` times (adaptively)."""

    event: Event
    count: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", check.count(self.count, "composition count"))
        if not isinstance(self.event, Event):
            raise check.PrivacyParameterError(
                f"SelfComposed needs an Event, got {type(self.event).__name__}"
            )


@dataclass(frozen=True, init=False)
class Composed(Event):
    """The adaptive composition of several events, in order."""

    events: tuple[Event, ...]

    def __init__(self, events: Iterable[Event]) -> None:
        items = tuple(events)
        for item in items:
            if not isinstance(item, Event):
                raise check.PrivacyParameterError(
                    f"Composed needs Events, got {type(item).__name__}"
                )
        object.__setattr__(self, "events", items)


def dp_sgd(noise_multiplier: float, sample_rate: float, steps: int) -> Event:
    """The event of DP-SGD (Abadi et al. 2016, Algorithm 1) with Poisson sampling."""
    event: Event = Gaussian(noise_multiplier)
    if check.sample_rate(sample_rate) < 1.0:
        event = PoissonSampled(sample_rate, event)
    return SelfComposed(event, steps)


def flatten(event: Event, times: int = 1) -> list[tuple[Event, int]]:
    """Break `event` into (leaf event, count) pairs; leaves are Gaussian, Laplace,
    RandomizedResponse or PoissonSampled. Equal leaves are merged, order kept. A MatrixGaussian
    becomes the Gaussian with its worst-case privacy loss (`MatrixGaussian.as_gaussian`), also
    under PoissonSampled."""
    merged: dict[Event, int] = {}

    def walk(e: Event, n: int) -> None:
        if isinstance(e, MatrixGaussian):
            e = e.as_gaussian()
        elif isinstance(e, PoissonSampled) and isinstance(e.event, MatrixGaussian):
            e = PoissonSampled(e.sample_rate, e.event.as_gaussian())
        if isinstance(e, SelfComposed):
            walk(e.event, n * e.count)
        elif isinstance(e, Composed):
            for sub in e.events:
                walk(sub, n)
        elif isinstance(e, PoissonSampled) and isinstance(e.event, (SelfComposed, Composed)):
            raise check.PrivacyParameterError(
                "PoissonSampled of a composition is not supported: sample once per step"
            )
        elif isinstance(e, Event) and type(e) is not Event:
            merged[e] = merged.get(e, 0) + n
        else:
            raise check.PrivacyParameterError(f"unknown privacy event {e!r}")

    walk(event, times)
    return list(merged.items())


_TYPE_NAMES: dict[type[Event], str] = {
    Gaussian: "gaussian",
    MatrixGaussian: "matrix_gaussian",
    Laplace: "laplace",
    RandomizedResponse: "randomized_response",
    PoissonSampled: "poisson_sampled",
    SelfComposed: "self_composed",
    Composed: "composed",
}
_FIELDS: dict[str, tuple[str, ...]] = {
    "gaussian": ("noise_multiplier",),
    "matrix_gaussian": ("noise_multiplier", "rows", "columns"),
    "laplace": ("scale",),
    "randomized_response": ("epsilon", "k", "keep_probability"),
    "poisson_sampled": ("sample_rate", "event"),
    "self_composed": ("event", "count"),
    "composed": ("events",),
}


def event_to_dict(event: Event) -> dict[str, Any]:
    """`event` as JSON-serialisable data: ``{"type": name, <parameters>}``, nested for
    PoissonSampled, SelfComposed and Composed (dp_accounting's DpEvent tree, as plain JSON)."""
    name = _TYPE_NAMES.get(type(event))
    if name is None:
        raise check.PrivacyParameterError(f"cannot serialise privacy event {event!r}")
    if isinstance(event, Gaussian):
        return {"type": name, "noise_multiplier": event.noise_multiplier}
    if isinstance(event, MatrixGaussian):
        return {
            "type": name,
            "noise_multiplier": event.noise_multiplier,
            "rows": event.rows,
            "columns": event.columns,
        }
    if isinstance(event, Laplace):
        return {"type": name, "scale": event.scale}
    if isinstance(event, RandomizedResponse):
        return {
            "type": name,
            "epsilon": event.eps,
            "k": event.k,
            "keep_probability": event.keep_probability,
        }
    if isinstance(event, PoissonSampled):
        return {"type": name, "sample_rate": event.sample_rate, "event": event_to_dict(event.event)}
    if isinstance(event, SelfComposed):
        return {"type": name, "event": event_to_dict(event.event), "count": event.count}
    assert isinstance(event, Composed)
    return {"type": name, "events": [event_to_dict(e) for e in event.events]}


def _real(where: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise check.PrivacyParameterError(
            f"{where}: {key} must be a number, got {type(value).__name__}"
        )
    return float(value)


def _integer(where: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise check.PrivacyParameterError(
            f"{where}: {key} must be a whole number, got {type(value).__name__}"
        )
    return value


def event_from_dict(data: object) -> Event:
    """The event that `event_to_dict` serialised, validated strictly.

    Every node must be an object with a known ``"type"`` and exactly that type's keys; numbers
    must be JSON numbers (not strings or booleans) inside the event's domain; nesting is limited
    to `MAX_EVENT_DEPTH` and the tree to `MAX_EVENT_NODES` events. Anything else raises
    PrivacyParameterError with one line naming where the problem is.
    """
    nodes = [0]

    def build(node: object, where: str, depth: int) -> Event:
        if depth > MAX_EVENT_DEPTH:
            raise check.PrivacyParameterError(
                f"{where}: privacy event nested deeper than {MAX_EVENT_DEPTH}"
            )
        nodes[0] += 1
        if nodes[0] > MAX_EVENT_NODES:
            raise check.PrivacyParameterError(
                f"privacy event has more than {MAX_EVENT_NODES} parts"
            )
        if not isinstance(node, Mapping):
            raise check.PrivacyParameterError(
                f"{where}: a privacy event must be an object, got {type(node).__name__}"
            )
        name = node.get("type")
        if not isinstance(name, str) or name not in _FIELDS:
            raise check.PrivacyParameterError(
                f"{where}: unknown privacy event type {name!r}; "
                f"expected one of {', '.join(_FIELDS)}"
            )
        expected = {"type", *_FIELDS[name]}
        if set(node) != expected:
            extra, missing = sorted(set(node) - expected), sorted(expected - set(node))
            raise check.PrivacyParameterError(
                f"{where}: {name} event "
                + (f"has unknown keys {extra}" if extra else f"lacks keys {missing}")
            )
        at = f"{where} ({name})"
        if name == "gaussian":
            return Gaussian(_real(at, "noise_multiplier", node["noise_multiplier"]))
        if name == "matrix_gaussian":
            return MatrixGaussian(
                _real(at, "noise_multiplier", node["noise_multiplier"]),
                _integer(at, "rows", node["rows"]),
                _integer(at, "columns", node["columns"]),
            )
        if name == "laplace":
            return Laplace(_real(at, "scale", node["scale"]))
        if name == "randomized_response":
            event = RandomizedResponse(
                epsilon=_real(at, "epsilon", node["epsilon"]), k=_integer(at, "k", node["k"])
            )
            keep = _real(at, "keep_probability", node["keep_probability"])
            if not math.isclose(keep, event.keep_probability or 0.0, rel_tol=1e-9):
                raise check.PrivacyParameterError(
                    f"{at}: keep_probability {keep!r} does not match epsilon and k"
                )
            object.__setattr__(event, "keep_probability", keep)
            return event
        if name == "poisson_sampled":
            rate = _real(at, "sample_rate", node["sample_rate"])
            return PoissonSampled(rate, build(node["event"], f"{where}.event", depth + 1))
        if name == "self_composed":
            count = _integer(at, "count", node["count"])
            return SelfComposed(build(node["event"], f"{where}.event", depth + 1), count)
        items = node["events"]
        if not isinstance(items, list):
            raise check.PrivacyParameterError(
                f"{at}: events must be a list, got {type(items).__name__}"
            )
        return Composed(
            build(item, f"{where}.events[{i}]", depth + 1) for i, item in enumerate(items)
        )

    return build(data, "privacy event", 0)


class EventLedger:
    """The privacy events a run actually executed, in order, as runs of equal events.

    Mechanisms hand their event to `record` each time they release something; `event` is the
    adaptive composition of everything recorded (dp_accounting's SelfComposed/Composed), so an
    accountant bounds what happened rather than what was planned. Runs of one event compose to
    ``SelfComposed(e, n)``; several runs to ``Composed([SelfComposed(e1, n1), ...])``.
    """

    def __init__(self, runs: Iterable[tuple[Event, int]] = ()) -> None:
        self._runs: list[tuple[Event, int]] = []
        for event, count in runs:
            self.record(event, count)

    def record(self, event: Event, count: int = 1) -> None:
        """Append `count` releases of `event`."""
        if not isinstance(event, Event):
            raise check.PrivacyParameterError(
                f"the ledger records Events, got {type(event).__name__}"
            )
        count = check.count(count, "count")
        if self._runs and self._runs[-1][0] == event:
            self._runs[-1] = (event, self._runs[-1][1] + count)
        else:
            self._runs.append((event, count))

    @property
    def runs(self) -> list[tuple[Event, int]]:
        """(event, consecutive count) pairs in the order they happened."""
        return list(self._runs)

    @property
    def releases(self) -> int:
        """How many events were recorded."""
        return sum(count for _, count in self._runs)

    @property
    def event(self) -> Event | None:
        """The composition of everything recorded, or None when nothing was."""
        parts: list[Event] = [SelfComposed(e, n) for e, n in self._runs]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else Composed(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"runs": [{"event": ..., "count": n}, ...]}``."""
        return {"runs": [{"event": e.to_dict(), "count": n} for e, n in self._runs]}

    @classmethod
    def from_dict(cls, data: object) -> EventLedger:
        """Inverse of `to_dict`, validated strictly."""
        if not isinstance(data, Mapping) or set(data) != {"runs"}:
            raise check.PrivacyParameterError("an event ledger must be an object {'runs': [...]}")
        runs = data["runs"]
        if not isinstance(runs, list) or len(runs) > MAX_EVENT_NODES:
            raise check.PrivacyParameterError("an event ledger's runs must be a list")
        ledger = cls()
        for i, run in enumerate(runs):
            if not isinstance(run, Mapping) or set(run) != {"event", "count"}:
                raise check.PrivacyParameterError(
                    f"ledger run {i} must be an object with keys event and count"
                )
            count = _integer(f"ledger run {i}", "count", run["count"])
            ledger.record(event_from_dict(run["event"]), count)
        return ledger
