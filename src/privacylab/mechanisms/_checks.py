"""Input checks shared by the mechanisms (one clear line per bad value)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privacylab.accounting._validate import PrivacyParameterError


def finite_array(name: str, value: ArrayLike) -> np.ndarray:
    """`value` as a float array with only finite entries, or PrivacyParameterError."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise PrivacyParameterError(f"{name} must be numeric, got {type(value).__name__}") from None
    if not np.isfinite(array).all():
        raise PrivacyParameterError(f"{name} must be finite (no NaN or inf)")
    return array


def generator(rng: np.random.Generator | int) -> np.random.Generator:
    """A numpy Generator from a Generator or an integer seed (no unseeded randomness)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise PrivacyParameterError(
        f"rng must be a numpy Generator or an integer seed, got {type(rng).__name__}"
    )
