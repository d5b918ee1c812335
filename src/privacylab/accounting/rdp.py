"""Rényi DP accounting: the moments accountant of Abadi et al. (2016) as generalised by Mironov.

* Subsampled Gaussian: Mironov, Talwar & Zhang (2019), "Rényi Differential Privacy of the Sampled
  Gaussian Mechanism". The RDP of order α is log(A_α)/(α − 1) with
  A_α = E_{z∼N(0,σ²)}[((1 − q) + q·exp((2z − 1)/(2σ²)))^α]  (their Eq. (3)/Sec. 3.3).
  Integer α uses the exact binomial expansion (their Sec. 3.2); fractional α integrates the
  expectation above with the trapezoidal rule, which is exponentially accurate for this analytic
  integrand. Both evaluate A_α − 1 without cancellation, so the RDP stays accurate to ~1e-10
  relative even when it is ~1e-12 (small q, large σ), where a plain log-sum-exp loses digits.
* Gaussian, Laplace, randomized response: Mironov (2017), "Rényi Differential Privacy", Table II.
* RDP → (ε, δ): the tight conversion of Balle, Barthe, Gaboardi, Hsu & Sato (2020), "Hypothesis
  testing interpretations and Rényi differential privacy", Theorem 21, by default; the classic
  ε = RDP_α + log(1/δ)/(α − 1) (Mironov 2017, Prop. 3) on request.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, logsumexp

from privacylab.accounting import _validate as check
from privacylab.accounting.base import Accountant, Guarantee
from privacylab.accounting.events import (
    Event,
    Gaussian,
    Laplace,
    PoissonSampled,
    RandomizedResponse,
)

DEFAULT_ORDERS: np.ndarray = np.unique(
    np.concatenate(
        [
            np.linspace(1.01, 1.09, 9),
            1.0 + np.arange(1, 100) / 10.0,
            np.arange(11, 64, dtype=float),
            np.arange(64, 257, 8, dtype=float),
            np.array([320, 384, 512, 768, 1024, 1536, 2048, 4096], dtype=float),
        ]
    )
)
"""Rényi orders searched by default: Opacus's 151 orders, plus 1.01–1.09 (large ε), 11, and
64–4096 (small δ with few steps)."""

CONVERSIONS = ("tight", "classic")

MAX_QUADRATURE_POINTS = 50_000
"""Largest trapezoidal grid for fractional orders (the grid has 99 rows, one per order)."""


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x − 1) for x > 0, accurate for tiny and huge x."""
    x = np.asarray(x, dtype=float)
    return np.where(x > 30.0, x, np.log(np.expm1(np.minimum(x, 30.0))))


def _log_a_integer(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for integer orders α ≥ 2 (Mironov, Talwar & Zhang 2019, Sec. 3.2).

    A_α = Σ_k C(α,k)(1−q)^{α−k} q^k exp((k²−k)/(2σ²)); since the binomial weights sum to 1,
    A_α − 1 = Σ_{k≥2} C(α,k)(1−q)^{α−k} q^k expm1((k²−k)/(2σ²)), a sum of positive terms.
    All orders are evaluated in one flat array with a segmented log-sum-exp.
    """
    alphas = np.asarray(alphas, dtype=np.int64)
    lengths = alphas - 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    alpha = np.repeat(alphas, lengths).astype(float)
    k = np.arange(lengths.sum()) - np.repeat(starts, lengths) + 2.0
    log_terms = (
        gammaln(alpha + 1.0)
        - gammaln(k + 1.0)
        - gammaln(alpha - k + 1.0)
        + (alpha - k) * math.log1p(-q)
        + k * math.log(q)
        + _log_expm1((k * k - k) / (2.0 * sigma**2))
    )
    peak = np.maximum.reduceat(log_terms, starts)
    total = np.add.reduceat(np.exp(log_terms - np.repeat(peak, lengths)), starts)
    return np.logaddexp(0.0, peak + np.log(total))


def _log_a_fractional(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for real α > 1 by the trapezoidal rule on z (Mironov, Talwar & Zhang 2019, Eq. (3)).

    The integrand is analytic in the strip |Im z| < πσ², so a uniform grid with spacing
    min(σ, σ²)/10 makes the quadrature error smaller than e^{-190}. A_α − 1 is integrated as
    E[(1+u)^α − 1 − αu] with u = q(exp((2z−1)/(2σ²)) − 1), E[u] = 0, which is non-negative and
    free of cancellation.
    """
    alphas = np.asarray(alphas, dtype=float)
    step = min(sigma, sigma * sigma) / 10.0
    span = 14.0 * sigma + 1.0
    z = np.arange(-span, float(alphas.max()) + span + step, step)
    log_phi = -0.5 * (z / sigma) ** 2 - math.log(sigma * math.sqrt(2.0 * math.pi)) + math.log(step)
    exponent = (2.0 * z - 1.0) / (2.0 * sigma**2)
    log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + exponent) if q < 1 else exponent
    a = alphas[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.expm1(log_ratio)
        log_integrand = log_phi[None, :] + a * log_ratio[None, :]
        log_a_direct = logsumexp(log_integrand, axis=1)
        g = np.expm1(a * np.log1p(u)[None, :]) - a * u[None, :]
        a_minus_1 = np.sum(np.exp(log_phi)[None, :] * g, axis=1)
    small = np.isfinite(a_minus_1) & (a_minus_1 < 1e-3)
    return np.where(small, np.log1p(np.where(small, a_minus_1, 0.0)), log_a_direct)


def rdp_subsampled_gaussian(
    sample_rate: float, noise_multiplier: float, orders: np.ndarray | list[float]
) -> np.ndarray:
    """RDP ε(α) of one step of the Poisson-subsampled Gaussian mechanism, for each order α.

    Mironov, Talwar & Zhang (2019): ε(α) = log(A_α)/(α − 1); for q = 1 it is α/(2σ²)
    (Mironov 2017, Prop. 7). Orders must be > 1.
    """
    q = check.sample_rate(sample_rate)
    sigma = check.noise_multiplier(noise_multiplier)
    alphas = _check_orders(orders)
    if q == 1.0:
        return alphas / (2.0 * sigma**2)
    rdp = np.empty_like(alphas)
    is_int = (alphas == np.round(alphas)) & (alphas <= 1e5)
    if is_int.any():
        rdp[is_int] = _log_a_integer(q, sigma, alphas[is_int]) / (alphas[is_int] - 1.0)
    if (~is_int).any():
        fractional = alphas[~is_int]
        step = min(sigma, sigma * sigma) / 10.0
        if (28.0 * sigma + 2.0 + float(fractional.max())) / step > MAX_QUADRATURE_POINTS:
            # Too fine a quadrature grid for small σ: RDP is non-decreasing in α (Mironov 2017,
            # Prop. 9), so its exact value at the integer order ⌈α⌉ bounds order α from above.
            rdp[~is_int] = _rdp_at_integer_orders_above(q, sigma, fractional)
        else:
            rdp[~is_int] = _log_a_fractional(q, sigma, fractional) / (fractional - 1.0)
    return rdp


def _rdp_at_integer_orders_above(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """RDP at ⌈α⌉ for each order α: an upper bound on the RDP at α, since the RDP of a
    mechanism is non-decreasing in α (Mironov 2017, Prop. 9)."""
    rounded = np.maximum(np.ceil(alphas), 2.0)
    if rounded.max() > 1e5:
        raise check.PrivacyParameterError(
            f"noise multiplier {sigma:g} is too small for Rényi orders above 1e5"
        )
    unique, inverse = np.unique(rounded, return_inverse=True)
    return (_log_a_integer(q, sigma, unique) / (unique - 1.0))[inverse]


def rdp_gaussian(noise_multiplier: float, orders: np.ndarray | list[float]) -> np.ndarray:
    """RDP of the Gaussian mechanism: α/(2σ²) (Mironov 2017, Prop. 7)."""
    sigma = check.noise_multiplier(noise_multiplier)
    return _check_orders(orders) / (2.0 * sigma**2)


def rdp_laplace(scale: float, orders: np.ndarray | list[float]) -> np.ndarray:
    """RDP of the Laplace mechanism with scale b (Mironov 2017, Table II / Prop. 6):
    (1/(α−1)) log( α/(2α−1) e^{(α−1)/b} + (α−1)/(2α−1) e^{−α/b} ), capped at the pure ε = 1/b."""
    b = check.positive("Laplace scale", scale)
    a = _check_orders(orders)
    log_terms = np.logaddexp(
        np.log(a / (2 * a - 1)) + (a - 1) / b, np.log((a - 1) / (2 * a - 1)) - a / b
    )
    return np.minimum(log_terms / (a - 1), 1.0 / b)


def rdp_randomized_response(
    event: RandomizedResponse, orders: np.ndarray | list[float]
) -> np.ndarray:
    """RDP of k-ary randomized response (Mironov 2017, Table II for k = 2; the same Rényi
    divergence for k categories): with p the keep probability and r = (1−p)/(k−1),
    (1/(α−1)) log( p^α r^{1−α} + r^α p^{1−α} + (k−2) r ), capped at the pure ε."""
    a = _check_orders(orders)
    p = float(event.keep_probability or 0.0)
    r = (1.0 - p) / (event.k - 1)
    parts = [a * math.log(p) + (1 - a) * math.log(r), a * math.log(r) + (1 - a) * math.log(p)]
    if event.k > 2:
        parts.append(np.full_like(a, math.log((event.k - 2) * r)))
    return np.minimum(logsumexp(np.stack(parts), axis=0) / (a - 1), event.eps)


def rdp_of_event(event: Event, orders: np.ndarray | list[float]) -> np.ndarray:
    """RDP curve of one leaf event (see `privacylab.accounting.events.flatten`)."""
    if isinstance(event, Gaussian):
        return rdp_gaussian(event.noise_multiplier, orders)
    if isinstance(event, Laplace):
        return rdp_laplace(event.scale, orders)
    if isinstance(event, RandomizedResponse):
        return rdp_randomized_response(event, orders)
    if isinstance(event, PoissonSampled) and isinstance(event.event, Gaussian):
        return rdp_subsampled_gaussian(event.sample_rate, event.event.noise_multiplier, orders)
    raise check.PrivacyParameterError(
        f"the RDP accountant has no bound for {_describe(event)}; use the PLD accountant"
    )


def _describe(event: Event) -> str:
    if isinstance(event, PoissonSampled):
        return f"Poisson-sampled {type(event.event).__name__}"
    return type(event).__name__


def _check_orders(orders: np.ndarray | list[float]) -> np.ndarray:
    alphas = np.atleast_1d(np.asarray(orders, dtype=float))
    if alphas.ndim != 1 or alphas.size == 0 or not np.all(np.isfinite(alphas)):
        raise check.PrivacyParameterError("Rényi orders must be a non-empty list of finite numbers")
    if np.any(alphas <= 1.0):
        raise check.PrivacyParameterError("Rényi orders must all be > 1")
    return alphas


def rdp_to_epsilon(
    orders: np.ndarray, rdp: np.ndarray, delta: float, conversion: str = "tight"
) -> tuple[float, float]:
    """Smallest ε over the orders at `delta`, and the order achieving it.

    tight: ε = RDP_α + log((α−1)/α) − (log δ + log α)/(α−1)  (Balle et al. 2020, Thm 21);
    classic: ε = RDP_α + log(1/δ)/(α−1)  (Mironov 2017, Prop. 3).
    """
    d = check.delta(delta)
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if conversion == "tight":
        eps = r + np.log1p(-1.0 / a) - (math.log(d) + np.log(a)) / (a - 1.0)
    elif conversion == "classic":
        eps = r + math.log(1.0 / d) / (a - 1.0)
    else:
        raise check.PrivacyParameterError(
            f"unknown RDP conversion {conversion!r}; choose one of {', '.join(CONVERSIONS)}"
        )
    eps = np.where(np.isnan(eps), np.inf, eps)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def rdp_to_delta(
    orders: np.ndarray, rdp: np.ndarray, epsilon: float, conversion: str = "tight"
) -> tuple[float, float]:
    """Smallest δ over the orders at `epsilon`, and the order achieving it (inverse of
    `rdp_to_epsilon`, same theorems)."""
    eps = check.nonnegative("epsilon", epsilon)
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if conversion == "tight":
        log_delta = (a - 1.0) * (r - eps + np.log1p(-1.0 / a)) - np.log(a)
    elif conversion == "classic":
        log_delta = (a - 1.0) * (r - eps)
    else:
        raise check.PrivacyParameterError(
            f"unknown RDP conversion {conversion!r}; choose one of {', '.join(CONVERSIONS)}"
        )
    log_delta = np.where(np.isnan(log_delta), np.inf, log_delta)
    best = int(np.argmin(log_delta))
    return min(1.0, math.exp(min(float(log_delta[best]), 0.0))), float(a[best])


class RdpAccountant(Accountant):
    """Rényi DP accountant (the moments accountant, Abadi et al. 2016 Sec. 3.2, in Mironov's RDP).

    Parameters
    ----------
    orders:
        Rényi orders α > 1 to track; `DEFAULT_ORDERS` if omitted.
    conversion:
        "tight" (Balle et al. 2020, Thm 21; default) or "classic" (ε = RDP + log(1/δ)/(α−1),
        as in Abadi et al. and TF Privacy before 2020, to reproduce published numbers).
    """

    def __init__(
        self, orders: np.ndarray | list[float] | None = None, conversion: str = "tight"
    ) -> None:
        super().__init__()
        self.orders = _check_orders(DEFAULT_ORDERS if orders is None else orders)
        if conversion not in CONVERSIONS:
            raise check.PrivacyParameterError(
                f"unknown RDP conversion {conversion!r}; choose one of {', '.join(CONVERSIONS)}"
            )
        self.conversion = conversion
        self.name = "rdp" if conversion == "tight" else "rdp-classic"
        self._rdp = np.zeros_like(self.orders)
        self._cache: dict[Event, np.ndarray] = {}

    def _check_supported(self, event: Event) -> None:
        if isinstance(event, PoissonSampled) and not isinstance(event.event, Gaussian):
            rdp_of_event(event, self.orders[:1])

    def compose(self, event: Event, count: int = 1) -> RdpAccountant:
        """Add `count` repetitions of `event`; RDP adds up (Mironov 2017, Prop. 1)."""
        before = len(self._events)
        super().compose(event, count)
        for leaf, n in self._events[before:]:
            if leaf not in self._cache:
                self._cache[leaf] = rdp_of_event(leaf, self.orders)
            self._rdp = self._rdp + n * self._cache[leaf]
        return self

    @property
    def rdp(self) -> np.ndarray:
        """The accumulated RDP curve, one value per order in `self.orders`."""
        return self._rdp.copy()

    def guarantee(self, delta: float) -> Guarantee:
        """ε at `delta`, minimised over the orders; reports the optimal order."""
        eps, order = rdp_to_epsilon(self.orders, self._rdp, delta, self.conversion)
        note = None
        if order in (self.orders.min(), self.orders.max()):
            note = f"optimal Rényi order {order:g} is at the edge of the searched orders"
        return Guarantee(eps, float(delta), self.name, order, note)

    def delta(self, epsilon: float) -> float:
        """δ at `epsilon`, minimised over the orders."""
        return rdp_to_delta(self.orders, self._rdp, epsilon, self.conversion)[0]
