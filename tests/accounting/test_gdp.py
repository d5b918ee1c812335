from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.accounting.events import Gaussian, Laplace, PoissonSampled, dp_sgd
from privacylab.accounting.gdp import GdpAccountant, gaussian_delta, gaussian_epsilon

mpmath.mp.dps = 60


def exact_delta(eps: float, mu: float) -> mpmath.mpf:
    e, m = mpmath.mpf(eps), mpmath.mpf(mu)
    return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)


def exact_epsilon(delta: float, mu: float) -> mpmath.mpf:
    m = mpmath.mpf(mu)
    target = mpmath.log(mpmath.mpf(delta))
    start = mpmath.mpf(float(gaussian_epsilon(delta, mu)))
    return mpmath.findroot(lambda e: mpmath.log(exact_delta(e, m)) - target, start)


MUS = [1e-3, 0.05, 0.3, 1.0, 3.0, 10.0, 40.0]


@pytest.mark.parametrize("mu", MUS)
def test_delta_matches_mpmath_down_to_1e_300(mu: float) -> None:
    top = float(gaussian_epsilon(1e-300, mu))
    for eps in [0.0, 1e-9, *np.linspace(0.0, top, 25)[1:]]:
        reference = exact_delta(eps, mu)
        assert reference > mpmath.mpf("1e-301")
        got = gaussian_delta(eps, mu)
        assert abs(mpmath.mpf(got) - reference) <= 1e-12 * reference, (eps, mu)


def test_delta_at_zero_is_total_variation() -> None:
    for mu in MUS:
        assert gaussian_delta(0.0, mu) == pytest.approx(2 * float(mpmath.ncdf(mu / 2)) - 1, 1e-12)


def test_delta_is_vectorised_and_keeps_shape() -> None:
    eps = np.array([[0.0, 0.5], [1.0, 2.0]])
    out = gaussian_delta(eps, 1.0)
    assert isinstance(out, np.ndarray) and out.shape == (2, 2)
    assert out[1, 0] == pytest.approx(gaussian_delta(1.0, 1.0), rel=1e-15)
    assert isinstance(gaussian_delta(1.0, 1.0), float)
    assert gaussian_delta(math.inf, 1.0) == 0.0


def test_delta_agrees_with_dp_accounting() -> None:
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    for sigma in [0.5, 1.0, 4.0]:
        loss = GaussianPrivacyLoss(sigma)
        for eps in [0.1, 1.0, 3.0]:
            assert gaussian_delta(eps, 1 / sigma) == pytest.approx(
                loss.get_delta_for_epsilon(eps), rel=1e-9
            )


@pytest.mark.parametrize("mu", [0.01, 0.5, 1.0, 8.0])
@pytest.mark.parametrize("delta", [0.3, 1e-5, 1e-40, 1e-250])
def test_epsilon_matches_mpmath_root(mu: float, delta: float) -> None:
    got = gaussian_epsilon(delta, mu)
    if gaussian_delta(0.0, mu) <= delta:
        assert got == 0.0
        return
    assert abs(got - exact_epsilon(delta, mu)) <= 1e-12 * got


@settings(max_examples=60, deadline=None)
@given(
    mu=st.floats(1e-2, 30.0),
    log10_delta=st.floats(-300.0, -0.5),
)
def test_epsilon_inverts_delta(mu: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    eps = gaussian_epsilon(delta, mu)
    assert eps >= 0.0
    assert gaussian_delta(eps, mu) <= delta * (1 + 1e-12)
    if eps > 0.0:
        assert gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-9)
        assert gaussian_delta(eps * (1 - 1e-9), mu) > delta


@settings(max_examples=60, deadline=None)
@given(
    mu=st.floats(1e-2, 20.0),
    eps=st.floats(0.0, 50.0),
    step=st.floats(1e-3, 2.0),
)
def test_delta_is_monotone(mu: float, eps: float, step: float) -> None:
    assert gaussian_delta(eps + step, mu) <= gaussian_delta(eps, mu)
    assert gaussian_delta(eps, mu * (1 + step)) >= gaussian_delta(eps, mu)


def test_epsilon_vectorised_over_delta() -> None:
    out = gaussian_epsilon([1e-5, 1e-6], 1.0)
    assert out.shape == (2,) and out[0] < out[1]


@pytest.mark.parametrize(
    "call",
    [
        lambda: gaussian_delta(float("nan"), 1.0),
        lambda: gaussian_delta(-0.1, 1.0),
        lambda: gaussian_delta([0.1, -1.0], 1.0),
        lambda: gaussian_delta("one", 1.0),
        lambda: gaussian_delta(1.0, 0.0),
        lambda: gaussian_delta(1.0, float("nan")),
        lambda: gaussian_epsilon(0.0, 1.0),
        lambda: gaussian_epsilon(1.0, 1.0),
        lambda: gaussian_epsilon(1e-5, -1.0),
    ],
)
def test_bad_input_raises_one_line(call) -> None:
    with pytest.raises(PrivacyParameterError) as info:
        call()
    assert "\n" not in str(info.value)


def test_gaussian_composition_is_exact() -> None:
    acc = GdpAccountant().compose(Gaussian(2.0), 9).compose(Gaussian(1.0))
    assert acc.mu == pytest.approx(math.sqrt(9 / 4 + 1), rel=1e-15)
    g = acc.guarantee(1e-5)
    assert g.accountant == "gdp" and g.delta == 1e-5 and g.order is None
    assert g.epsilon == gaussian_epsilon(1e-5, acc.mu)
    assert "exact" in g.note and not acc.approximate
    assert acc.delta(g.epsilon) == pytest.approx(1e-5, rel=1e-9)


def test_full_batch_sampling_uses_exact_mu() -> None:
    acc = GdpAccountant().compose(PoissonSampled(1.0, Gaussian(3.0)), 4)
    assert acc.mu == pytest.approx(2 / 3, rel=1e-15)
    assert "exact" in acc.guarantee(1e-5).note


@pytest.mark.parametrize(
    ("sigma", "q", "steps"), [(1.1, 256 / 60000, 14_000), (0.8, 0.01, 500), (4.0, 0.01, 40_000)]
)
def test_poisson_clt_matches_opacus(sigma: float, q: float, steps: int) -> None:
    from opacus.accountants.analysis import gdp as opacus_gdp

    acc = GdpAccountant().compose(dp_sgd(sigma, q, steps))
    mu = opacus_gdp.compute_mu_poisson(steps=steps, noise_multiplier=sigma, sample_rate=q)
    assert acc.mu == pytest.approx(mu, rel=1e-12)
    eps = opacus_gdp.compute_eps_poisson(
        steps=steps, noise_multiplier=sigma, sample_rate=q, delta=1e-5
    )
    g = acc.guarantee(1e-5)
    assert g.epsilon == pytest.approx(eps, rel=1e-8)
    assert acc.approximate and "UNDER-state" in g.note


def test_mixed_composition_adds_mu_squared() -> None:
    acc = GdpAccountant().compose(Gaussian(2.0)).compose(PoissonSampled(0.1, Gaussian(1.0)), 100)
    expected = math.sqrt(0.25 + 0.01 * 100 * math.expm1(1.0))
    assert acc.mu == pytest.approx(expected, rel=1e-14)
    assert "not a certified" in acc.guarantee(1e-6).note


def test_empty_and_degenerate_accountants() -> None:
    assert GdpAccountant().epsilon(1e-5) == 0.0
    assert GdpAccountant().delta(0.0) == 0.0
    tiny = GdpAccountant().compose(PoissonSampled(0.5, Gaussian(0.01)))
    assert math.isinf(tiny.mu) and math.isinf(tiny.epsilon(1e-5)) and tiny.delta(10.0) == 1.0


def test_unsupported_events_are_rejected() -> None:
    with pytest.raises(PrivacyParameterError, match="gdp accountant handles only"):
        GdpAccountant().compose(Laplace(1.0))
    with pytest.raises(PrivacyParameterError, match="gdp"):
        GdpAccountant().compose(PoissonSampled(0.1, Laplace(1.0)))
    with pytest.raises(PrivacyParameterError):
        GdpAccountant().compose(Gaussian(1.0)).epsilon(1.5)
