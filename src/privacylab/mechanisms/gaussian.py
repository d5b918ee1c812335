"""The Gaussian mechanism: classical and analytic calibration of σ, exact ε, and the noise."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from privacylab.accounting import _validate as check
from privacylab.accounting.events import EventLedger, Gaussian
from privacylab.accounting.gdp import gaussian_delta, gaussian_epsilon
from privacylab.mechanisms._checks import finite_array, generator

_ROUND_UP = 1.0 + 1e-12


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """σ = Δ √(2 ln(1.25/δ)) / ε of the classical Gaussian mechanism.

    Dwork & Roth 2014, Theorem A.1: (ε, δ)-DP for ε ∈ (0, 1) only; for ε ≥ 1 use
    `analytic_gaussian_sigma`, which is valid (and smaller) for every ε.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.delta(delta)
    sensitivity = check.positive("sensitivity", sensitivity)
    if epsilon >= 1.0:
        raise check.PrivacyParameterError(
            f"the classical Gaussian calibration needs epsilon < 1, got {epsilon!r}; "
            "use analytic_gaussian_sigma"
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _log_gap(epsilon: float, delta: float, mu: float) -> float:
    value = float(gaussian_delta(epsilon, mu))
    return (math.log(value) if value > 0.0 else -math.inf) - math.log(delta)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ for which the Gaussian mechanism with L2 sensitivity Δ is (ε, δ)-DP.

    Balle & Wang 2018, "Improving the Gaussian mechanism for differential privacy", Theorem 8 and
    Algorithm 1: σ is the smallest value with Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ.
    Solved here by Brent's method on log δ(ε; μ = Δ/σ), which is increasing in μ, instead of the
    paper's α-search. The result is rounded up (relative 1e-12) so it is never below the minimum.
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.delta(delta)
    sensitivity = check.positive("sensitivity", sensitivity)
    lo = hi = epsilon / math.sqrt(2.0 * math.log(1.25 / delta)) + math.sqrt(2.0 * epsilon)
    while _log_gap(epsilon, delta, lo) > 0.0:
        lo /= 2.0
    while _log_gap(epsilon, delta, hi) <= 0.0:
        hi *= 2.0
    mu = optimize.brentq(
        lambda m: _log_gap(epsilon, delta, m), lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps
    )
    sigma = sensitivity / mu * _ROUND_UP
    while _log_gap(epsilon, delta, sensitivity / sigma) > 0.0:
        sigma *= _ROUND_UP
    return sigma


def gaussian_epsilon_for(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Exact ε at `delta` of the Gaussian mechanism with noise σ and L2 sensitivity Δ.

    Inverse of Balle & Wang 2018, Theorem 8 in ε, with μ = Δ/σ (see `gaussian_epsilon`).
    """
    sigma = check.positive("sigma", sigma)
    sensitivity = check.positive("sensitivity", sensitivity)
    return float(gaussian_epsilon(check.delta(delta), sensitivity / sigma))


def add_gaussian_noise(
    value: ArrayLike,
    sigma: float,
    rng: np.random.Generator | int,
    *,
    sensitivity: float = 1.0,
    ledger: EventLedger | None = None,
) -> np.ndarray:
    """`value` + N(0, σ² I), the Gaussian mechanism (Dwork & Roth 2014, Definition A.1).

    `rng` is a numpy Generator or an integer seed. With a `ledger`, the release is recorded as
    the event `Gaussian(σ / sensitivity)` (`sensitivity`: the L2 sensitivity of `value`), so an
    accountant can bound everything a program released.
    """
    array = finite_array("value", value)
    sigma = check.positive("sigma", sigma)
    sensitivity = check.positive("sensitivity", sensitivity)
    noisy = array + generator(rng).normal(0.0, sigma, size=array.shape)
    if ledger is not None:
        ledger.record(Gaussian(sigma / sensitivity))
    return noisy
