"""The analytic matrix Gaussian mechanism (aMGM, Du et al. 2023, DP-Forward, Sec. 4, Theorem 2).

Oracles: Balle & Wang 2018, Theorem 8 evaluated directly with scipy; Monte Carlo estimates of
the hockey-stick divergence from the privacy-loss random variable of noise actually drawn;
sample covariances against Ψ ⊗ Σ; the PLD accountant; the closed form n·d·σ² of i.i.d. noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from privacylab.accounting import make_accountant
from privacylab.accounting.events import MatrixGaussian, SelfComposed
from privacylab.accounting.gdp import gaussian_delta
from privacylab.errors import PrivacylabError
from privacylab.mechanisms import (
    MatrixGaussianMechanism,
    amgm_condition,
    amgm_sigma,
    analytic_gaussian_sigma,
)

FAST = settings(max_examples=40, deadline=None)


def scipy_condition(sigma: float, epsilon: float, sensitivity: float) -> float:
    """Balle & Wang 2018, Theorem 8, left side, straight from scipy's normal CDF."""
    a = sensitivity / (2 * sigma) - epsilon * sigma / sensitivity
    b = -sensitivity / (2 * sigma) - epsilon * sigma / sensitivity
    return float(norm.cdf(a) - math.exp(epsilon) * norm.cdf(b))


def factor_with_spectrum(rng: np.random.Generator, values: np.ndarray) -> torch.Tensor:
    """U diag(values) Vᵀ with random orthogonal U, V: a factor with known singular values."""
    size = len(values)
    u, _ = np.linalg.qr(rng.standard_normal((size, size)))
    v, _ = np.linalg.qr(rng.standard_normal((size, size)))
    return torch.from_numpy(u @ np.diag(values) @ v.T)


def shaped_mechanism(seed: int, rows: int, columns: int, epsilon: float, delta: float, s2: float):
    rng = np.random.default_rng(seed)
    b = factor_with_spectrum(rng, np.linspace(1.0, 2.0, rows) * 0.7)
    c = factor_with_spectrum(rng, np.linspace(1.0, 2.5, columns) * 1.9)
    generator = torch.Generator().manual_seed(seed)
    return MatrixGaussianMechanism.calibrated(
        epsilon, delta, s2, rows, columns, row_factor=b, column_factor=c, generator=generator
    )


# -- calibration against Balle & Wang, Theorem 8 ---------------------------------------------


@FAST
@given(
    epsilon=st.floats(0.1, 20.0),
    log_delta=st.floats(math.log(1e-9), math.log(1e-2)),
    sensitivity=st.floats(0.1, 10.0),
)
def test_amgm_sigma_is_the_smallest_scale_meeting_the_agm_condition(
    epsilon: float, log_delta: float, sensitivity: float
) -> None:
    delta = math.exp(log_delta)
    sigma = amgm_sigma(epsilon, delta, sensitivity)
    assert amgm_condition(sigma, epsilon, sensitivity) <= delta
    assert scipy_condition(sigma, epsilon, sensitivity) <= delta * (1 + 1e-9)
    assert scipy_condition(sigma * (1 - 1e-6), epsilon, sensitivity) > delta
    assert amgm_condition(sigma * (1 - 1e-6), epsilon, sensitivity) > delta


@pytest.mark.parametrize(
    ("sigma", "epsilon", "sensitivity"), [(1.0, 0.5, 1.0), (3.7, 2.0, 2.0), (0.4, 8.0, 0.7)]
)
def test_amgm_condition_matches_scipy(sigma: float, epsilon: float, sensitivity: float) -> None:
    assert amgm_condition(sigma, epsilon, sensitivity) == pytest.approx(
        scipy_condition(sigma, epsilon, sensitivity), rel=1e-9
    )


def test_calibrated_mechanism_sets_the_smallest_singular_values() -> None:
    mech = shaped_mechanism(0, 4, 5, 3.0, 1e-5, 2.0)
    sigma = amgm_sigma(3.0, 1e-5, 2.0)
    row_min = float(torch.linalg.eigvalsh(mech.row_covariance).min())
    column_min = float(torch.linalg.eigvalsh(mech.column_covariance).min())
    assert math.sqrt(row_min * column_min) == pytest.approx(sigma, rel=1e-10)
    assert mech.noise_multiplier == pytest.approx(sigma / 2.0, rel=1e-12)
    assert mech.event == MatrixGaussian(mech.noise_multiplier, 4, 5)


# -- empirical privacy loss of the noise actually drawn ----------------------------------------


def loss_samples(mech: MatrixGaussianMechanism, shift: torch.Tensor, draws: int) -> np.ndarray:
    """L = log p(Y | f(X)) / p(Y | f(X) − Δ) for Y = f(X) + Z, Z drawn by the mechanism:
    L = ⟨Σ⁻¹ Δ Ψ⁻¹, Z⟩ + ½ ⟨Σ⁻¹ Δ Ψ⁻¹, Δ⟩ for vec(Z) ~ N(0, Ψ ⊗ Σ)."""
    weight = torch.linalg.solve(mech.row_covariance, shift) @ torch.linalg.inv(
        mech.column_covariance
    )
    z = mech.noise(draws, dtype=torch.float64)
    losses = (z * weight).sum(dim=(1, 2)) + 0.5 * float((weight * shift).sum())
    return losses.numpy()


def hockey_stick(losses: np.ndarray, epsilon: float) -> tuple[float, float]:
    """δ(ε) = E[(1 − e^{ε − L})₊] and its standard error."""
    terms = np.clip(1.0 - np.exp(epsilon - losses), 0.0, None)
    return float(terms.mean()), float(terms.std(ddof=1) / math.sqrt(len(terms)))


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 0.05), (0.5, 0.1)])
def test_worst_case_shift_spends_exactly_delta_and_noisy_directions_less(
    epsilon: float, delta: float
) -> None:
    s2, draws = 2.0, 400_000
    mech = shaped_mechanism(3, 3, 4, epsilon, delta, s2)
    row_values, row_vectors = torch.linalg.eigh(mech.row_covariance)
    column_values, column_vectors = torch.linalg.eigh(mech.column_covariance)

    worst = s2 * torch.outer(row_vectors[:, 0], column_vectors[:, 0])
    estimate, error = hockey_stick(loss_samples(mech, worst, draws), epsilon)
    assert abs(estimate - delta) <= 5 * error
    assert estimate <= delta + 5 * error

    noisy = s2 * torch.outer(row_vectors[:, -1], column_vectors[:, 0])
    mu = s2 / math.sqrt(float(row_values[-1] * column_values[0]))
    exact = float(gaussian_delta(epsilon, mu))
    estimate_noisy, error_noisy = hockey_stick(loss_samples(mech, noisy, draws), epsilon)
    assert abs(estimate_noisy - exact) <= 5 * error_noisy
    assert exact < delta / 3 and estimate_noisy < delta / 3


def test_loss_of_the_worst_shift_is_gaussian_with_mean_half_its_variance() -> None:
    """The privacy loss is N(μ²/2, μ²) with μ = S₂ / (σ_min(B)σ_min(C)) (Theorem 2's proof)."""
    s2 = 2.0
    mech = shaped_mechanism(5, 3, 2, 2.0, 1e-3, s2)
    _, row_vectors = torch.linalg.eigh(mech.row_covariance)
    _, column_vectors = torch.linalg.eigh(mech.column_covariance)
    losses = loss_samples(mech, s2 * torch.outer(row_vectors[:, 0], column_vectors[:, 0]), 200_000)
    mu = s2 / mech.scale
    assert losses.mean() == pytest.approx(mu * mu / 2, abs=5 * mu / math.sqrt(len(losses)))
    assert losses.std() == pytest.approx(mu, rel=0.01)


# -- never noisier than i.i.d. analytic Gaussian noise ----------------------------------------


@FAST
@given(
    epsilon=st.floats(0.1, 20.0),
    log_delta=st.floats(math.log(1e-9), math.log(1e-2)),
    rows=st.integers(1, 64),
    columns=st.integers(1, 384),
)
def test_optimal_choice_has_exactly_the_energy_of_iid_analytic_gaussian_noise(
    epsilon: float, log_delta: float, rows: int, columns: int
) -> None:
    delta = math.exp(log_delta)
    mech = MatrixGaussianMechanism.calibrated(epsilon, delta, 2.0, rows, columns)
    sigma = analytic_gaussian_sigma(epsilon, delta, 2.0)
    assert mech.expected_noise_energy() == pytest.approx(rows * columns * sigma**2, rel=1e-14)


@FAST
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 6),
    columns=st.integers(1, 6),
    spread=st.floats(1.0, 10.0),
)
def test_any_other_admissible_shape_is_noisier(
    seed: int, rows: int, columns: int, spread: float
) -> None:
    rng = np.random.default_rng(seed)
    b = factor_with_spectrum(rng, rng.uniform(1.0, spread, rows))
    c = factor_with_spectrum(rng, rng.uniform(1.0, spread, columns))
    shaped = MatrixGaussianMechanism.calibrated(
        2.0, 1e-5, 2.0, rows, columns, row_factor=b, column_factor=c
    )
    iid = MatrixGaussianMechanism.calibrated(2.0, 1e-5, 2.0, rows, columns)
    assert shaped.scale == iid.scale
    assert shaped.expected_noise_energy() >= iid.expected_noise_energy() * (1 - 1e-12)
    trace = float(torch.trace(shaped.row_covariance) * torch.trace(shaped.column_covariance))
    assert shaped.expected_noise_energy() == pytest.approx(trace, rel=1e-10)


def test_sampled_energy_matches_the_expected_energy() -> None:
    mech = shaped_mechanism(11, 4, 6, 1.0, 1e-5, 2.0)
    energy = mech.noise(20_000, dtype=torch.float64).square().sum(dim=(1, 2)).numpy()
    assert energy.mean() == pytest.approx(
        mech.expected_noise_energy(), abs=5 * energy.std() / math.sqrt(len(energy))
    )


# -- the noise distribution ---------------------------------------------------------------------


def test_sample_covariance_has_the_kronecker_structure() -> None:
    """cov(vec Z) = Ψ ⊗ Σ, E[ZZᵀ] = tr(Ψ)·Σ and E[ZᵀZ] = tr(Σ)·Ψ (vec stacks columns)."""
    mech = shaped_mechanism(7, 2, 3, 1.0, 1e-3, 1.0)
    draws = 200_000
    z = mech.noise(draws, dtype=torch.float64)
    sigma, psi = mech.row_covariance, mech.column_covariance

    vec = z.transpose(1, 2).reshape(draws, -1)
    sample = vec.T @ vec / draws
    expected = torch.kron(psi, sigma)
    scale = float(torch.diagonal(expected).max())
    assert float((sample - expected).abs().max()) <= 6 * scale * math.sqrt(2 / draws)

    rows = torch.einsum("bij,bkj->ik", z, z) / draws
    columns = torch.einsum("bji,bjk->ik", z, z) / draws
    row_scale = float(torch.trace(psi) * torch.diagonal(sigma).max())
    column_scale = float(torch.trace(sigma) * torch.diagonal(psi).max())
    assert float((rows - torch.trace(psi) * sigma).abs().max()) <= 6 * row_scale * math.sqrt(
        2 / draws
    ) * math.sqrt(3)
    assert float((columns - torch.trace(sigma) * psi).abs().max()) <= 6 * column_scale * math.sqrt(
        2 / draws
    ) * math.sqrt(2)
    assert float(z.mean(dim=0).abs().max()) <= 6 * math.sqrt(scale / draws)


def test_seeded_noise_is_reproducible_and_device_independent() -> None:
    def draw(seed: int, **kwargs) -> torch.Tensor:
        mech = MatrixGaussianMechanism(
            3, 4, 0.8, 2.0, generator=torch.Generator().manual_seed(seed)
        )
        return mech.noise(5, **kwargs)

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))
    assert torch.equal(draw(1, dtype=torch.float64).float(), draw(1))
    assert draw(1, device="meta").device.type == "meta"


def test_release_adds_fresh_noise_of_the_value_dtype_and_device() -> None:
    mech = MatrixGaussianMechanism(2, 3, 0.5, 1.0, generator=torch.Generator().manual_seed(0))
    value = torch.ones(4, 2, 3, dtype=torch.float64)
    noisy = mech.release(value)
    assert noisy.dtype == torch.float64 and noisy.shape == value.shape
    assert not torch.equal(noisy, mech.release(value))
    assert mech.release(torch.ones(0, 2, 3)).shape == (0, 2, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_noise_on_cuda_from_cpu_and_cuda_generators() -> None:
    cpu = MatrixGaussianMechanism(3, 4, 0.8, 2.0, generator=torch.Generator().manual_seed(3))
    same = MatrixGaussianMechanism(3, 4, 0.8, 2.0, generator=torch.Generator().manual_seed(3))
    on_gpu = cpu.release(torch.zeros(6, 3, 4, device="cuda"))
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), same.noise(6))

    rng = np.random.default_rng(0)
    b, c = factor_with_spectrum(rng, np.array([1.0, 2.0, 3.0])), None
    gpu = MatrixGaussianMechanism(
        3,
        4,
        0.8,
        2.0,
        row_factor=b.cuda(),
        column_factor=c,
        generator=torch.Generator(device="cuda").manual_seed(3),
    )
    again = MatrixGaussianMechanism(
        3, 4, 0.8, 2.0, row_factor=b, generator=torch.Generator(device="cuda").manual_seed(3)
    )
    first = gpu.noise(1000, device="cuda")
    assert first.device.type == "cuda" and first.shape == (1000, 3, 4)
    assert torch.equal(first, again.noise(1000, device="cuda"))


# -- user covariances, exact ε --------------------------------------------------------------------


def test_from_covariances_keeps_the_users_shape_and_calibrates_its_scale() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 3))
    sigma = torch.from_numpy(a @ a.T + 0.5 * np.eye(3))
    psi = torch.diag(torch.tensor([1.0, 4.0, 9.0, 0.25], dtype=torch.float64))
    mech = MatrixGaussianMechanism.from_covariances(1.5, 1e-6, 2.0, sigma, psi)
    assert (mech.rows, mech.columns) == (3, 4)
    row_ratio = mech.row_covariance / sigma
    column_ratio = mech.column_covariance / psi
    assert float(row_ratio.std() / row_ratio.mean()) < 1e-10
    assert float(column_ratio[psi > 0].std() / column_ratio[psi > 0].mean()) < 1e-10
    smallest = float(
        torch.linalg.eigvalsh(mech.row_covariance).min()
        * torch.linalg.eigvalsh(mech.column_covariance).min()
    )
    assert math.sqrt(smallest) == pytest.approx(amgm_sigma(1.5, 1e-6, 2.0), rel=1e-10)


@pytest.mark.parametrize("releases", [1, 3, 12])
def test_epsilon_is_exact_and_agrees_with_the_pld_accountant(releases: int) -> None:
    mech = MatrixGaussianMechanism.calibrated(2.0, 1e-5, 2.0, 4, 8, releases=releases)
    assert mech.epsilon(1e-5, releases=releases) == pytest.approx(2.0, rel=1e-9)
    pld = make_accountant("pld").compose(SelfComposed(mech.event, releases)).epsilon(1e-5)
    assert 2.0 * (1 - 1e-9) <= pld <= 2.0 * 1.01


# -- bad input: one line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: MatrixGaussianMechanism(0, 3, 1.0, 1.0),
        lambda: MatrixGaussianMechanism(2, 3, float("nan"), 1.0),
        lambda: MatrixGaussianMechanism(2, 3, 1.0, -1.0),
        lambda: MatrixGaussianMechanism(2, 3, 1.0, 1.0, row_factor=torch.eye(3)),
        lambda: MatrixGaussianMechanism(2, 3, 1.0, 1.0, row_factor=torch.zeros(2, 2)),
        lambda: MatrixGaussianMechanism(
            2, 3, 1.0, 1.0, column_factor=torch.full((3, 3), float("nan"))
        ),
        lambda: MatrixGaussianMechanism.calibrated(0.0, 1e-5, 1.0, 2, 3),
        lambda: MatrixGaussianMechanism.calibrated(1.0, 1.0, 1.0, 2, 3),
        lambda: MatrixGaussianMechanism.calibrated(1.0, 1e-5, 1.0, 2, 3, releases=0),
        lambda: MatrixGaussianMechanism.from_covariances(
            1.0, 1e-5, 1.0, torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.eye(2)
        ),
        lambda: MatrixGaussianMechanism.from_covariances(
            1.0, 1e-5, 1.0, torch.tensor([[1.0, 2.0], [2.0, 1.0]]), torch.eye(2)
        ),
        lambda: MatrixGaussianMechanism.from_covariances(
            1.0, 1e-5, 1.0, torch.ones(3), torch.eye(2)
        ),
        lambda: MatrixGaussianMechanism(2, 3, 1.0, 1.0).release(torch.zeros(4, 3, 2)),
        lambda: MatrixGaussianMechanism(2, 3, 1.0, 1.0).noise(-1),
        lambda: amgm_condition(0.0, 1.0, 1.0),
        lambda: amgm_sigma(float("nan"), 1e-5, 1.0),
    ],
)
def test_bad_input_is_one_line(build) -> None:
    with pytest.raises(PrivacylabError) as error:
        build()
    assert "\n" not in str(error.value) and str(error.value)
