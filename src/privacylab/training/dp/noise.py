"""DP-SGD noise: kept for compatibility; the noise is owned by
:class:`privacylab.mechanisms.GaussianMechanism` (see :mod:`privacylab.mechanisms.secure` for
the floating-point caveat of Mironov 2012)."""

from __future__ import annotations

import torch
from torch import Tensor

from privacylab.mechanisms.gaussian_tensor import GaussianMechanism
from privacylab.mechanisms.secure import secure_standard_normal

__all__ = ["GaussianNoise", "secure_standard_normal"]


class GaussianNoise:
    """N(0, std²) noise for each parameter, drawn by a `GaussianMechanism` (Abadi et al. 2016,
    Alg. 1).

    Args:
        generator: a ``torch.Generator`` for reproducible noise, or ``None`` for torch's default
            generator.  Ignored when ``secure`` is true.
        secure: draw from the OS CSPRNG (``os.urandom``) instead; slower, not reproducible.
    """

    def __init__(self, generator: torch.Generator | None = None, secure: bool = False) -> None:
        self.generator = None if secure else generator
        self.secure = secure

    def sample(self, like: Tensor, std: float) -> Tensor:
        """A tensor shaped like ``like`` with i.i.d. N(0, std²) entries."""
        mechanism = GaussianMechanism(std, generator=self.generator, secure=self.secure)
        return mechanism.noise(like)
