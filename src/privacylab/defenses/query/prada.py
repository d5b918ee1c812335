"""PRADA: a stateful detector of model-extraction query streams (Juuti, Szyller, Marchal &
Asokan 2019, "PRADA: Protecting against DNN Model Stealing Attacks", EuroS&P, Sec. V and
Algorithm 1).

Idea (Sec. V-A): the minimum distances between a benign client's successive queries and its
earlier ones fit a normal distribution; extraction queries (synthetic points grown from a few
seeds, random inputs, points probing the decision boundaries) do not. Per client and per class
c (the class the victim predicts for the query), PRADA keeps a growing set G_c, its distances
D_{G_c} and a threshold T_c. For each query x of predicted class c (Alg. 1):

- if G_c is empty, x starts it;
- else d_min = min_{y in G_c} dist(x, y) joins the client's set D; if d_min > T_c, x joins G_c,
  d_min joins D_{G_c} and T_c = max(T_c, mean(D_{G_c}) - std(D_{G_c}));
- once |D| >= `min_queries` (the paper: more than 100), D without its outliers (values beyond
  mean ± 3 std) is tested with Shapiro–Wilk; W < δ flags the client as an attacker.

The detector must know the victim's label of each query. The defender owns the model, so
`defend(target)` installs PRADA as a *labelled* monitor (`Target.with_monitor(...,
labelled=True)`): the target hands it each batch with the model's own labels, computed on the
defender's side — neither counted against the client's budget nor shown to any other monitor,
and never returned to the client.

What it cannot see, by its premise: a stream of i.i.d. queries — natural rows the thief owns
(copycat, Knockoff Nets; Atli et al. 2020 report PRADA missing Knockoff-style attacks) or
uniform random inputs, whose minimum distances are themselves close to normal — and an attack
that is done before `min_queries` distances exist (equation solving needs d + 1 queries).

`block=1` refuses the client once flagged: the batch holding the detecting query and every
later one raise `QueryRefused` (a `PrivacylabError`), which extraction attacks treat as a stop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from privacylab.defenses.base import DefenseError, Parameter, QueryDefense, register_defense
from privacylab.errors import PrivacylabError
from privacylab.target import Target

__all__ = ["Prada", "QueryRefused", "shapiro_wilk_without_outliers"]

Labeller = Callable[[Tensor], Tensor]


class QueryRefused(PrivacylabError, PermissionError):  # noqa: N818 (the issue's name)
    """A query watch refuses a flagged client's queries; one line."""


def shapiro_wilk_without_outliers(distances: np.ndarray) -> float:
    """Shapiro–Wilk W of `distances` after removing the values beyond mean ± 3 std (Juuti et al.
    2019, Alg. 1); 1.0 when fewer than 3 values remain or they are all equal (normality cannot
    be rejected)."""
    values = np.asarray(distances, dtype=np.float64)
    mean, std = values.mean(), values.std()
    kept = values[np.abs(values - mean) <= 3 * std] if std > 0 else values
    if len(kept) < 3 or np.ptp(kept) == 0:
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.shapiro(kept).statistic)


class _Growing:
    """One class's growing set G_c (rows), its distances D_{G_c} and threshold T_c."""

    def __init__(self, dim: int) -> None:
        self.rows = np.zeros((16, dim))
        self.size = 0
        self.distances: list[float] = []
        self.threshold = 0.0

    def add(self, x: np.ndarray) -> None:
        if self.size == len(self.rows):
            self.rows = np.vstack([self.rows, np.zeros_like(self.rows)])
        self.rows[self.size] = x
        self.size += 1


@register_defense
class Prada(QueryDefense):
    """PRADA (Juuti et al. 2019, Alg. 1): per-client growing sets per predicted class, minimum
    distances of new queries to them, Shapiro–Wilk test of those distances (outliers removed)
    every `every` new distances once `min_queries` are collected; the client is flagged when
    W < `delta`. `distance`: L2 (the paper's) or L1 / L∞ on flattened inputs. `block=1`
    refuses a flagged client (QueryRefused); `block=0` (default) only reports."""

    name = "prada"
    paper = "Juuti et al. 2019, PRADA: Protecting against DNN Model Stealing Attacks, Alg. 1"
    parameters: ClassVar[tuple[Parameter, ...]] = (
        Parameter("delta", float, 0.9, "Shapiro–Wilk threshold δ: W < δ flags", 0.0, 1.0, True),
        Parameter("min_queries", int, 100, "distances collected before the first test", 3),
        Parameter("every", int, 1, "test every k new distances", 1),
        Parameter("distance", str, "l2", "distance between flattened inputs",
                  choices=("l2", "l1", "linf")),
        Parameter("block", int, 0, "1: refuse a flagged client's further queries", 0, 1),
    )  # fmt: skip

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._labeller: Labeller | None = None
        self._given: Tensor | None = None
        self._classes: dict[int, _Growing] = {}
        self._distances: list[float] = []
        self._queries = 0
        self._tests = 0
        self._w: float | None = None
        self._trace: list[tuple[int, float]] = []
        self._detected_at: int | None = None

    def defend(self, target: Target) -> Target:
        """A view of `target` whose queries this watch sees with the model's own labels
        (a labelled monitor: uncounted, unmonitored, never shown to the client)."""
        return target.with_monitor(self.observe_labelled, labelled=True)

    def observe_labelled(self, x: Tensor, labels: Tensor) -> None:
        """`observe` for a batch whose victim labels the target computed."""
        self._given = labels
        try:
            self.observe(x)
        finally:
            self._given = None

    def use_labeller(self, labeller: Labeller) -> Prada:
        """Label queries with `labeller` (the defender's model) instead of a target's model:
        for running the detector on a recorded stream. Returns self."""
        self._labeller = labeller
        return self

    def _dist(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        diff = rows - x
        kind = self.params["distance"]
        if kind == "l2":
            return np.sqrt(np.einsum("ij,ij->i", diff, diff))
        if kind == "l1":
            return np.abs(diff).sum(1)
        return np.abs(diff).max(1)

    def observe(self, x: Tensor) -> None:
        """Alg. 1 for each query of the batch `x` in order; QueryRefused for a flagged client
        when `block` is 1 (the batch holding the detecting query included)."""
        if self._detected_at is not None:
            self._queries += int(x.shape[0])
            if self.params["block"]:
                raise QueryRefused(
                    f"prada flagged this client after {self._detected_at} queries; refused"
                )
            return
        if self._labeller is None and self._given is None:
            raise DefenseError(
                "prada needs the defended model's labels: call defend(target) or use_labeller"
            )
        x = torch.as_tensor(x)
        if x.shape[0] == 0:
            return
        labeller = self._labeller
        labels = (self._given if self._given is not None else labeller(x)).numpy()  # type: ignore[misc]
        rows = x.detach().reshape(x.shape[0], -1).cpu().double().numpy()
        delta, first, every = self.params["delta"], self.params["min_queries"], self.params["every"]
        for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
            self._queries += 1
            grow = self._classes.get(int(label))
            if grow is None:
                grow = self._classes[int(label)] = _Growing(rows.shape[1])
            if grow.size == 0:
                grow.add(row)
                continue
            d_min = float(self._dist(grow.rows[: grow.size], row).min())
            self._distances.append(d_min)
            if d_min > grow.threshold:
                grow.add(row)
                grow.distances.append(d_min)
                spread = np.asarray(grow.distances)
                grow.threshold = max(grow.threshold, float(spread.mean() - spread.std()))
            count = len(self._distances)
            if count >= first and (count - first) % every == 0:
                self._tests += 1
                self._w = shapiro_wilk_without_outliers(np.asarray(self._distances))
                self._trace.append((self._queries, self._w))
                if self._w < delta:
                    self._detected_at = self._queries
                    self._queries += len(rows) - (i + 1)
                    if self.params["block"]:
                        raise QueryRefused(
                            f"prada flagged this client after {self._detected_at} queries "
                            f"(Shapiro–Wilk W = {self._w:.3f} < {delta:g}); refused"
                        )
                    return

    def min_distances(self) -> list[float]:
        """The client's set D so far: each query's minimum distance to its class's growing set
        (queries that started a set contribute none), in query order."""
        return list(self._distances)

    def trace(self) -> list[tuple[int, float]]:
        """Every test so far as (queries seen, W): when W would have crossed another δ."""
        return list(self._trace)

    def verdict(self) -> dict[str, Any]:
        """`detected`, `queries_until_detection` (the query at which W first fell below δ),
        `w_statistic` (W at detection, else the last one computed; None before any test),
        `tests` (Shapiro–Wilk tests run), `queries` seen and `distances` collected."""
        return {
            "detected": self._detected_at is not None,
            "queries_until_detection": self._detected_at,
            "w_statistic": self._w,
            "tests": self._tests,
            "queries": self._queries,
            "distances": len(self._distances),
            "delta": self.params["delta"],
        }
