"""The Laplace mechanism (Dwork, McSherry, Nissim & Smith 2006)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privacylab.accounting import _validate as check
from privacylab.accounting.events import EventLedger, Laplace
from privacylab.mechanisms._checks import finite_array, generator


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale b = Δ₁/ε that makes the Laplace mechanism ε-DP (Dwork & Roth 2014, Theorem 3.6)."""
    epsilon = check.positive("epsilon", epsilon)
    return check.positive("sensitivity", sensitivity) / epsilon


def add_laplace_noise(
    value: ArrayLike,
    scale: float,
    rng: np.random.Generator | int,
    *,
    sensitivity: float = 1.0,
    ledger: EventLedger | None = None,
) -> np.ndarray:
    """`value` + i.i.d. Lap(b) noise (Dwork & Roth 2014, Definition 3.3).

    `rng` is a numpy Generator or an integer seed. With a `ledger`, the release is recorded as
    the event `Laplace(b / sensitivity)` (`sensitivity`: the L1 sensitivity of `value`).
    """
    array = finite_array("value", value)
    scale = check.positive("Laplace scale", scale)
    sensitivity = check.positive("sensitivity", sensitivity)
    noisy = array + generator(rng).laplace(0.0, scale, size=array.shape)
    if ledger is not None:
        ledger.record(Laplace(scale / sensitivity))
    return noisy
