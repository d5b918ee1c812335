"""The matrix-variate Gaussian (MVG) mechanism: the baseline that aMGM improves on.

Chanyaswad, Dytso, Poor & Mittal 2018, "MVG Mechanism: Differential Privacy under
Matrix-Valued Query" (CCS'18), Theorem 3: for f: X → R^{m×n} with L2 (Frobenius) sensitivity
s₂(f) and γ = sup_X ‖f(X)‖_F, releasing f(X) + Z with Z ~ MN_{m,n}(0, Σ, Ψ) is (ε, δ)-DP if

    ‖σ(Σ⁻¹)‖₂ · ‖σ(Ψ⁻¹)‖₂ ≤ (−β + √(β² + 8αε))² / (4α²),

where σ(·) is the vector of singular values, r = min(m, n), H_r = Σ_{i≤r} 1/i and
H_{r,1/2} = Σ_{i≤r} 1/√i are generalized harmonic numbers,

    α = (H_r + H_{r,1/2}) γ² + 2 H_r γ s₂(f),
    β = 2 (mn)^{1/4} H_r s₂(f) ζ(δ),     ζ(δ) = 2√(−mn ln δ) − 2 ln δ + mn   (their Table 1).

The condition is sufficient, not necessary. DP-Forward's public code (Du et al. 2023, the MVG
baseline they compare aMGM with) uses exactly this ζ(δ); since mn + 2√(−mn ln δ) − 2 ln δ bounds
‖N‖²_F with probability 1 − δ (Laurent & Massart 2000, Lemma 1), some implementations take ζ as
its square root. The form kept here is the larger one: never less noise than the theorem asks.

With i.i.d. noise (Σ = Ψ ∝ I) the left side is √(mn) / σ², so the smallest per-entry standard
deviation is σ = (mn)^{1/4} · 2α / (−β + √(β² + 8αε)) (`mvg_sufficient_scale`). The noise drawn
is matrix Gaussian, so its true privacy is that of `MatrixGaussian(σ_min(B)σ_min(C) / s₂)`
(Du et al. 2023, Theorem 2): the event of `MVGMechanism` reports that, and every accountant then
certifies an ε no larger — usually far smaller — than the ε MVG was calibrated for.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from privacylab.accounting import _validate as check
from privacylab.mechanisms.matrix_gaussian import MatrixGaussianMechanism


def harmonic_number(order: int, power: float = 1.0) -> float:
    """The generalized harmonic number H_{r,p} = Σ_{i=1}^{r} i^(−p) (H_r for p = 1)."""
    order = check.count(order, "harmonic number order")
    return float(np.sum(np.arange(1, order + 1, dtype=np.float64) ** (-float(power))))


def mvg_zeta(delta: float, rows: int, columns: int) -> float:
    """ζ(δ) = 2√(−mn ln δ) − 2 ln δ + mn (Chanyaswad et al. 2018, Table 1)."""
    delta = check.delta(delta)
    size = check.count(rows, "matrix rows") * check.count(columns, "matrix columns")
    log_delta = math.log(delta)
    return 2.0 * math.sqrt(-size * log_delta) - 2.0 * log_delta + size


def _gamma(sensitivity: float, gamma: float | None) -> float:
    if gamma is None:
        return sensitivity / 2.0
    gamma = check.positive("gamma (sup of ‖f(X)‖_F)", gamma)
    if 2.0 * gamma < sensitivity * (1.0 - 1e-12):
        raise check.PrivacyParameterError(
            f"gamma = sup ‖f(X)‖_F = {gamma:g} cannot be below half the sensitivity "
            f"{sensitivity:g} (two outputs of norm <= gamma differ by at most 2·gamma)"
        )
    return gamma


def mvg_precision_budget(
    epsilon: float,
    delta: float,
    sensitivity: float,
    rows: int,
    columns: int,
    gamma: float | None = None,
) -> float:
    """The right side of Chanyaswad et al. 2018, Theorem 3: (−β + √(β² + 8αε))² / (4α²).

    `gamma` is sup_X ‖f(X)‖_F (None: s₂/2, the smallest value consistent with s₂; a matrix
    normalised to Frobenius norm C has γ = C and s₂ = 2C)."""
    epsilon = check.positive("epsilon", epsilon)
    delta = check.delta(delta)
    sensitivity = check.positive("sensitivity", sensitivity)
    rows = check.count(rows, "matrix rows")
    columns = check.count(columns, "matrix columns")
    gamma = _gamma(sensitivity, gamma)
    r = min(rows, columns)
    h_r, h_half = harmonic_number(r), harmonic_number(r, 0.5)
    alpha = (h_r + h_half) * gamma**2 + 2.0 * h_r * gamma * sensitivity
    beta = 2.0 * (rows * columns) ** 0.25 * h_r * sensitivity * mvg_zeta(delta, rows, columns)
    # −β + √(β² + 8αε) rewritten as 8αε / (β + √(β² + 8αε)): no cancellation when β² ≫ 8αε.
    root = 8.0 * alpha * epsilon / (beta + math.sqrt(beta * beta + 8.0 * alpha * epsilon))
    return root * root / (4.0 * alpha * alpha)


def mvg_sufficient_scale(
    epsilon: float,
    delta: float,
    sensitivity: float,
    rows: int,
    columns: int,
    gamma: float | None = None,
) -> float:
    """The per-entry standard deviation of i.i.d. MVG noise (Σ = Ψ ∝ I) that meets
    Chanyaswad et al. 2018, Theorem 3 with equality: σ = (mn)^{1/4} / √P, P the precision
    budget (`mvg_precision_budget`)."""
    budget = mvg_precision_budget(epsilon, delta, sensitivity, rows, columns, gamma)
    return (int(rows) * int(columns)) ** 0.25 / math.sqrt(budget)


def _inverse_spectrum_norm(factor: Tensor | None, size: int) -> float:
    """‖σ((B̂B̂ᵀ)⁻¹)‖₂ for a factor B̂ with σ_min(B̂) = 1 (identity when None)."""
    if factor is None:
        return math.sqrt(size)
    values = torch.linalg.svdvals(factor)
    return float(torch.linalg.vector_norm(values.pow(-2)))


class MVGMechanism(MatrixGaussianMechanism):
    """The MVG mechanism (Chanyaswad et al. 2018), the same interface as aMGM's.

    It draws Z = B N Cᵀ like `MatrixGaussianMechanism`; only the calibration differs (Theorem 3
    instead of Du et al.'s Theorem 2). `event` is the MatrixGaussian of the noise actually drawn,
    so an accountant reports the mechanism's true ε, never more than the ε it was calibrated for.
    """

    gamma: float | None = None
    """sup_X ‖f(X)‖_F the calibration assumed (set by `calibrated`; None when built directly)."""

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
        gamma: float | None = None,
        row_factor: Tensor | None = None,
        column_factor: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> MVGMechanism:
        """The MVG mechanism that is (ε, δ)-DP over `releases` releases on one input.

        Each release meets Theorem 3 at (ε/k, δ/k), so k of them are (ε, δ)-DP by basic
        composition (Dwork & Roth 2014, Theorem 3.16); MVG has no tighter composition of its
        own. With `row_factor` B and `column_factor` C (their "directional noise") the
        shape is kept and the overall scale set so that ‖σ(Σ⁻¹)‖₂‖σ(Ψ⁻¹)‖₂ equals the budget.
        """
        releases = check.count(releases, "number of releases")
        epsilon = check.positive("epsilon", epsilon)
        delta = check.delta(delta)
        budget = mvg_precision_budget(
            epsilon / releases, delta / releases, sensitivity, rows, columns, gamma
        )
        shape = MatrixGaussianMechanism(
            rows, columns, 1.0, sensitivity, row_factor=row_factor, column_factor=column_factor
        )
        spread = _inverse_spectrum_norm(shape.row_factor, shape.rows) * _inverse_spectrum_norm(
            shape.column_factor, shape.columns
        )
        mechanism = cls(
            shape.rows,
            shape.columns,
            math.sqrt(spread / budget),
            shape.sensitivity,
            row_factor=shape.row_factor,
            column_factor=shape.column_factor,
            generator=generator,
        )
        mechanism.gamma = _gamma(mechanism.sensitivity, gamma)
        return mechanism

    def mvg_condition(self) -> float:
        """‖σ(Σ⁻¹)‖₂ · ‖σ(Ψ⁻¹)‖₂ of the noise drawn, the left side of Theorem 3."""
        return float(
            torch.linalg.vector_norm(torch.linalg.svdvals(self.row_covariance).pow(-1))
            * torch.linalg.vector_norm(torch.linalg.svdvals(self.column_covariance).pow(-1))
        )
