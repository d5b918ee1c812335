"""Privacy loss distributions (PLD) with pessimistic connect-the-dots discretisation.

A PLD is the distribution of the privacy loss L = log(P(o)/Q(o)) for o ∼ P, for a dominating pair
(P, Q) of the mechanism (Koskela, Jälkö & Honkela 2020; Zhu, Dong & Wang 2022). Then
δ(ε) = E_P[(1 − e^{ε−L})_+] (Koskela et al. 2020, Eq. (5)) and composition is convolution.

Discretisation follows Doroshenko, Ghazi, Kamath, Kumar & Manurangsi (2022), "Connect the Dots:
Tighter Discrete Approximations of Privacy Loss Distributions", Algorithm 1: on the grid
ε_j = j·h, the probability in each loss interval (ε_j, ε_{j+1}] is split between its two end
points so that both its P-mass and its Q-mass are kept. Merging those two atoms back into one is
post-processing, so the discrete pair dominates the true one: every δ(ε) it gives is an upper
bound, and the error is second order in h instead of the first-order error of rounding up. Mass
outside the grid goes to +∞ (above) or to the lowest grid point (below) — both pessimistic.

Composition uses the FFT (Koskela et al. 2020, Alg. 1). For T-fold self-composition the range
of the sum is cut by a Chernoff bound and the cut mass is added to the mass at +∞, so the result
stays an upper bound. The one approximation left is float64 round-off in the FFT (~1e-19 per grid
point after thousands of compositions), which matters only for δ below ~1e-11; for smaller δ use
the RDP accountant. Poisson subsampling of a pair (A, B) gives two dominating pairs —
((1−q)B + qA, B) for removal and (B, (1−q)B + qA) for addition (Zhu, Dong & Wang 2022, Thm 10) —
both tracked; ε is the larger of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import fft as sp_fft
from scipy.special import log_ndtr, ndtri

from privacylab.accounting import _validate as check
from privacylab.accounting.base import Accountant, Guarantee
from privacylab.accounting.events import (
    Event,
    Gaussian,
    Laplace,
    PoissonSampled,
    RandomizedResponse,
)

DEFAULT_TAIL_MASS = 1e-15
"""Total probability an accountant leaves out of its grids; it is charged to δ (never dropped),
so every δ it reports is at least this. Ask for a smaller one to certify δ below ~1e-12."""

DEFAULT_DISCRETIZATION = 1e-4
"""Grid spacing h used when none is given, as dp_accounting's PLDAccountant."""

MAX_GRID_POINTS = 20_000_000
"""Largest grid (single step or composed) before asking for a coarser discretisation."""


def _normal_interval_masses(edges: np.ndarray) -> np.ndarray:
    """Φ(e_{i+1}) − Φ(e_i) for the intervals between sorted edges (±∞ allowed), with full
    relative precision in both tails: lower CDFs left of 0, survival functions right of it."""
    log_cdf = log_ndtr(edges)
    log_sf = log_ndtr(-edges)
    a_cdf, b_cdf = log_cdf[:-1], log_cdf[1:]
    a_sf, b_sf = log_sf[:-1], log_sf[1:]
    right = edges[:-1] > 0
    hi = np.where(right, a_sf, b_cdf)
    lo = np.where(right, b_sf, a_cdf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mass = np.exp(hi) * -np.expm1(lo - hi)
    return np.where(np.isfinite(mass) & (edges[1:] > edges[:-1]), mass, 0.0)


class _GaussianPair:
    """A = N(1, σ²), B = N(0, σ²); t = log(A/B) is N(±μ²/2, μ²) with μ = 1/σ."""

    def __init__(self, noise_multiplier: float) -> None:
        self.mu = 1.0 / check.noise_multiplier(noise_multiplier)

    def t_range(self, tail: float) -> tuple[float, float]:
        c = -float(ndtri(tail))
        return -0.5 * self.mu**2 - c * self.mu, 0.5 * self.mu**2 + c * self.mu

    def masses(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        full = np.concatenate([[-np.inf], edges, [np.inf]])
        half = 0.5 * self.mu**2
        mass_a = _normal_interval_masses((full - half) / self.mu)
        mass_b = _normal_interval_masses((full + half) / self.mu)
        return mass_a, mass_b


class _LaplacePair:
    """A = Lap(1, b), B = Lap(0, b); t = (|z| − |z − 1|)/b ∈ [−1/b, 1/b] with atoms at the ends."""

    def __init__(self, scale: float) -> None:
        self.beta = 1.0 / scale

    def t_range(self, tail: float) -> tuple[float, float]:
        return -self.beta, self.beta

    def _cdfs(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        beta = self.beta
        inside = np.clip((t / beta + 1.0) / 2.0, 0.0, 1.0)
        cdf_a = np.where(
            t < -beta, 0.0, np.where(t >= beta, 1.0, 0.5 * np.exp(-(1 - inside) * beta))
        )
        cdf_b = np.where(
            t < -beta, 0.0, np.where(t >= beta, 1.0, 1.0 - 0.5 * np.exp(-inside * beta))
        )
        return cdf_a, cdf_b

    def masses(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cdf_a, cdf_b = self._cdfs(np.asarray(edges, dtype=float))
        full_a = np.concatenate([[0.0], cdf_a, [1.0]])
        full_b = np.concatenate([[0.0], cdf_b, [1.0]])
        return np.clip(np.diff(full_a), 0, None), np.clip(np.diff(full_b), 0, None)


class _DiscretePair:
    """Finitely many outcomes with probabilities A(o), B(o) > 0; t(o) = log(A(o)/B(o))."""

    def __init__(self, prob_a: np.ndarray, prob_b: np.ndarray) -> None:
        self.t = np.log(prob_a) - np.log(prob_b)
        order = np.argsort(self.t)
        self.t, self.a, self.b = self.t[order], np.asarray(prob_a)[order], np.asarray(prob_b)[order]

    def t_range(self, tail: float) -> tuple[float, float]:
        return float(self.t[0]), float(self.t[-1])

    def masses(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        slot = np.searchsorted(np.asarray(edges, dtype=float), self.t, side="left")
        size = len(edges) + 1
        return (
            np.bincount(slot, weights=self.a, minlength=size),
            np.bincount(slot, weights=self.b, minlength=size),
        )


def _pair_of(event: Event) -> tuple[_GaussianPair | _LaplacePair | _DiscretePair, float]:
    q = 1.0
    if isinstance(event, PoissonSampled):
        q, event = event.sample_rate, event.event
    if isinstance(event, Gaussian):
        return _GaussianPair(event.noise_multiplier), q
    if isinstance(event, Laplace):
        return _LaplacePair(event.scale), q
    if isinstance(event, RandomizedResponse):
        p = float(event.keep_probability or 0.0)
        r = (1.0 - p) / (event.k - 1)
        prob_a = np.array([p, r] + [r] * (event.k - 2))
        prob_b = np.array([r, p] + [r] * (event.k - 2))
        return _DiscretePair(prob_a, prob_b), q
    raise check.PrivacyParameterError(f"the PLD accountant has no model of {event!r}")


def _loss_of_t(t: float, q: float, remove: bool) -> float:
    """Privacy loss of the subsampled pair as a function of the base loss t."""
    base = t if q == 1.0 else float(np.logaddexp(math.log1p(-q), math.log(q) + t))
    return base if remove else -base


def _t_of_loss(loss: np.ndarray, q: float) -> np.ndarray:
    """Inverse of t ↦ log(1 − q + q e^t): log((e^ε − 1 + q)/q), −∞ where e^ε ≤ 1 − q."""
    if q == 1.0:
        return np.asarray(loss, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = np.expm1(loss) + q
        return np.where(inner > 0, np.log(np.where(inner > 0, inner, 1.0)) - math.log(q), -np.inf)


def _single_step_pld(
    event: Event, step: float, remove: bool, tail: float
) -> PrivacyLossDistribution:
    """Connect-the-dots PLD of one (possibly Poisson-subsampled) mechanism, one direction."""
    pair, q = _pair_of(event)
    t_lo, t_hi = pair.t_range(tail)
    ends = sorted([_loss_of_t(t_lo, q, remove), _loss_of_t(t_hi, q, remove)])
    j_lo, j_hi = math.floor(ends[0] / step) - 1, math.ceil(ends[1] / step) + 1
    if j_hi - j_lo + 1 > MAX_GRID_POINTS:
        raise check.PrivacyParameterError(
            f"the privacy-loss grid would need {j_hi - j_lo + 1:,} points; "
            "use a larger discretisation interval"
        )
    grid = np.arange(j_lo, j_hi + 1) * step
    if remove:
        mass_a, mass_b = pair.masses(_t_of_loss(grid, q))
    else:
        mass_a, mass_b = pair.masses(_t_of_loss(-grid[::-1], q))
        mass_a, mass_b = mass_a[::-1], mass_b[::-1]
    mix = (1.0 - q) * mass_b + q * mass_a
    mass_p, mass_q = (mix, mass_b) if remove else (mass_b, mix)
    return _connect_the_dots(grid, j_lo, step, mass_p, mass_q)


def _connect_the_dots(
    grid: np.ndarray, j_lo: int, step: float, mass_p: np.ndarray, mass_q: np.ndarray
) -> PrivacyLossDistribution:
    """Doroshenko et al. (2022), Alg. 1: split each interval's mass between its end points.

    `mass_p`/`mass_q` hold, for the intervals (−∞, ε_0], (ε_0, ε_1], …, (ε_m, ∞), the P- and
    Q-probability of the loss falling there. The upper end point receives P-mass
    (ΔP − e^{ε_j}ΔQ)/(1 − e^{−h}), the lower one the rest — which keeps ΔP and ΔQ.
    """
    inner_p, inner_q = mass_p[1:-1], mass_q[1:-1]
    with np.errstate(over="ignore", invalid="ignore"):
        up = (inner_p - np.exp(grid[:-1]) * inner_q) / -math.expm1(-step)
    up = np.clip(np.nan_to_num(up, nan=0.0, posinf=np.inf), 0.0, inner_p)
    pmf = np.zeros(len(grid))
    pmf[:-1] += inner_p - up
    pmf[1:] += up
    pmf[0] += mass_p[0]
    return PrivacyLossDistribution(step, j_lo, pmf, float(mass_p[-1]))


@dataclass
class PrivacyLossDistribution:
    """P-probabilities of the privacy loss on the grid (offset + i)·step, plus mass at +∞.

    A pessimistic (upper-bounding) representation: total mass may exceed 1 by the tail mass
    charged to +∞.
    """

    step: float
    offset: int
    pmf: np.ndarray
    infinity_mass: float = 0.0

    @property
    def losses(self) -> np.ndarray:
        """The privacy-loss value of each entry of `pmf`."""
        return (self.offset + np.arange(len(self.pmf))) * self.step

    def _tail_sums(self) -> tuple[np.ndarray, np.ndarray]:
        """S_j = Σ_{i≥j} p_i and R_j = Σ_{i≥j} p_i e^{l_j − l_i}, both without cancellation."""
        from scipy.signal import lfilter

        tail = np.cumsum(self.pmf[::-1])[::-1]
        weighted = lfilter([1.0], [1.0, -math.exp(-self.step)], self.pmf[::-1])[::-1]
        return tail, weighted

    def delta(self, epsilon: float) -> float:
        """δ(ε) = Σ_{l_i > ε} p_i (1 − e^{ε − l_i}) + p_∞  (Koskela et al. 2020, Eq. (5))."""
        eps = float(epsilon)
        losses = self.losses
        above = losses > eps
        if not above.any():
            return min(1.0, self.infinity_mass)
        p, losses = self.pmf[above], losses[above]
        value = float(np.sum(p * -np.expm1(eps - losses))) + self.infinity_mass
        return min(1.0, value)

    def epsilon(self, delta: float) -> float:
        """Smallest ε ≥ 0 with δ(ε) ≤ `delta`; +∞ if the mass at +∞ alone exceeds it."""
        target = check.delta(delta)
        if self.infinity_mass >= target:
            return math.inf
        tail, weighted = self._tail_sums()
        at_grid = (
            np.append(tail[1:] - math.exp(-self.step) * weighted[1:], 0.0) + self.infinity_mass
        )
        first = int(np.argmax(at_grid <= target))
        losses = self.losses
        if first == 0:
            eps = losses[0]
        else:
            ratio = (tail[first] + self.infinity_mass - target) / weighted[first]
            eps = losses[first] + math.log(ratio) if ratio > 0 else losses[first]
            eps = min(max(eps, losses[first - 1]), losses[first])
        return max(0.0, float(eps))

    def compose(
        self, other: PrivacyLossDistribution, tail: float = DEFAULT_TAIL_MASS
    ) -> PrivacyLossDistribution:
        """The PLD of running both mechanisms: the convolution of the two (Koskela et al. 2020)."""
        if not math.isclose(self.step, other.step, rel_tol=1e-12):
            raise check.PrivacyParameterError("cannot compose PLDs with different discretisations")
        from scipy.signal import fftconvolve

        a, b = self.truncate(tail), other.truncate(tail)
        pmf = np.clip(fftconvolve(a.pmf, b.pmf), 0.0, None)
        total_a, total_b = a.pmf.sum(), b.pmf.sum()
        infinity = a.infinity_mass * (total_b + b.infinity_mass) + b.infinity_mass * total_a
        return PrivacyLossDistribution(a.step, a.offset + b.offset, pmf, float(infinity))

    def truncate(self, tail: float = DEFAULT_TAIL_MASS) -> PrivacyLossDistribution:
        """Drop up to `tail` mass from each end, pessimistically: the lower end's mass is moved
        up to the first kept point, the upper end's to +∞."""
        pmf = self.pmf
        low = int(np.searchsorted(np.cumsum(pmf), tail, side="right"))
        high = len(pmf) - int(np.searchsorted(np.cumsum(pmf[::-1]), tail, side="right"))
        low, high = min(low, len(pmf) - 1), max(high, low + 1)
        kept = pmf[low:high].copy()
        kept[0] += pmf[:low].sum()
        infinity = self.infinity_mass + float(pmf[high:].sum())
        return PrivacyLossDistribution(self.step, self.offset + low, kept, infinity)

    def self_compose(self, count: int, tail: float = DEFAULT_TAIL_MASS) -> PrivacyLossDistribution:
        """`count`-fold composition by one FFT power (Koskela et al. 2020, Alg. 1).

        The sum's range is cut to [a, b] with P(sum < a), P(sum > b) ≤ `tail` by Chernoff
        bounds; the cyclic FFT folds what lies outside back into range (only adding mass), and
        the bound on it is charged to +∞.
        """
        count = check.count(count, "composition count")
        if count == 1:
            return self
        base = self.truncate(tail / count)
        total = float(base.pmf.sum())
        weights = base.pmf / total
        n = len(weights)
        full_width = count * (n - 1) + 1
        low, high = _chernoff_range(weights, count, tail)
        cut = high - low + 1 < full_width
        if not cut:
            low, high = 0, full_width - 1
        size = sp_fft.next_fast_len(high - low + 1, real=True)
        if size > MAX_GRID_POINTS:
            raise check.PrivacyParameterError(
                f"the composed privacy-loss grid would need {size:,} points (epsilon is very "
                "large); use a larger discretisation interval or the RDP accountant"
            )
        folded = weights
        if n > size:
            folded = np.pad(weights, (0, -n % size)).reshape(-1, size).sum(axis=0)
        spectrum = sp_fft.rfft(folded, size)
        cyclic = sp_fft.irfft(_power(spectrum, count), size)
        start = low % size
        composed = np.concatenate([cyclic[start:], cyclic[:start]])[: high - low + 1]
        np.clip(composed, 0.0, None, out=composed)
        finite = total**count
        infinity = finite * math.expm1(count * math.log1p(base.infinity_mass / total))
        if cut:
            infinity += 2.0 * tail * finite
        return PrivacyLossDistribution(
            self.step, count * base.offset + low, composed * finite, float(infinity)
        )


def _power(spectrum: np.ndarray, count: int) -> np.ndarray:
    """spectrum**count in polar form; entries whose power underflows double precision are left
    at 0 without evaluating them (at large counts that is most of them)."""
    re, im = spectrum.real, spectrum.imag
    with np.errstate(divide="ignore"):
        log_power = (0.5 * count) * np.log(re * re + im * im)
    keep = np.flatnonzero(log_power > -745.0)
    powered = np.zeros_like(spectrum)
    angle = count * np.arctan2(im[keep], re[keep])
    magnitude = np.exp(log_power[keep])
    powered[keep] = magnitude * np.cos(angle) + 1j * (magnitude * np.sin(angle))
    return powered


def _chernoff_range(weights: np.ndarray, count: int, tail: float) -> tuple[int, int]:
    """Index range [a, b] of a sum S of `count` i.i.d. draws from `weights` (a pmf on 0..n−1)
    holding all but `tail` on each side, by the Chernoff bound
    P(S ≥ b) ≤ exp(T·K(λ) − λb), K the log-MGF, minimised over λ (any λ gives a valid bound)."""
    from scipy.optimize import minimize_scalar

    n = len(weights)
    nz = np.flatnonzero(weights > 0)
    w = weights[nz]
    log_w = np.log(w)
    index = nz.astype(float)
    mean = float(np.dot(w, index))
    centred = index - mean
    var = max(float(np.dot(w, centred * centred)), 1e-12)
    log_tail = math.log(tail)
    lam0 = math.sqrt(2.0 * -log_tail / (count * var))

    def bound(log_lam: float, sign: float) -> float:
        lam = sign * math.exp(log_lam)
        shift = log_w + lam * centred
        top = float(shift.max())
        k = top + math.log(float(np.exp(shift - top).sum()))
        return sign * (count * mean + (count * k - log_tail) / lam)

    span = (math.log(lam0) - 5.0, math.log(lam0) + 5.0)
    high = minimize_scalar(
        bound, bounds=span, args=(1.0,), method="bounded", options={"xatol": 0.05}
    ).fun
    low = -minimize_scalar(
        bound, bounds=span, args=(-1.0,), method="bounded", options={"xatol": 0.05}
    ).fun
    high = min(count * (n - 1), math.ceil(high))
    low = max(0, math.floor(low))
    return low, max(high, low)


class PldAccountant(Accountant):
    """Privacy-loss-distribution accountant: pessimistic connect-the-dots PLDs + FFT composition.

    Parameters
    ----------
    value_discretization_interval:
        Grid spacing h of the privacy loss (default 1e-4). Smaller is tighter and slower; every
        value is an upper bound whatever h.
    tail_mass:
        Probability cut from each tail of every grid; it is charged to δ, never dropped.
    """

    name = "pld"

    def __init__(
        self,
        value_discretization_interval: float | None = None,
        tail_mass: float = DEFAULT_TAIL_MASS,
    ) -> None:
        super().__init__()
        self.value_discretization_interval = (
            None
            if value_discretization_interval is None
            else check.positive("discretization interval", value_discretization_interval)
        )
        if not (1e-100 <= float(tail_mass) <= 1e-6):
            raise check.PrivacyParameterError(
                f"tail mass must be in [1e-100, 1e-6], got {tail_mass!r}"
            )
        self.tail_mass = float(tail_mass)
        self._composed: tuple[PrivacyLossDistribution, PrivacyLossDistribution] | None = None

    def _check_supported(self, event: Event) -> None:
        _pair_of(event)

    def _changed(self) -> None:
        self._composed = None

    @property
    def step(self) -> float:
        """The grid spacing in use."""
        if self.value_discretization_interval is not None:
            return self.value_discretization_interval
        return DEFAULT_DISCRETIZATION

    def distributions(self) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
        """The composed PLDs for removal and for addition of one record.

        Without subsampling, the Gaussian, Laplace and randomized-response pairs are symmetric
        (the loss of (B, A) is distributed as that of (A, B)), so one PLD serves both.
        """
        if self._composed is None:
            removal = self._compose_direction(True)
            if all(_pair_of(event)[1] == 1.0 for event, _ in self._events):
                self._composed = (removal, removal)
            else:
                self._composed = (removal, self._compose_direction(False))
        assert self._composed is not None
        return self._composed

    def _compose_direction(self, remove: bool) -> PrivacyLossDistribution:
        step = self.step
        tail = self.tail_mass / (8.0 * max(1, len(self._events)))
        result: PrivacyLossDistribution | None = None
        for event, count in self._events:
            single = _single_step_pld(event, step, remove, tail / count)
            part = single.self_compose(count, tail)
            result = part if result is None else result.compose(part, tail)
        if result is None:
            return PrivacyLossDistribution(step, 0, np.ones(1), 0.0)
        return result

    def guarantee(self, delta: float) -> Guarantee:
        """ε at `delta`: the larger of the removal and addition PLDs' ε."""
        d = check.delta(delta)
        eps = max(pld.epsilon(d) for pld in self.distributions())
        return Guarantee(eps, d, self.name, None, None)

    def delta(self, epsilon: float) -> float:
        """δ at `epsilon`: the larger of the removal and addition PLDs' δ."""
        eps = check.nonnegative("epsilon", epsilon)
        return max(pld.delta(eps) for pld in self.distributions())
