"""Statistics of a language model's token log-probabilities: the one place of the formulas that
rank generated text for extraction and score documents for membership inference.

Every function takes the log-probabilities log f(x_t | x_<t) of the scored tokens of ONE text
(natural log, a 1-D array, NaN-free) and returns a float. Conventions follow the papers:

- log-perplexity  log P = -(1/n) sum_t log f(x_t | x_<t)   (Carlini et al. 2021, Sec. 2.1)
- zlib entropy: the length in bits of the text's UTF-8 bytes compressed by zlib at its default
  level (Carlini et al. 2021, Sec. 5.2, "Comparing to zlib compression")
- window: the minimum log-perplexity over sliding windows of w tokens (ibid., w = 50)
- Min-K% Prob: the mean of the k% lowest token log-probabilities (Shi et al. 2024, "Detecting
  Pretraining Data from Large Language Models", Eq. 1); k% of n tokens is floor(k n), as in the
  reference code of Shi et al. and Zhang et al. and in mimir, but never fewer than one token
- Min-K%++: the mean of the k% lowest token scores (log f(x_t|x_<t) - mu_t) / sigma_t, with mu_t
  and sigma_t the mean and standard deviation of log f(z | x_<t) for z drawn from the model's own
  next-token distribution (Zhang et al. 2024, "Min-K%++: Improved Baseline for Detecting
  Pre-Training Data from Large Language Models", Eq. 3-4)

The extraction ranking metrics (`extraction_metrics`) are oriented so that HIGHER means more
likely memorised, as are membership scores (`membership_scores`): higher means more likely a
training member.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import numpy as np

from privacylab.stats._checks import StatisticsError

__all__ = [
    "EXTRACTION_METRICS",
    "MEMBERSHIP_SCORES",
    "distribution_moments",
    "extraction_metrics",
    "log_perplexity",
    "membership_scores",
    "min_k_percent",
    "min_k_plus_plus",
    "window_log_perplexity",
    "zlib_entropy",
]

EXTRACTION_METRICS = ("perplexity", "small", "tiny", "zlib", "lowercase", "window")
"""Carlini et al. 2021, Table 2's six membership-inference metrics as privacylab runs them on its
"medium" target: perplexity; the ratio to a reference model one size down ("small", the role of
the paper's GPT-2 Medium beside XL) and two sizes down ("tiny", the paper's GPT-2 Small); zlib;
the lowercased text; the minimum over a sliding window. A reference ratio is named after the
reference model (`extraction_metrics(references=...)`)."""

MEMBERSHIP_SCORES = ("loss", "zlib", "reference", "lowercase", "min-k", "min-k++")
"""The LM membership-inference scores (as in mimir, Duan et al. 2024): loss (Yeom et al. 2018),
zlib and lowercase (Carlini et al. 2021), reference-model ratio (Carlini et al. 2021; Mireshghallah
et al. 2022), Min-K% (Shi et al. 2024), Min-K%++ (Zhang et al. 2024)."""


def _log_probs(log_probs: np.ndarray) -> np.ndarray:
    values = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise StatisticsError("a text needs at least one scored token")
    if not np.isfinite(values).all():
        raise StatisticsError("token log-probabilities must be finite (drop padding first)")
    return values


def _fraction(k: float) -> float:
    real = isinstance(k, int | float | np.integer | np.floating) and not isinstance(k, bool)
    if not (real and 0.0 < float(k) <= 1.0):
        raise StatisticsError(f"k must be a fraction in (0, 1], got {k!r}")
    return float(k)


def _selected(k: float, n: int) -> int:
    """How many of n tokens "the k% lowest" holds: floor(k n) (with 1e-9 of slack for k n
    computed in floating point, so 0.3 * 10 is 3), at least 1."""
    return max(1, math.floor(_fraction(k) * n + 1e-9))


def log_perplexity(log_probs: np.ndarray) -> float:
    """-(1/n) sum_t log f(x_t | x_<t): the log of the perplexity (Carlini et al. 2021, Sec. 2.1)."""
    return float(-_log_probs(log_probs).mean())


def zlib_entropy(text: str) -> float:
    """Bits of `text`'s UTF-8 bytes compressed by zlib at its default level (Carlini et al.
    2021, Sec. 5.2); LM_Memorization and mimir compress the same way and count bytes, 8 times
    fewer, which ranks identically."""
    return 8.0 * len(zlib.compress(text.encode("utf-8")))


def window_log_perplexity(log_probs: np.ndarray, window: int = 50) -> float:
    """The minimum log-perplexity over all windows of `window` consecutive tokens (the whole text
    when shorter): Carlini et al. 2021, Sec. 5.2, "Perplexity on a sliding window"."""
    values = _log_probs(log_probs)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise StatisticsError(f"window must be a whole number >= 1, got {window!r}")
    if values.size <= window:
        return float(-values.mean())
    sums = np.convolve(values, np.ones(window), mode="valid")
    return float(-sums.max() / window)


def min_k_percent(log_probs: np.ndarray, k: float = 0.2) -> float:
    """Min-K% Prob (Shi et al. 2024, Eq. 1): the mean log-probability of the `_selected(k, n)`
    = max(1, floor(k n)) least likely of the n tokens; higher means more likely a member.

    mimir (Duan et al. 2024, `attacks/min_k.py`) returns the negated mean over int(k n) tokens
    (lower = member; empty and NaN when k n < 1); the ranking is the same otherwise."""
    values = np.sort(_log_probs(log_probs))
    return float(values[: _selected(k, values.size)].mean())


def distribution_moments(log_dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mu_t = E_{z~p_t}[log p_t(z)] and sigma_t = sqrt(E[log p_t(z)^2] - mu_t^2) of next-token
    log-distributions `log_dist` (..., vocab): Zhang et al. 2024, Eq. 3 (computed exactly over
    the vocabulary)."""
    log_dist = np.asarray(log_dist, dtype=np.float64)
    probs = np.exp(log_dist)
    finite = np.where(np.isfinite(log_dist), log_dist, 0.0)
    mu = (probs * finite).sum(-1)
    second = (probs * finite**2).sum(-1)
    return mu, np.sqrt(np.maximum(second - mu**2, 0.0))


def min_k_plus_plus(
    log_probs: np.ndarray, mu: np.ndarray, sigma: np.ndarray, k: float = 0.2
) -> float:
    """Min-K%++ (Zhang et al. 2024, Eq. 4): the mean over the max(1, floor(k n)) lowest of
    (log p(x_t|x_<t) - mu_t) / sigma_t (Eq. 3); higher means more likely a member. A position
    whose next-token distribution is a point mass (sigma_t = 0) divides by 1e-12 instead.

    mimir (`attacks/min_k_plus_plus.py`) computes the same mu and sigma over the whole
    vocabulary and returns the negated mean over int(k n) tokens (lower = member)."""
    values = _log_probs(log_probs)
    mu = np.asarray(mu, dtype=np.float64).reshape(-1)
    sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
    if mu.shape != values.shape or sigma.shape != values.shape:
        raise StatisticsError("mu and sigma need one value per scored token")
    z = np.sort((values - mu) / np.maximum(sigma, 1e-12))
    return float(z[: _selected(k, z.size)].mean())


def extraction_metrics(
    text: str,
    log_probs: np.ndarray,
    *,
    lowercase_log_probs: np.ndarray | None = None,
    references: Mapping[str, np.ndarray] | None = None,
    window: int = 50,
) -> dict[str, float]:
    """Carlini et al. 2021's ranking metrics of one generated `text` (Sec. 5.2), higher = more
    likely memorised; a metric whose input is not given is left out.

    - perplexity: -log P (low perplexity first)
    - one per reference model, by its name in `references` (the reference's token
      log-probabilities of the same text): log P_ref / log P, the reference's log-perplexity
      over the target's ("Small" and "Medium" in the paper)
    - zlib: zlib entropy / log P
    - lowercase: log P(lowercased text) / log P, both under the target
    - window: -(minimum log-perplexity over `window`-token windows)

    A ratio whose denominator log P is <= 0 (the target gives the text probability 1) is +inf.
    """
    log_p = log_perplexity(log_probs)

    def ratio(numerator: float) -> float:
        return numerator / log_p if log_p > 0 else math.inf

    out = {"perplexity": -log_p}
    for name, reference in (references or {}).items():
        if name in ("perplexity", "zlib", "lowercase", "window"):
            raise StatisticsError(f"a reference model may not be named {name!r}")
        out[name] = ratio(log_perplexity(reference))
    out["zlib"] = ratio(zlib_entropy(text))
    if lowercase_log_probs is not None:
        out["lowercase"] = ratio(log_perplexity(lowercase_log_probs))
    out["window"] = -window_log_perplexity(log_probs, window)
    return out


def membership_scores(
    text: str,
    log_probs: np.ndarray,
    *,
    reference_log_probs: np.ndarray | None = None,
    lowercase_log_probs: np.ndarray | None = None,
    mu: np.ndarray | None = None,
    sigma: np.ndarray | None = None,
    k: float = 0.2,
) -> dict[str, float]:
    """The LM membership scores of one document (`MEMBERSHIP_SCORES`), higher = more likely a
    member; a score whose input is not given is left out.

    - loss: -log P (Yeom et al. 2018's loss attack)
    - zlib: -log P / zlib entropy (Carlini et al. 2021's zlib ratio; mimir's zlib attack)
    - reference: log P_ref - log P (calibration by a reference model: Carlini et al. 2021's
      "small" metric in difference form, Mireshghallah et al. 2022's likelihood ratio)
    - lowercase: log P(lowercased) / log P (Carlini et al. 2021)
    - min-k: Min-K% Prob; min-k++: Min-K%++ (needs mu and sigma)

    Against mimir (Duan et al. 2024), whose scores are lower = member: loss is mimir's LOSS
    negated; zlib is mimir's loss / zlib bytes negated and divided by 8 (bits here), the same
    ranking; reference is mimir's loss - reference loss negated; mimir has no lowercase attack.
    """
    log_p = log_perplexity(log_probs)
    out = {"loss": -log_p, "zlib": -log_p / zlib_entropy(text)}
    if reference_log_probs is not None:
        out["reference"] = log_perplexity(reference_log_probs) - log_p
    if lowercase_log_probs is not None:
        out["lowercase"] = log_perplexity(lowercase_log_probs) / log_p if log_p > 0 else math.inf
    out["min-k"] = min_k_percent(log_probs, k)
    if mu is not None and sigma is not None:
        out["min-k++"] = min_k_plus_plus(log_probs, mu, sigma, k)
    return out
