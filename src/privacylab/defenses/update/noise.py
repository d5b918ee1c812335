"""Noise added to every coordinate of a client's update: the "noisy gradients" defence of Zhu
et al. 2019 (Deep Leakage from Gradients, Sec. 5, Fig. 8: Gaussian and Laplacian noise of
variance 1e-4 ... 1e-1; only variance >= 1e-2 stopped the attack, at an accuracy cost).

Both are parameterised by the noise *variance*, as in the paper, not by a scale: Gaussian
N(0, VAR) and Laplace(0, b) with b = sqrt(VAR / 2) (Var Laplace(b) = 2 b^2). There is no
privacy guarantee here (no clipping bounds the sensitivity); that is `dp`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from privacylab.defenses.base import Parameter
from privacylab.defenses.update.base import UpdateDefense, draw, register_update_defense

__all__ = ["GaussianUpdateNoise", "LaplaceUpdateNoise"]

_VARIANCE = Parameter(
    "variance",
    float,
    None,
    "variance of the noise added to each coordinate",
    low=0.0,
    low_open=True,
)


@register_update_defense
class GaussianUpdateNoise(UpdateDefense):
    """Each coordinate of the update plus independent N(0, variance) noise (Zhu et al. 2019,
    Sec. 5)."""

    name = "noise"
    parameters: ClassVar[tuple[Parameter, ...]] = (_VARIANCE,)
    paper = "Zhu et al. 2019, Deep Leakage from Gradients, Sec. 5 (noisy gradients)"

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """`tensor` + N(0, variance) per coordinate."""
        return tensor + draw(tensor, generator, "gaussian", math.sqrt(self.params["variance"]))


@register_update_defense
class LaplaceUpdateNoise(UpdateDefense):
    """Each coordinate of the update plus independent Laplace noise of the given variance
    (scale b = sqrt(variance / 2); Zhu et al. 2019, Sec. 5)."""

    name = "laplace"
    parameters: ClassVar[tuple[Parameter, ...]] = (_VARIANCE,)
    paper = "Zhu et al. 2019, Deep Leakage from Gradients, Sec. 5 (noisy gradients)"

    def transform(self, tensor: Tensor, generator: torch.Generator) -> Tensor:
        """`tensor` + Laplace(0, sqrt(variance / 2)) per coordinate."""
        scale = math.sqrt(self.params["variance"] / 2.0)
        return tensor + draw(tensor, generator, "laplace", scale)
