"""Group privacy: what a guarantee for one record says about a group of records."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from privacylab.accounting import _validate as check


def group_privacy_dp(epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(kε, δ (e^{kε} − 1)/(e^ε − 1)) for datasets differing in k = `group_size` records.

    Group privacy of an (ε, δ)-DP algorithm, as in Jagielski, Ullman & Oprea 2020, Lemma 1
    (seed 002, Eq. (2)); Dwork & Roth 2014, Theorem 2.2 for δ = 0. `delta` may be 0; the returned
    δ is capped at 1 (a vacuous guarantee).
    """
    epsilon = check.positive("epsilon", epsilon)
    delta = check.nonnegative("delta", delta)
    if delta >= 1.0:
        raise check.PrivacyParameterError(f"delta must be in [0, 1), got {delta!r}")
    k = check.count(group_size, "group size")
    if delta == 0.0 or k == 1:
        return k * epsilon, delta
    log_growth = k * epsilon + math.log(-math.expm1(-k * epsilon))
    log_factor = log_growth - math.log(math.expm1(epsilon))
    return k * epsilon, math.exp(min(0.0, math.log(delta) + log_factor))


def group_privacy_rdp(
    orders: ArrayLike, rdp: ArrayLike, group_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """RDP of a group: (α, ε)-RDP for one record gives (α/2^c, 3^c ε)-RDP for 2^c records.

    Mironov 2017, "Rényi differential privacy", Proposition 2 (seed 000, "Renyi Properties: Group
    Privacy"): valid when α ≥ 2^{c+1}, i.e. when the new order α/2^c is at least 2. A group size
    that is not a power of two is rounded up to the next one (c = ⌈log₂ k⌉), which is valid since a
    guarantee for a larger group covers a smaller one. Orders with α < 2^{c+1} are dropped; a
    group of one returns the input unchanged.
    """
    alphas = np.atleast_1d(np.asarray(orders, dtype=float))
    values = np.atleast_1d(np.asarray(rdp, dtype=float))
    if alphas.ndim != 1 or alphas.shape != values.shape:
        raise check.PrivacyParameterError(
            f"orders and rdp must be 1-D of equal length, got shapes {alphas.shape} "
            f"and {values.shape}"
        )
    if np.isnan(alphas).any() or (alphas <= 1.0).any():
        raise check.PrivacyParameterError("Rényi orders must be numbers > 1")
    if np.isnan(values).any() or (values < 0.0).any():
        raise check.PrivacyParameterError("RDP values must be numbers >= 0 (inf allowed)")
    k = check.count(group_size, "group size")
    if k == 1:
        return alphas.copy(), values.copy()
    c = math.ceil(math.log2(k))
    if 2**c < k:
        c += 1
    scale = 2.0**c
    keep = alphas >= 2.0 * scale
    if not keep.any():
        raise check.PrivacyParameterError(
            f"group of {k} needs a Rényi order >= {2 * scale:g}, the largest given is "
            f"{alphas.max():g}"
        )
    return alphas[keep] / scale, values[keep] * 3.0**c
