"""Composition-theorem baselines: naive (basic) and advanced composition of (ε, δ)-DP steps.

These are the "strong composition" baselines of Abadi et al. 2016, Figure 2. Every leaf event is
first turned into an (ε_i, δ_i)-DP guarantee:

* Gaussian(σ): for a per-step δ0, ε0 = the exact ε of the Gaussian mechanism (Balle & Wang 2018,
  Theorem 8), so that (ε0, δ0) is tight;
* Laplace(b): (1/b, 0) (Dwork, McSherry, Nissim & Smith 2006);
* RandomizedResponse(ε): (ε, 0);
* PoissonSampled(q, inner): amplification by Poisson subsampling (Balle, Barthe & Gaboardi 2018,
  Theorem 8; Li, Qardaji & Su 2012): (log(1 + q(e^{ε0} − 1)), q δ0).

All Gaussian steps share one per-step δ0; the accountants choose it (and, for advanced
composition, the slack δ'') to minimise ε at the requested total δ.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from privacylab.accounting import _validate as check
from privacylab.accounting.base import Accountant, Guarantee
from privacylab.accounting.events import (
    Event,
    Gaussian,
    Laplace,
    PoissonSampled,
    RandomizedResponse,
)
from privacylab.accounting.gdp import gaussian_epsilon

_TINY_DELTA = 1e-300
_GRID = np.linspace(-30.0, 30.0, 61)


@dataclass(frozen=True)
class _Leaf:
    """One leaf: its Gaussian σ (None for pure DP), pure ε, the sampling rates, its count."""

    sigma: float | None
    pure_epsilon: float
    rates: tuple[float, ...]
    count: int

    @property
    def delta_weight(self) -> float:
        """δ_i = weight × δ0 (the product of the sampling rates; 0 for pure DP)."""
        return math.prod(self.rates) if self.sigma is not None else 0.0

    def epsilon(self, delta0: float) -> float:
        """ε_i of one run of this leaf when its Gaussian core runs at per-step δ0."""
        eps = self.pure_epsilon if self.sigma is None else _gaussian_eps(delta0, self.sigma)
        for rate in reversed(self.rates):
            eps = amplify_by_subsampling(eps, rate)
        return eps


@functools.lru_cache(maxsize=4096)
def _gaussian_eps(delta0: float, sigma: float) -> float:
    """Exact ε0 of Gaussian(σ) at δ0; memoised, as the δ-split search asks again and again."""
    if delta0 >= 1.0:
        return 0.0
    if delta0 <= 0.0:
        return math.inf
    return float(gaussian_epsilon(delta0, 1.0 / sigma))


def amplify_by_subsampling(epsilon: float, sample_rate: float) -> float:
    """ε' = log(1 + q(e^ε − 1)) of an ε-DP step run on a Poisson subsample with rate q.

    Balle, Barthe & Gaboardi 2018, "Privacy amplification by subsampling", Theorem 8 (add/remove
    adjacency); Li, Qardaji & Su 2012. The δ of the step becomes q δ. ε may be inf.
    """
    sample_rate = check.sample_rate(sample_rate)
    if math.isnan(epsilon) or epsilon < 0.0:
        raise check.PrivacyParameterError(f"epsilon must be >= 0, got {epsilon!r}")
    if epsilon > 700.0:
        return (
            epsilon
            + math.log(sample_rate)
            + math.log1p((1.0 - sample_rate) * math.exp(-epsilon) / sample_rate)
        )
    return math.log1p(sample_rate * math.expm1(epsilon))


def _leaf_of(event: Event, count: int) -> _Leaf:
    rates: list[float] = []
    while isinstance(event, PoissonSampled):
        rates.append(event.sample_rate)
        event = event.event
    if isinstance(event, Gaussian):
        return _Leaf(event.noise_multiplier, 0.0, tuple(rates), count)
    if isinstance(event, Laplace):
        return _Leaf(None, 1.0 / event.scale, tuple(rates), count)
    if isinstance(event, RandomizedResponse):
        return _Leaf(None, event.eps, tuple(rates), count)
    raise check.PrivacyParameterError(
        f"composition accountants handle Gaussian, Laplace, RandomizedResponse and PoissonSampled "
        f"of those, got {type(event).__name__}"
    )


class _CompositionAccountant(Accountant):
    """Shared machinery: leaves, per-step (ε_i, δ_i), and δ(ε) by root-finding on ε(δ)."""

    def __init__(self) -> None:
        super().__init__()
        self._leaf_cache: list[_Leaf] | None = None

    def _check_supported(self, event: Event) -> None:
        _leaf_of(event, 1)

    def _changed(self) -> None:
        self._leaf_cache = None

    def _leaves(self) -> list[_Leaf]:
        if self._leaf_cache is None:
            self._leaf_cache = [_leaf_of(event, count) for event, count in self._events]
        return self._leaf_cache

    def _delta_weight(self) -> float:
        return sum(leaf.count * leaf.delta_weight for leaf in self._leaves())

    def _pure_epsilons(self) -> list[tuple[float, int]]:
        return [(leaf.epsilon(0.0), leaf.count) for leaf in self._leaves()]

    @abstractmethod
    def _epsilon_at(self, delta: float) -> float:
        """ε certified at total δ for a non-empty composition."""

    def guarantee(self, delta: float) -> Guarantee:
        """The smallest ε this composition theorem certifies at total `delta`."""
        delta = check.delta(delta)
        if not self._events:
            return Guarantee(0.0, delta, self.name)
        return Guarantee(self._epsilon_at(delta), delta, self.name)

    def delta(self, epsilon: float) -> float:
        """The smallest total δ at which this theorem certifies `epsilon` (root of ε(δ) = ε)."""
        epsilon = check.nonnegative("epsilon", epsilon)
        if not self._events:
            return 0.0
        if self._delta_weight() == 0.0:
            return self._pure_delta(epsilon)
        lo, hi = math.log(_TINY_DELTA), math.log1p(-1e-9)

        def gap(log_delta: float) -> float:
            return self._epsilon_at(math.exp(log_delta)) - epsilon

        if gap(lo) <= 0.0:
            return _TINY_DELTA
        if gap(hi) > 0.0:
            return 1.0
        root = optimize.brentq(gap, lo, hi, xtol=1e-10, rtol=1e-12)
        while gap(root) > 0.0:
            root += 1e-10
        return min(math.exp(root), 1.0)

    def _pure_delta(self, epsilon: float) -> float:
        total = sum(eps * n for eps, n in self._pure_epsilons())
        return 0.0 if epsilon >= total else 1.0


def _naive_epsilon(leaves: list[_Leaf], delta: float) -> float:
    weight = sum(leaf.count * leaf.delta_weight for leaf in leaves)
    delta0 = delta / weight if weight > 0.0 else 0.0
    return math.fsum(leaf.count * leaf.epsilon(delta0) for leaf in leaves)


class NaiveCompositionAccountant(_CompositionAccountant):
    """Basic composition: k adaptive (ε_i, δ_i)-DP steps are (Σ ε_i, Σ δ_i)-DP.

    Dwork, Kenthapadi, McSherry, Mironov & Naor 2006; Dwork & Roth 2014, Theorem 3.16. At a
    target δ the shared Gaussian δ0 is δ / Σ_i n_i q_i (all of δ spent on the steps).
    """

    name = "naive"

    def _epsilon_at(self, delta: float) -> float:
        return _naive_epsilon(self._leaves(), delta)


def _drift_and_energy(epsilons: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """Σ n_i ε_i tanh(ε_i/2) and Σ n_i ε_i² of Kairouz, Oh & Viswanath 2015, Theorem 3.5."""
    drift = float(np.dot(counts, epsilons * np.tanh(epsilons / 2.0)))
    return drift, float(np.dot(counts, epsilons * epsilons))


def advanced_composition_epsilon(
    epsilons: np.ndarray, counts: np.ndarray, delta_slack: float
) -> float:
    """ε of heterogeneous advanced composition (Kairouz, Oh & Viswanath 2015, Theorem 3.5).

    For any δ'' ∈ (0, 1], the adaptive composition of (ε_i, δ_i)-DP mechanisms is
    (ε̃, 1 − (1 − δ'') Π (1 − δ_i))-DP, hence also (ε̃, δ'' + Σ δ_i)-DP, with

        ε̃ = min{ Σ ε_i,
                  Σ ε_i (e^{ε_i} − 1)/(e^{ε_i} + 1) + √(2 Σ ε_i² log(e + √(Σ ε_i²)/δ'')),
                  Σ ε_i (e^{ε_i} − 1)/(e^{ε_i} + 1) + √(2 Σ ε_i² log(1/δ'')) }.

    `counts` gives how often each ε_i occurs; (e^ε − 1)/(e^ε + 1) = tanh(ε/2).
    """
    naive = float(np.dot(counts, epsilons))
    if delta_slack <= 0.0:
        return naive
    delta_slack = min(delta_slack, 1.0)
    drift, energy = _drift_and_energy(epsilons, counts)
    if not math.isfinite(energy):
        return naive
    second = drift + math.sqrt(2.0 * energy * math.log(math.e + math.sqrt(energy) / delta_slack))
    third = drift + math.sqrt(2.0 * energy * -math.log(delta_slack))
    return min(naive, second, third)


class AdvancedCompositionAccountant(_CompositionAccountant):
    """Advanced composition (Kairouz, Oh & Viswanath 2015, Theorem 3.5), never worse than naive.

    Total δ = Σ_i n_i δ_i + δ'' (the union bound on Theorem 3.5's 1 − (1 − δ'')Π(1 − δ_i)).
    At a target δ the split u ↦ (δ0 = u δ / Σ n_i q_i, δ'' = (1 − u) δ) is optimised on a logit
    grid of u and refined by bounded scalar minimisation; the result is also capped by the naive
    ε at the same δ, since both bounds hold.
    """

    name = "advanced"

    def _at_split(self, delta: float, logit: float, weight: float, counts: np.ndarray) -> float:
        share = 1.0 / (1.0 + math.exp(-logit))
        delta0 = share * delta / weight
        slack = delta - share * delta
        epsilons = np.array([leaf.epsilon(delta0) for leaf in self._leaves()])
        return advanced_composition_epsilon(epsilons, counts, slack)

    def _epsilon_at(self, delta: float) -> float:
        weight = self._delta_weight()
        best_naive = _naive_epsilon(self._leaves(), delta)
        if weight == 0.0:
            eps, counts = zip(*self._pure_epsilons(), strict=True)
            advanced = advanced_composition_epsilon(np.array(eps), np.array(counts, float), delta)
            return min(best_naive, advanced)
        counts = np.array([leaf.count for leaf in self._leaves()], dtype=float)
        values = [self._at_split(delta, t, weight, counts) for t in _GRID]
        i = int(np.argmin(values))
        lo, hi = _GRID[max(i - 1, 0)], _GRID[min(i + 1, len(_GRID) - 1)]
        refined = optimize.minimize_scalar(
            lambda t: self._at_split(delta, t, weight, counts),
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-6},
        )
        return min(best_naive, values[i], float(refined.fun))

    def _pure_delta(self, epsilon: float) -> float:
        """Closed-form δ'' of Theorem 3.5 for pure-DP steps at a target ε."""
        eps, counts = zip(*self._pure_epsilons(), strict=True)
        e, n = np.array(eps), np.array(counts, dtype=float)
        if epsilon >= float(np.dot(n, e)):
            return 0.0
        drift, energy = _drift_and_energy(e, n)
        if epsilon <= drift:
            return 1.0
        exponent = (epsilon - drift) ** 2 / (2.0 * energy)
        third = math.exp(-exponent)
        second = math.sqrt(energy) / math.expm1(exponent - 1.0) / math.e if exponent > 1.0 else 1.0
        return min(1.0, third, second)
