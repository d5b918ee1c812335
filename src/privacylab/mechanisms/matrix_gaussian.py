"""The analytic matrix Gaussian mechanism (aMGM) of DP-Forward.

Du et al. 2023 ("DP-Forward: Fine-tuning and Inference on Language Models with Differential
Privacy in Forward Pass", CCS'23, Sec. 4): release f(X) + Z for a matrix-valued f: X → R^{n×d}
with L2 (Frobenius) sensitivity S₂(f), where Z ~ MN_{n,d}(0, Σ, Ψ) is matrix-variate normal,
Z = B N Cᵀ with N i.i.d. standard normal, Σ = BBᵀ (row covariance) and Ψ = CCᵀ (column
covariance). Theorem 2: the mechanism is (ε, δ)-DP iff σ_min(B)·σ_min(C) = σ satisfies the
analytic-Gaussian condition of Balle & Wang 2018 (Theorem 8)

    Φ(S₂/(2σ) − εσ/S₂) − e^ε Φ(−S₂/(2σ) − εσ/S₂) ≤ δ,

so the smallest admissible σ_min(B)σ_min(C) is `analytic_gaussian_sigma(ε, δ, S₂)`, and any B, C
whose smallest singular values multiply to it may shape the noise (more noise along directions
that matter less). The expected noise energy E‖Z‖²_F = tr(Σ)·tr(Ψ) is smallest when all singular
values equal the minimum (the "optimal choice", Sec. 4.2), where aMGM coincides with i.i.d.
analytic Gaussian noise; it is never noisier than that at the same (ε, δ).

Why σ_min(B)σ_min(C) is the whole story: vec(Z) ~ N(0, Ψ ⊗ Σ), so for neighbours whose outputs
differ by Δ the privacy loss is Gaussian with mean μ²/2 and variance μ², μ = ‖(Ψ ⊗ Σ)^(-1/2)
vec(Δ)‖ = ‖B⁻¹ Δ C⁻ᵀ‖_F ≤ ‖Δ‖_F / (σ_min(B)σ_min(C)), with equality when Δ = S₂·u vᵀ for the
least-noisy singular directions u of B and v of C. The worst case is therefore the scalar
Gaussian mechanism with σ = σ_min(B)σ_min(C), which Balle & Wang's condition calibrates exactly.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from privacylab.accounting import _validate as check
from privacylab.accounting.events import MatrixGaussian
from privacylab.accounting.gdp import gaussian_delta, gaussian_epsilon
from privacylab.mechanisms.gaussian import analytic_gaussian_sigma


def amgm_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest σ_min(B)·σ_min(C) for which aMGM is (ε, δ)-DP at L2 sensitivity S₂
    (Du et al. 2023, Theorem 2, with Balle & Wang 2018, Theorem 8)."""
    return analytic_gaussian_sigma(epsilon, delta, sensitivity)


def amgm_condition(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """The left side of the aMGM condition at σ = σ_min(B)·σ_min(C):
    Φ(S₂/(2σ) − εσ/S₂) − e^ε Φ(−S₂/(2σ) − εσ/S₂).

    Du et al. 2023, Theorem 2 (Balle & Wang 2018, Theorem 8): the mechanism is (ε, δ)-DP iff
    this is ≤ δ; the value is the exact δ(ε) of one release (computed in log space, so it stays
    accurate far into the tails)."""
    sigma = check.positive("sigma", sigma)
    epsilon = check.nonnegative("epsilon", epsilon)
    sensitivity = check.positive("sensitivity", sensitivity)
    return float(gaussian_delta(epsilon, sensitivity / sigma))


def _square_root(name: str, covariance: Tensor) -> Tensor:
    if (
        not isinstance(covariance, Tensor)
        or covariance.ndim != 2
        or covariance.shape[0] != covariance.shape[1]
        or covariance.shape[0] < 1
    ):
        shape = tuple(covariance.shape) if isinstance(covariance, Tensor) else None
        raise check.PrivacyParameterError(f"{name} must be a square 2-d tensor, got {shape}")
    matrix = covariance.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(matrix).all()):
        raise check.PrivacyParameterError(f"{name} must be finite")
    scale = float(matrix.abs().max())
    if scale == 0.0 or float((matrix - matrix.T).abs().max()) > 1e-9 * scale:
        raise check.PrivacyParameterError(f"{name} must be symmetric and non-zero")
    values, vectors = torch.linalg.eigh((matrix + matrix.T) / 2)
    if float(values.min()) <= 1e-12 * float(values.max()):
        raise check.PrivacyParameterError(f"{name} must be positive definite")
    return (vectors * values.sqrt()) @ vectors.T


def _factor(name: str, factor: Tensor | None, size: int) -> tuple[Tensor | None, float]:
    if factor is None:
        return None, 1.0
    if not isinstance(factor, Tensor) or factor.shape != (size, size):
        raise check.PrivacyParameterError(f"{name} must be a ({size}, {size}) tensor")
    matrix = factor.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(matrix).all()):
        raise check.PrivacyParameterError(f"{name} must be finite")
    smallest = float(torch.linalg.svdvals(matrix).min())
    if smallest <= 0.0:
        raise check.PrivacyParameterError(f"{name} must be invertible (its σ_min is 0)")
    return matrix, smallest


class MatrixGaussianMechanism:
    """Adds Z = B N Cᵀ to n × d matrices and reports the event `MatrixGaussian` per release.

    Args:
        rows, columns: n and d.
        scale: σ_min(B)·σ_min(C) of the noise actually drawn (in absolute units).
        sensitivity: S₂(f), the Frobenius sensitivity of the released matrix (2C for a
            matrix normalised to Frobenius norm C under replace-one neighbours).
        row_factor, column_factor: B (n × n) and C (d × d) giving the noise its shape; they are
            rescaled so that σ_min(B)·σ_min(C) = `scale`. None: identity (i.i.d. noise, the
            optimal choice).
        generator: torch.Generator for reproducible noise.
    """

    def __init__(
        self,
        rows: int,
        columns: int,
        scale: float,
        sensitivity: float,
        *,
        row_factor: Tensor | None = None,
        column_factor: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.rows = check.count(rows, "matrix rows")
        self.columns = check.count(columns, "matrix columns")
        self.scale = check.positive("noise scale", scale)
        self.sensitivity = check.positive("sensitivity", sensitivity)
        b, b_min = _factor("row factor B", row_factor, self.rows)
        c, c_min = _factor("column factor C", column_factor, self.columns)
        self.row_factor = None if b is None else b / b_min
        self.column_factor = None if c is None else c / c_min
        self.generator = generator

    @classmethod
    def calibrated(
        cls,
        epsilon: float,
        delta: float,
        sensitivity: float,
        rows: int,
        columns: int,
        *,
        releases: int = 1,
        row_factor: Tensor | None = None,
        column_factor: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> MatrixGaussianMechanism:
        """The mechanism whose `releases`-fold composition on one input is (ε, δ)-DP.

        k releases of Gaussian noise with the same scale compose to one Gaussian release with
        μ = √k · S₂/σ (Dong, Roth & Su 2022, Corollary 3.3), so σ = √k · `amgm_sigma(ε, δ, S₂)`
        is exact, not a bound."""
        releases = check.count(releases, "number of releases")
        sigma = math.sqrt(releases) * amgm_sigma(epsilon, delta, sensitivity)
        return cls(
            rows,
            columns,
            sigma,
            sensitivity,
            row_factor=row_factor,
            column_factor=column_factor,
            generator=generator,
        )

    @classmethod
    def from_covariances(
        cls,
        epsilon: float,
        delta: float,
        sensitivity: float,
        row_covariance: Tensor,
        column_covariance: Tensor,
        *,
        releases: int = 1,
        generator: torch.Generator | None = None,
    ) -> MatrixGaussianMechanism:
        """The (ε, δ)-calibrated mechanism whose noise has the SHAPE of the given covariances.

        Z ~ MN(0, a·Σ, a·Ψ): the user's row covariance Σ (n × n) and column covariance Ψ
        (d × d), both symmetric positive definite, are kept up to one factor a chosen so that
        σ_min(B)σ_min(C) with B = (aΣ)^(1/2), C = (aΨ)^(1/2) meets Du et al. 2023, Theorem 2
        exactly. Directions with larger variance in Σ or Ψ get proportionally more noise."""
        b = _square_root("row covariance", row_covariance)
        c = _square_root("column covariance", column_covariance)
        return cls.calibrated(
            epsilon,
            delta,
            sensitivity,
            int(b.shape[0]),
            int(c.shape[0]),
            releases=releases,
            row_factor=b,
            column_factor=c,
            generator=generator,
        )

    @property
    def row_covariance(self) -> Tensor:
        """Σ = BBᵀ (n × n, float64) of the noise drawn; Ψ ⊗ Σ is the covariance of vec(Z)."""
        b = self.row_factor
        base = torch.eye(self.rows, dtype=torch.float64) if b is None else b @ b.T
        return self.scale * base

    @property
    def column_covariance(self) -> Tensor:
        """Ψ = CCᵀ (d × d, float64) of the noise drawn."""
        c = self.column_factor
        base = torch.eye(self.columns, dtype=torch.float64) if c is None else c @ c.T
        return self.scale * base

    def expected_noise_energy(self) -> float:
        """E‖Z‖²_F = tr(Σ)·tr(Ψ) = scale² · tr(B̂B̂ᵀ) · tr(ĈĈᵀ) (B̂, Ĉ with σ_min 1).

        Du et al. 2023, Sec. 4.2: at the optimal choice (B̂ = I, Ĉ = I) this is n·d·σ², the
        energy of i.i.d. analytic Gaussian noise; any other admissible shape is larger."""
        rows = float(self.rows if self.row_factor is None else self.row_factor.square().sum())
        columns = float(
            self.columns if self.column_factor is None else self.column_factor.square().sum()
        )
        return self.scale**2 * rows * columns

    def epsilon(self, delta: float, *, releases: int = 1) -> float:
        """The exact ε at `delta` of `releases` releases on one input.

        k Gaussian releases with worst-case μ = S₂/σ each are exactly √k·μ-GDP (Dong, Roth & Su
        2022, Corollary 3.3), inverted in ε by Balle & Wang 2018, Theorem 8."""
        releases = check.count(releases, "number of releases")
        delta = check.delta(delta)
        return float(gaussian_epsilon(delta, math.sqrt(releases) / self.noise_multiplier))

    @property
    def noise_multiplier(self) -> float:
        """σ_min(B)·σ_min(C) / S₂: the event's noise multiplier."""
        return self.scale / self.sensitivity

    @property
    def event(self) -> MatrixGaussian:
        """The privacy event of one release."""
        return MatrixGaussian(self.noise_multiplier, self.rows, self.columns)

    def noise(
        self, batch: int, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """`batch` independent noise matrices, shape (batch, n, d), on `device`.

        The standard normals come from `generator` on ITS device (the CPU when there is none)
        in float64, so a CPU generator gives the same numbers whatever `device` is; they are
        shaped by B and C there and then moved."""
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 0:
            raise check.PrivacyParameterError(f"batch must be a whole number >= 0, got {batch!r}")
        batch = int(batch)
        source = torch.device("cpu") if self.generator is None else self.generator.device
        draw = torch.randn(
            (batch, self.rows, self.columns),
            generator=self.generator,
            dtype=torch.float64,
            device=source,
        )
        if self.row_factor is not None:
            draw = self.row_factor.to(source) @ draw
        if self.column_factor is not None:
            draw = draw @ self.column_factor.to(source).T
        return (draw * self.scale).to(device=device, dtype=dtype)

    def release(self, value: Tensor) -> Tensor:
        """`value` (batch, n, d) plus fresh noise, one release per matrix."""
        if value.ndim != 3 or tuple(value.shape[1:]) != (self.rows, self.columns):
            raise check.PrivacyParameterError(
                f"expected matrices of shape (batch, {self.rows}, {self.columns}), "
                f"got {tuple(value.shape)}"
            )
        return value + self.noise(int(value.shape[0]), device=value.device, dtype=value.dtype)
