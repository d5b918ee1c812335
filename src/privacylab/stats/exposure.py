"""Exposure of a planted secret (Carlini et al. 2019, "The Secret Sharer: Evaluating and Testing
Unintended Memorization in Neural Networks", Sec. 4).

A canary `s[r]` (a format `s` filled with a secret `r` drawn uniformly from a space R) is ranked
among all candidates `s[r']`, r' in R, by its log-perplexity under the model (rank 1 = the
lowest log-perplexity, the most likely). Its exposure (Def. 4) is

    exposure(s[r]) = log2 |R| - log2 rank(s[r])

between 0 (the least likely candidate) and log2 |R| (the most likely one). A uniformly random
rank has expected exposure about 1/ln 2 = 1.44 bits (Sec. 4.2), the level of a canary the model
never saw.

- Enumeration (Sec. 4.3, "Efficiently computing exposure"): score every candidate; the rank is
  exact. Ties (equal log-perplexities) are split evenly: the mid-rank, 1 + #{smaller} +
  #{equal}/2 (the paper does not say; TF Privacy's `compute_exposure_interpolation` breaks ties
  by sort order).
- Extrapolation (Sec. 4.3, "Extrapolation to non-enumerable spaces"): fit a skew-normal
  distribution to the log-perplexities of candidates drawn uniformly from R and read
  rank/|R| ~ Pr[X <= log-perplexity of the canary] off its CDF, so

      exposure ~ -log2 CDF(canary's log-perplexity),

  as TF Privacy's `compute_exposure_extrapolation` (tensorflow_privacy/privacy/privacy_tests/
  secret_sharer/exposures.py), which fits `scipy.stats.skewnorm` by maximum likelihood. The
  extrapolated value is not capped at log2 |R| (a canary far below the fitted left tail can
  read more); `SkewNormal.exposure` computes log CDF in log space so deep tails stay finite.

numpy/scipy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy import integrate
from scipy.stats import skewnorm

from privacylab.stats._checks import StatisticsError

__all__ = [
    "RANDOM_EXPOSURE",
    "SkewNormal",
    "enumerated_exposure",
    "exposure_from_rank",
    "extrapolated_exposure",
    "fit_skew_normal",
    "rank_among",
]

RANDOM_EXPOSURE = 1.0 / math.log(2.0)
"""The expected exposure of a uniformly random rank in a large space, 1/ln 2 ~ 1.44 bits
(Carlini et al. 2019, Sec. 4.2): what a canary the model never saw should show."""


def _value(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real | np.floating | np.integer):
        raise StatisticsError(f"{name} must be a real number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise StatisticsError(f"{name} must be finite, got {value!r}")
    return number


def _values(name: str, values: object, *, minimum: int = 1) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise StatisticsError(f"{name} must be an array of real numbers") from None
    if array.size < minimum:
        raise StatisticsError(f"{name} needs at least {minimum} values, got {array.size}")
    if not np.isfinite(array).all():
        raise StatisticsError(f"{name} hold NaN or infinite values")
    return array


def _space(space_size: object) -> int | float:
    if isinstance(space_size, bool):
        raise StatisticsError(f"space_size must be a number >= 1, got {space_size!r}")
    if isinstance(space_size, Integral):
        size: int | float = int(space_size)
    elif isinstance(space_size, Real | np.floating):
        size = float(space_size)  # type: ignore[arg-type]
    else:
        raise StatisticsError(f"space_size must be a number >= 1, got {space_size!r}")
    if not (math.isfinite(size) and size >= 1):
        raise StatisticsError(f"space_size must be a finite number >= 1, got {space_size!r}")
    return size


def exposure_from_rank(rank: float, space_size: int | float) -> float:
    """log2 |R| - log2 rank (Carlini et al. 2019, Def. 4): `rank` in [1, space_size] (a mid-rank
    may be fractional); `space_size` = |R| (a Python int of any size is exact)."""
    size = _space(space_size)
    position = _value("rank", rank)
    if not 1.0 <= position <= float(size):
        raise StatisticsError(f"rank must be in [1, {size}], got {rank!r}")
    return max(0.0, math.log2(size) - math.log2(position))


def rank_among(canary_value: float, candidate_values: np.ndarray) -> float:
    """The rank `canary_value` takes among `candidate_values` (the OTHER candidates, the canary
    itself not among them) and itself, lowest first: 1 + #{smaller} + #{equal}/2 (the mid-rank:
    ties split evenly)."""
    value = _value("canary_value", canary_value)
    others = _values("candidate_values", candidate_values, minimum=0)
    smaller = int(np.count_nonzero(others < value))
    equal = int(np.count_nonzero(others == value))
    return 1.0 + smaller + equal / 2.0


def enumerated_exposure(canary_value: float, all_values: np.ndarray) -> float:
    """Exact exposure over an enumerated space: `all_values` are the log-perplexities of EVERY
    candidate of R, the canary's own among them (one value equal to `canary_value`), so |R| =
    len(all_values) and the canary's mid-rank excludes itself (Carlini et al. 2019, Sec. 4.3)."""
    value = _value("canary_value", canary_value)
    every = _values("all_values", all_values)
    smaller = int(np.count_nonzero(every < value))
    equal = int(np.count_nonzero(every == value))
    if equal == 0:
        raise StatisticsError(
            "all_values must hold the canary's own value (the whole space, canary included)"
        )
    return exposure_from_rank(1.0 + smaller + (equal - 1) / 2.0, every.size)


@dataclass(frozen=True)
class SkewNormal:
    """A fitted skew-normal law (scipy.stats.skewnorm's shape `a`, `loc`, `scale`) of candidate
    log-perplexities (Carlini et al. 2019, Sec. 4.3, Fig. 3)."""

    a: float
    loc: float
    scale: float

    def log2_cdf(self, value: float) -> float:
        """log2 Pr[X <= value], finite however deep in the left tail: scipy's logcdf, and
        `tail_log2_cdf` below what it resolves."""
        x = _value("value", value)
        log_cdf = float(skewnorm.logcdf(x, self.a, self.loc, self.scale))
        if math.isfinite(log_cdf):
            return log_cdf / math.log(2.0)
        return self.tail_log2_cdf(x)

    def tail_log2_cdf(self, value: float) -> float:
        """log2 Pr[X <= value] as log pdf(value) + log of the integral over u >= 0 of
        pdf(value - u) / pdf(value) (quadrature in log space: no underflow in the left tail)."""
        x = _value("value", value)
        log_at = float(skewnorm.logpdf(x, self.a, self.loc, self.scale))
        if not math.isfinite(log_at):
            raise StatisticsError(f"the fitted law gives {value!r} no density to extrapolate")

        def ratio(u: float) -> float:
            log_pdf = float(skewnorm.logpdf(x - u, self.a, self.loc, self.scale))
            return math.exp(log_pdf - log_at)

        mass, _ = integrate.quad(ratio, 0.0, math.inf, limit=200)
        return (log_at + math.log(mass)) / math.log(2.0)

    def exposure(self, value: float) -> float:
        """-log2 CDF(value): the extrapolated exposure of a canary of log-perplexity `value`."""
        return max(0.0, -self.log2_cdf(value))

    def to_dict(self) -> dict[str, float]:
        """JSON-ready form."""
        return {"a": self.a, "loc": self.loc, "scale": self.scale}


def fit_skew_normal(sampled_values: np.ndarray) -> SkewNormal:
    """Maximum-likelihood skew-normal fit (`scipy.stats.skewnorm.fit`, as TF Privacy) to the
    log-perplexities of candidates drawn uniformly from R; at least 3 distinct values."""
    values = _values("sampled_values", sampled_values, minimum=3)
    if np.unique(values).size < 3:
        raise StatisticsError("a skew-normal fit needs at least 3 distinct sampled values")
    a, loc, scale = skewnorm.fit(values)
    if not (math.isfinite(a) and math.isfinite(loc) and math.isfinite(scale) and scale > 0):
        raise StatisticsError("the skew-normal fit did not converge")
    return SkewNormal(float(a), float(loc), float(scale))


def extrapolated_exposure(canary_value: float, sampled_values: np.ndarray) -> float:
    """-log2 CDF(canary_value) under the skew-normal fitted to `sampled_values`, the
    log-perplexities of candidates drawn uniformly from R (Carlini et al. 2019, Sec. 4.3)."""
    value = _value("canary_value", canary_value)
    return fit_skew_normal(sampled_values).exposure(value)
