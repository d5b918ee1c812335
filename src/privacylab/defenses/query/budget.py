"""A per-client query budget: the simplest mitigation of model extraction ("limit the number of
queries", seed 004; Tramèr et al. 2016, Sec. 8 "Rate limiting"; Juuti et al. 2019, Sec. II).

The watch counts the client's answered queries and refuses, with `QueryBudgetError` (the
target's own budget error, on which every attack stops with what it has), the first batch
that would take it past `n`. It does the counting in `observe` rather than through
`Target.with_budget`, so that its verdict can say whether and when the client ran into the
limit: a refused batch is never shown to a monitor behind a budget view.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from privacylab.defenses.base import Parameter, QueryDefense, register_defense
from privacylab.target import QueryBudgetError

__all__ = ["QueryBudget"]


@register_defense
class QueryBudget(QueryDefense):
    """At most `n` answered queries per client (QueryBudgetError past it). The client counts
    as detected once it has spent the budget (`n` answered) or asked for more than is left;
    `queries_until_detection` is then the number answered, `n` when spent."""

    name = "budget"
    paper = "Tramèr et al. 2016, Stealing Machine Learning Models via Prediction APIs, Sec. 8"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("n", int, 10_000, "queries a client may send", 1),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._answered = 0
        self._refused = 0

    def observe(self, x: Tensor) -> None:
        """Count the batch, or refuse it (QueryBudgetError) when it would exceed `n`."""
        n, size = self.params["n"], int(x.shape[0])
        if self._answered + size > n:
            self._refused += size
            raise QueryBudgetError(
                f"query budget of {n} examples exhausted ({self._answered} used, {size} more asked)"
            )
        self._answered += size

    def verdict(self) -> dict[str, Any]:
        """`detected` (budget spent or a batch refused), `queries_until_detection` (answered
        queries then), `queries` answered, `refused` queries asked past the budget, `budget`."""
        detected = self._refused > 0 or self._answered >= self.params["n"]
        return {
            "detected": detected,
            "queries_until_detection": self._answered if detected else None,
            "queries": self._answered,
            "refused": self._refused,
            "budget": self.params["n"],
        }
