"""The accountant interface: `compose(event)`, `epsilon(delta)`, `delta(epsilon)`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from privacylab.accounting import _validate as check
from privacylab.accounting.events import Event, flatten


@dataclass(frozen=True)
class Guarantee:
    """An (ε, δ) guarantee and who certified it.

    `order` is the Rényi order that gave ε (RDP accountant only); `note` states any caveat
    (e.g. that the GDP/CLT value may under-state ε).
    """

    epsilon: float
    delta: float
    accountant: str
    order: float | None = None
    note: str | None = None


class Accountant(ABC):
    """Accumulates events; bounds the (ε, δ) of everything composed so far.

    Every accountant is an *upper* bound on ε (except the GDP/CLT one, which says so).
    """

    name: str = "accountant"

    def __init__(self) -> None:
        self._events: list[tuple[Event, int]] = []

    def compose(self, event: Event, count: int = 1) -> Accountant:
        """Record `event` run `count` times after everything composed so far; returns self."""
        count = check.count(count, "count")
        leaves = flatten(event, count)
        for leaf, _ in leaves:
            self._check_supported(leaf)
        self._events.extend(leaves)
        self._changed()
        return self

    @property
    def events(self) -> list[tuple[Event, int]]:
        """The (leaf event, count) pairs composed so far."""
        return list(self._events)

    def _check_supported(self, event: Event) -> None:  # noqa: B027 - optional hook
        """Raise PrivacyParameterError if this accountant cannot bound `event`."""

    def _changed(self) -> None:  # noqa: B027 - optional hook
        """Drop caches after the composed events changed."""

    @abstractmethod
    def guarantee(self, delta: float) -> Guarantee:
        """The smallest ε this accountant certifies at `delta`, with its provenance."""

    def epsilon(self, delta: float) -> float:
        """The smallest ε this accountant certifies for the composed events at `delta`."""
        return self.guarantee(delta).epsilon

    @abstractmethod
    def delta(self, epsilon: float) -> float:
        """The smallest δ this accountant certifies for the composed events at `epsilon`."""
