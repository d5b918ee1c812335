"""The Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privacylab.accounting import _validate as check
from privacylab.mechanisms._checks import finite_array, generator


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale b = Δ₁/ε that makes the Laplace mechanism ε-DP (Dwork & Roth 2014, Theorem 3.6)."""
    epsilon = check.positive("epsilon", epsilon)
    return check.positive("sensitivity", sensitivity) / epsilon


def add_laplace_noise(value: ArrayLike, scale: float, rng: np.random.Generator | int) -> np.ndarray:
    """`value` + i.i.d. Lap(b) noise (Dwork & Roth 2014, Definition 3.3).

    `rng` is a numpy Generator or an integer seed.
    """
    array = finite_array("value", value)
    scale = check.positive("Laplace scale", scale)
    return array + generator(rng).laplace(0.0, scale, size=array.shape)
