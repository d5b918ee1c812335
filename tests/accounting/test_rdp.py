"""RDP accountant: cross-checked against Opacus, high-precision mpmath and published values."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from opacus.accountants.analysis.rdp import compute_rdp

from privacylab.accounting import (
    Gaussian,
    Laplace,
    PoissonSampled,
    PrivacyParameterError,
    RandomizedResponse,
    RdpAccountant,
    dp_sgd,
    steps_from_epochs,
)
from privacylab.accounting.rdp import (
    rdp_laplace,
    rdp_randomized_response,
    rdp_subsampled_gaussian,
    rdp_to_epsilon,
)

OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))

SETTINGS = [
    (sigma, q, steps)
    for sigma in (0.5, 0.8, 1.1, 2.0, 4.0, 10.0)
    for q, steps in ((1e-4, 100000), (1e-3, 1000), (0.01, 10000), (0.1, 100), (0.5, 10), (1.0, 3))
]


@pytest.mark.parametrize(("sigma", "q", "steps"), SETTINGS)
def test_matches_opacus_on_the_same_orders(sigma: float, q: float, steps: int) -> None:
    ours = steps * rdp_subsampled_gaussian(q, sigma, OPACUS_ORDERS)
    theirs = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=OPACUS_ORDERS)
    finite = np.isfinite(theirs)
    alphas = np.asarray(OPACUS_ORDERS)
    # Opacus sums a signed series for log A_α ≈ 0 in float64; its absolute error reaches
    # ~1e-13 per step (ours is checked against 40-digit mpmath below), so compare with
    # rtol 1e-6 above that floor.
    float_floor = 1e-12 * steps / (alphas - 1)
    assert np.any(finite)
    assert np.all(
        np.abs(ours - theirs)[finite] <= 1e-6 * np.abs(theirs[finite]) + float_floor[finite]
    )


def _mp_log_a(q: float, sigma: float, alpha: float) -> float:
    """log A_α to 40 digits: exact binomial sum for integer α, quadrature of A_α − 1 otherwise."""
    mpmath.mp.dps = 40
    q_, s_ = mpmath.mpf(q), mpmath.mpf(sigma)
    if alpha == int(alpha):
        a = int(alpha)
        total = mpmath.fsum(
            mpmath.binomial(a, k)
            * (1 - q_) ** (a - k)
            * q_**k
            * mpmath.expm1((k * k - k) / (2 * s_**2))
            for k in range(2, a + 1)
        )
        return float(mpmath.log1p(total))

    def g(z: mpmath.mpf) -> mpmath.mpf:
        u = q_ * mpmath.expm1((2 * z - 1) / (2 * s_**2))
        return mpmath.npdf(z, 0, s_) * ((1 + u) ** alpha - 1 - alpha * u)

    points = [-mpmath.inf, -5 * s_, 0, 0.5, alpha, alpha + 5 * s_, mpmath.inf]
    return float(mpmath.log1p(mpmath.quad(g, points)))


@pytest.mark.parametrize(
    ("q", "sigma"),
    [(1e-4, 10.0), (0.004267, 1.1), (0.01, 4.0), (0.02, 0.6), (0.5, 0.5), (0.9, 2.0)],
)
def test_matches_high_precision_oracle(q: float, sigma: float) -> None:
    orders = [1.05, 1.5, 2.0, 3.0, 4.5, 10.0, 32.0, 63.0]
    ours = rdp_subsampled_gaussian(q, sigma, orders)
    exact = np.array([_mp_log_a(q, sigma, a) / (a - 1) for a in orders])
    np.testing.assert_allclose(ours, exact, rtol=1e-8)


def test_full_batch_is_the_gaussian_mechanism() -> None:
    orders = np.array([1.5, 2.0, 7.0])
    np.testing.assert_allclose(rdp_subsampled_gaussian(1.0, 2.0, orders), orders / 8.0)


@pytest.mark.parametrize(
    ("name", "conversion", "expected", "tol"),
    [
        # TF Privacy MNIST tutorial: σ=1.1, q=256/60000, 60 epochs, δ=1e-5.
        ("tf-mnist", "classic", 3.01, 0.01),
        ("tf-mnist", "tight", 2.597, 0.005),
        # Abadi et al. 2016: q=0.01, σ=4, δ=1e-5, 100 epochs.
        ("abadi", "classic", 1.26, 0.01),
        ("abadi", "tight", 1.036, 0.005),
    ],
)
def test_published_values(name: str, conversion: str, expected: float, tol: float) -> None:
    sigma, q, epochs = {"tf-mnist": (1.1, 256 / 60000, 60), "abadi": (4.0, 0.01, 100)}[name]
    acc = RdpAccountant(conversion=conversion).compose(
        dp_sgd(sigma, q, steps_from_epochs(epochs, q))
    )
    g = acc.guarantee(1e-5)
    assert g.epsilon == pytest.approx(expected, abs=tol)
    assert g.order is not None and g.order > 1
    assert g.accountant == ("rdp" if conversion == "tight" else "rdp-classic")


def test_tight_conversion_never_exceeds_classic() -> None:
    acc_t = RdpAccountant().compose(dp_sgd(1.0, 0.01, 1000))
    acc_c = RdpAccountant(conversion="classic").compose(dp_sgd(1.0, 0.01, 1000))
    for d in (1e-3, 1e-5, 1e-10):
        assert acc_t.epsilon(d) <= acc_c.epsilon(d)


def test_delta_and_epsilon_are_consistent() -> None:
    acc = RdpAccountant().compose(dp_sgd(1.1, 0.004, 5000))
    for d in (1e-4, 1e-7):
        eps = acc.epsilon(d)
        assert acc.delta(eps) <= d * (1 + 1e-9)
        assert acc.delta(eps * 0.98) > d


def test_laplace_and_rr_closed_forms() -> None:
    orders = np.array([2.0, 5.0, 100.0])
    b = 0.5
    expected = np.log(
        orders / (2 * orders - 1) * np.exp((orders - 1) / b)
        + (orders - 1) / (2 * orders - 1) * np.exp(-orders / b)
    ) / (orders - 1)
    np.testing.assert_allclose(rdp_laplace(b, orders), np.minimum(expected, 1 / b))
    assert rdp_laplace(b, [1e6])[0] == pytest.approx(1 / b, rel=1e-4)
    rr = RandomizedResponse(epsilon=1.0)
    p = math.e / (1 + math.e)
    alpha = 2.0
    closed = math.log(p**alpha * (1 - p) ** (1 - alpha) + (1 - p) ** alpha * p ** (1 - alpha))
    assert rdp_randomized_response(rr, [alpha])[0] == pytest.approx(closed / (alpha - 1))


def test_composition_adds_rdp() -> None:
    a = RdpAccountant().compose(Gaussian(2.0), 3).compose(Laplace(1.0))
    b = RdpAccountant()
    for _ in range(3):
        b.compose(Gaussian(2.0))
    b.compose(Laplace(1.0))
    np.testing.assert_allclose(a.rdp, b.rdp)


def test_unsupported_event_is_a_clear_error() -> None:
    with pytest.raises(PrivacyParameterError, match="PLD"):
        RdpAccountant().compose(PoissonSampled(0.1, Laplace(1.0)))


@pytest.mark.parametrize("orders", [[1.0, 2.0], [0.5], [], [float("nan")]])
def test_bad_orders(orders: list[float]) -> None:
    with pytest.raises(PrivacyParameterError):
        RdpAccountant(orders=orders)


def test_conversion_rejects_bad_delta() -> None:
    with pytest.raises(PrivacyParameterError, match="delta"):
        rdp_to_epsilon(np.array([2.0]), np.array([1.0]), 1.5)
