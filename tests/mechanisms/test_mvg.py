"""The MVG baseline (Chanyaswad, Dytso, Poor & Mittal 2018, Theorem 3) against aMGM.

Oracles: the theorem's bound recomputed by hand (exact harmonic numbers, the unsimplified
quadratic root); the condition evaluated on the singular values of the covariances the mechanism
really draws from; aMGM's necessary-and-sufficient condition (Du et al. 2023, Theorem 2), which
any valid sufficient condition must imply; the PLD accountant on the event of the noise drawn.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from privacylab.accounting import make_accountant
from privacylab.accounting.events import MatrixGaussian
from privacylab.errors import PrivacylabError
from privacylab.mechanisms import MVGMechanism, amgm_sigma, mvg_sufficient_scale
from privacylab.mechanisms.mvg import harmonic_number, mvg_precision_budget, mvg_zeta

FAST = settings(max_examples=40, deadline=None)
EPSILONS = st.floats(0.1, 10.0)
LOG_DELTAS = st.floats(math.log(1e-9), math.log(1e-2))


def by_hand(epsilon: float, delta: float, s2: float, m: int, n: int, gamma: float) -> float:
    """Theorem 3 for Σ = Ψ ∝ I (left side √(mn)/σ²): σ = (mn)^{1/4} / √P, with P written out
    as in the paper and evaluated at 60 digits (the root −β + √(β² + 8αε) cancels badly in
    doubles), H_r from exact fractions."""
    with mpmath.workdps(60):
        r = min(m, n)
        exact = sum(Fraction(1, i) for i in range(1, r + 1))
        h = mpmath.mpf(exact.numerator) / exact.denominator
        h_half = mpmath.fsum(1 / mpmath.sqrt(i) for i in range(1, r + 1))
        eps, g, s, size = mpmath.mpf(epsilon), mpmath.mpf(gamma), mpmath.mpf(s2), m * n
        log_delta = mpmath.log(mpmath.mpf(delta))
        alpha = (h + h_half) * g**2 + 2 * h * g * s
        zeta = 2 * mpmath.sqrt(-size * log_delta) - 2 * log_delta + size
        beta = 2 * mpmath.root(size, 4) * h * s * zeta
        budget = (-beta + mpmath.sqrt(beta**2 + 8 * alpha * eps)) ** 2 / (4 * alpha**2)
        return float(mpmath.root(size, 4) / mpmath.sqrt(budget))


def test_harmonic_numbers() -> None:
    assert harmonic_number(4) == pytest.approx(25 / 12, rel=1e-15)
    assert harmonic_number(4, 0.5) == pytest.approx(
        1 + 1 / math.sqrt(2) + 1 / math.sqrt(3) + 0.5, rel=1e-15
    )
    assert harmonic_number(1, 0.5) == 1.0
    assert mvg_zeta(1e-5, 2, 3) == pytest.approx(
        2 * math.sqrt(6 * math.log(1e5)) + 2 * math.log(1e5) + 6, rel=1e-15
    )


@pytest.mark.parametrize(
    ("epsilon", "delta", "s2", "m", "n", "gamma"),
    [(1.0, 1e-5, 2.0, 2, 3, 1.0), (8.0, 1e-6, 2.0, 48, 384, 1.0), (0.5, 1e-3, 1.0, 5, 1, 4.0)],
)
def test_sufficient_scale_matches_the_theorem_by_hand(
    epsilon: float, delta: float, s2: float, m: int, n: int, gamma: float
) -> None:
    assert mvg_sufficient_scale(epsilon, delta, s2, m, n, gamma) == pytest.approx(
        by_hand(epsilon, delta, s2, m, n, gamma), rel=1e-12
    )


@FAST
@given(epsilon=EPSILONS, log_delta=LOG_DELTAS, m=st.integers(1, 64), n=st.integers(1, 64))
def test_iid_mvg_meets_theorem_3_with_equality_on_the_noise_it_draws(
    epsilon: float, log_delta: float, m: int, n: int
) -> None:
    delta = math.exp(log_delta)
    mech = MVGMechanism.calibrated(epsilon, delta, 2.0, m, n, gamma=1.0)
    budget = mvg_precision_budget(epsilon, delta, 2.0, m, n, 1.0)
    assert mech.mvg_condition() == pytest.approx(budget, rel=1e-9)
    assert mech.scale == pytest.approx(mvg_sufficient_scale(epsilon, delta, 2.0, m, n), rel=1e-12)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 6),
    n=st.integers(1, 6),
    log_spread=st.floats(0.0, math.log(1e4)),
)
def test_directional_mvg_keeps_its_shape_and_meets_theorem_3(
    seed: int, m: int, n: int, log_spread: float
) -> None:
    rng = np.random.default_rng(seed)
    spread = math.exp(log_spread)
    b = torch.diag(torch.from_numpy(rng.uniform(1.0, spread, m)))
    c = torch.from_numpy(np.diag(rng.uniform(1.0, spread, n)))
    mech = MVGMechanism.calibrated(2.0, 1e-5, 2.0, m, n, row_factor=b, column_factor=c)
    assert mech.mvg_condition() == pytest.approx(
        mvg_precision_budget(2.0, 1e-5, 2.0, m, n), rel=1e-9
    )
    ratio = torch.diagonal(mech.row_covariance) / torch.diagonal(b @ b.T)
    assert float(ratio.std(unbiased=False) / ratio.mean()) < 1e-10
    # Theorem 3 is sufficient, Du et al.'s Theorem 2 is necessary: MVG can never undercut it.
    assert mech.scale > amgm_sigma(2.0, 1e-5, 2.0)


@FAST
@given(epsilon=EPSILONS, log_delta=LOG_DELTAS, m=st.integers(1, 64), n=st.integers(1, 384))
def test_mvg_is_noisier_than_amgm_at_the_same_privacy(
    epsilon: float, log_delta: float, m: int, n: int
) -> None:
    delta = math.exp(log_delta)
    mvg = MVGMechanism.calibrated(epsilon, delta, 2.0, m, n)
    assert mvg.scale > amgm_sigma(epsilon, delta, 2.0)
    assert mvg.expected_noise_energy() > m * n * amgm_sigma(epsilon, delta, 2.0) ** 2
    assert mvg.epsilon(delta) < epsilon


@settings(max_examples=6, deadline=None)
@given(epsilon=EPSILONS, log_delta=LOG_DELTAS, m=st.integers(1, 64), n=st.integers(1, 64))
def test_the_accountant_gives_mvg_noise_at_most_its_calibrated_epsilon(
    epsilon: float, log_delta: float, m: int, n: int
) -> None:
    delta = math.exp(log_delta)
    mech = MVGMechanism.calibrated(epsilon, delta, 2.0, m, n)
    assert mech.event == MatrixGaussian(mech.scale / 2.0, m, n)
    assume(mech.noise_multiplier <= 1e6)  # the accountants' range; beyond it ε is 0 anyway
    assert make_accountant("pld").compose(mech.event).epsilon(delta) <= epsilon


def test_releases_compose_basically() -> None:
    mech = MVGMechanism.calibrated(3.0, 1e-5, 2.0, 4, 6, releases=3)
    assert mech.scale == pytest.approx(mvg_sufficient_scale(1.0, 1e-5 / 3, 2.0, 4, 6), rel=1e-12)
    assert mech.epsilon(1e-5, releases=3) < 3.0


def test_mvg_noise_has_the_calibrated_spread() -> None:
    mech = MVGMechanism.calibrated(8.0, 1e-5, 2.0, 3, 5, generator=torch.Generator().manual_seed(0))
    z = mech.noise(4000, dtype=torch.float64)
    assert float(z.std()) == pytest.approx(mech.scale, rel=0.02)
    assert mech.gamma == 1.0


@pytest.mark.parametrize(
    "build",
    [
        lambda: mvg_sufficient_scale(1.0, 1e-5, 2.0, 3, 4, gamma=0.5),
        lambda: mvg_sufficient_scale(1.0, 1e-5, 2.0, 3, 4, gamma=float("nan")),
        lambda: mvg_sufficient_scale(0.0, 1e-5, 2.0, 3, 4),
        lambda: mvg_sufficient_scale(1.0, 0.0, 2.0, 3, 4),
        lambda: mvg_sufficient_scale(1.0, 1e-5, 2.0, 0, 4),
        lambda: MVGMechanism.calibrated(1.0, 1e-5, 2.0, 3, 4, releases=0),
        lambda: MVGMechanism.calibrated(1.0, 1e-5, 2.0, 3, 4, row_factor=torch.zeros(3, 3)),
        lambda: harmonic_number(0),
    ],
)
def test_bad_input_is_one_line(build) -> None:
    with pytest.raises(PrivacylabError) as error:
        build()
    assert "\n" not in str(error.value) and str(error.value)
