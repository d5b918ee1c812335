"""The Gaussian mechanism on tensors: it draws the noise and says which privacy event it ran.

Dwork & Roth 2014, Definition A.1 (and Abadi et al. 2016, Alg. 1, step "add noise"): releasing
f(D) + N(0, σ²Δ² I) for an f with L2 sensitivity Δ is the event ``Gaussian(σ)`` of
:mod:`privacylab.accounting.events` (events are normalised to sensitivity 1). The mechanism
owns its noise source — a seeded ``torch.Generator`` or the OS CSPRNG
(:func:`privacylab.mechanisms.secure.secure_standard_normal`) — so that every noisy release in
privacylab goes through one object that also states its accounting event.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from privacylab.accounting import _validate as check
from privacylab.accounting.events import Gaussian
from privacylab.mechanisms.secure import secure_standard_normal


class GaussianMechanism:
    """Adds N(0, (σΔ)²) noise to tensors and reports the event ``Gaussian(σ)`` per release.

    Args:
        noise_multiplier: σ, the noise standard deviation in units of the sensitivity; 0 is
            allowed (no noise, no privacy: `event` is then None).
        sensitivity: Δ, the L2 sensitivity of the released quantity.
        generator: ``torch.Generator`` for reproducible noise (``None``: torch's default one).
        secure: draw from the OS CSPRNG instead (not reproducible; ``generator`` must be None).
    """

    def __init__(
        self,
        noise_multiplier: float,
        sensitivity: float = 1.0,
        *,
        generator: torch.Generator | None = None,
        secure: bool = False,
    ) -> None:
        sigma = check._as_float("noise multiplier", noise_multiplier)
        if not math.isfinite(sigma) or sigma < 0:
            raise check.PrivacyParameterError(
                f"noise multiplier must be a finite number >= 0, got {noise_multiplier!r}"
            )
        if secure and generator is not None:
            raise check.PrivacyParameterError(
                "secure noise draws from the OS and cannot be seeded; pass no generator"
            )
        self.noise_multiplier = sigma
        self.sensitivity = check.positive("sensitivity", sensitivity)
        self.generator = None if secure else generator
        self.secure = secure

    @property
    def std(self) -> float:
        """σ·Δ: the standard deviation of each noise coordinate."""
        return self.noise_multiplier * self.sensitivity

    @property
    def event(self) -> Gaussian | None:
        """The privacy event of one release (None when σ = 0: no guarantee at all)."""
        return Gaussian(self.noise_multiplier) if self.noise_multiplier > 0 else None

    def noise(self, like: Tensor, out: Tensor | None = None) -> Tensor:
        """A tensor shaped like ``like`` with i.i.d. N(0, (σΔ)²) entries.

        One release may need several draws (one per parameter tensor in DP-SGD); the event is
        that of the release, not of each draw. With σ = 0 nothing is drawn (the generator's
        state is left as it is). ``out`` (contiguous, shaped like ``like``) is filled and
        returned instead of a fresh tensor: the same numbers, without allocating a buffer the
        size of the model at every step.
        """
        std = self.std
        if out is None:
            out = torch.empty_like(like, memory_format=torch.contiguous_format)
        elif out.shape != like.shape or not out.is_contiguous():
            raise ValueError("out must be contiguous and shaped like the tensor it stands for")
        if std == 0.0:
            return out.zero_()
        if self.secure:
            z = secure_standard_normal(like.numel(), like.dtype, like.device)
            return out.copy_(z.view_as(like)).mul_(std)
        return out.normal_(0.0, std, generator=self.generator)

    def release(self, value: Tensor) -> tuple[Tensor, Gaussian | None]:
        """``value + noise`` (a new tensor) and the event of this release."""
        return value + self.noise(value), self.event
