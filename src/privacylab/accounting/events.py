"""Privacy events: *what happened*, kept apart from the accountants that bound it.

The split follows dp_accounting's DpEvent design. Every event is about one record under
add/remove adjacency with sensitivity 1 (scale noise by the L2/L1 sensitivity before building
the event). Events are immutable, hashable and validated on construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from privacylab.accounting import _validate as check


class Event:
    """Base class of privacy events."""


@dataclass(frozen=True)
class Gaussian(Event):
    """Gaussian mechanism with noise standard deviation `noise_multiplier` × sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check.positive("noise multiplier", self.noise_multiplier)
        )


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
    RandomizedResponse or PoissonSampled. Equal leaves are merged, order kept."""
    merged: dict[Event, int] = {}

    def walk(e: Event, n: int) -> None:
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
