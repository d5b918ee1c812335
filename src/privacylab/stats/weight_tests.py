"""Statistical tests on a model's released weights, the checks against white-box memorization
(Song, Ristenpart & Shmatikov, CCS 2017, Sec. 4; seed 004, Exercise 4): the low mantissa bits
of float32 weights (LSB encoding, Sec. 4.1), Pearson correlation of parameter blocks with data
rows (correlated value encoding, Sec. 4.2), and the randomness of the weights' signs (sign
encoding, Sec. 4.3).

Every test returns a p-value under its null hypothesis of honest weights; scanning many windows
is corrected by Bonferroni (`bonferroni_log10`: -log10 of min(1, m · p_min), computed from
log p so that p-values below the float range stay ordered). Numpy and scipy only.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats

from privacylab.stats._checks import StatisticsError

__all__ = [
    "block_correlations",
    "bonferroni_log10",
    "chi2_logsf",
    "chi_square_uniform",
    "low_mantissa_bits",
    "positive_share_test",
    "runs_test",
    "serial_sign_correlation",
    "window_chi_square",
    "windows",
]


def _float32(values: object) -> np.ndarray:
    v = np.asarray(values)
    if v.dtype != np.float32:
        raise StatisticsError(f"weights must be float32, got {v.dtype}")
    if v.size == 0:
        raise StatisticsError("no weights to test")
    return np.ascontiguousarray(v.ravel())


def low_mantissa_bits(values: object, bits: int = 8) -> np.ndarray:
    """The `bits` (1..23) least significant mantissa bits of each float32 value, as integers
    in [0, 2^bits) read through the IEEE-754 bit pattern (the bits LSB encoding overwrites)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 23:
        raise StatisticsError(f"mantissa bits must be a whole number in [1, 23], got {bits!r}")
    return (_float32(values).view(np.uint32) & np.uint32((1 << bits) - 1)).astype(np.int64)


def chi_square_uniform(counts: object) -> tuple[float, float]:
    """Pearson's chi-square test of `counts` (k >= 2 cells) against equal cell probabilities:
    (X² = Σ (O - E)² / E, log p) with p = P(χ²_{k-1} >= X²) (natural log, so that p below
    1e-308 keeps its order)."""
    c = np.asarray(counts, dtype=np.float64).ravel()
    if c.size < 2 or np.any(c < 0) or c.sum() <= 0:
        raise StatisticsError("a chi-square test needs >= 2 non-negative counts, not all zero")
    expected = c.sum() / c.size
    statistic = float(((c - expected) ** 2).sum() / expected)
    return statistic, chi2_logsf(statistic, c.size - 1)


def chi2_logsf(statistic: float, df: int) -> float:
    """log P(χ²_df >= statistic); where scipy's value underflows (p < 1e-308, always far
    beyond the mean, x = X²/2 > a + 1 with a = df/2), log Q(a, x) from the continued fraction
    of the upper incomplete gamma function, Γ(a, x) = e^-x x^a / (x + 1 - a - 1(1 - a) /
    (x + 3 - a - 2(2 - a) / (x + 5 - a - ...))) (Abramowitz & Stegun 6.5.31; evaluated by the
    modified Lentz method), less log Γ(a) — so that extreme statistics keep their order and
    the result stays finite."""
    exact = float(stats.chi2.logsf(statistic, df))
    if math.isfinite(exact):
        return exact
    a, x = df / 2.0, statistic / 2.0
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    fraction = d
    for i in range(1, 10_000):
        term = -i * (i - a)
        b += 2.0
        d = term * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + term / c
        c = c if abs(c) > tiny else tiny
        step = c * d
        fraction *= step
        if abs(step - 1.0) < 1e-15:
            break
    return a * math.log(x) - x - math.lgamma(a) + math.log(fraction)


def windows(size: int, window: int) -> list[tuple[int, int]]:
    """[start, stop) of consecutive windows of `window` positions covering `size`; the last
    one is merged into its predecessor when shorter than half a window."""
    if window < 1 or size < 1:
        raise StatisticsError(f"windows need a positive size and window, got {size}, {window}")
    cuts = [*range(0, size, window), size]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] < window // 2:
        del cuts[-2]
    return list(itertools.pairwise(cuts))


def window_chi_square(values: object, window: int = 4096, bits: int = 8) -> np.ndarray:
    """Per window of `window` consecutive float32 values: the log p-value of the chi-square
    uniformity test of their low `bits` mantissa bits over the 2^bits possible values."""
    low = low_mantissa_bits(values, bits)
    cells = 1 << bits
    out = [
        chi_square_uniform(np.bincount(low[a:b], minlength=cells))[1]
        for a, b in windows(low.size, window)
    ]
    return np.array(out)


def bonferroni_log10(log_p: object) -> float:
    """-log10 of the Bonferroni-corrected smallest p-value of m tests given their natural-log
    p-values: -log10 min(1, m · min p) >= 0; larger is more anomalous."""
    lp = np.asarray(log_p, dtype=np.float64).ravel()
    if lp.size == 0:
        raise StatisticsError("no p-values to correct")
    corrected = float(lp.min()) + math.log(lp.size)
    return 0.0 if corrected >= 0 else -corrected / math.log(10)


def runs_test(signs: object) -> tuple[float, float]:
    """Wald-Wolfowitz runs test of a two-valued sequence (booleans / 0-1): (z, log p two-sided).

    With n1, n2 the counts of each value and R the number of runs, under exchangeability
    E[R] = 2 n1 n2 / n + 1 and Var R = 2 n1 n2 (2 n1 n2 - n) / (n² (n - 1)) (Wald & Wolfowitz
    1940); z = (R - E[R]) / sd, p from the normal approximation. A constant sequence (one
    value only) gets z = 0, log p = 0 (no test possible); `positive_share_test` sees it."""
    s = np.asarray(signs).ravel().astype(bool)
    n = s.size
    if n < 2:
        raise StatisticsError(f"a runs test needs at least 2 values, got {n}")
    n1 = int(s.sum())
    n2 = n - n1
    if n1 == 0 or n2 == 0:
        return 0.0, 0.0
    runs = 1 + int(np.count_nonzero(s[1:] != s[:-1]))
    mean = 2.0 * n1 * n2 / n + 1.0
    var = 2.0 * n1 * n2 * (2.0 * n1 * n2 - n) / (n * n * (n - 1.0))
    if var <= 0:
        return 0.0, 0.0
    z = (runs - mean) / math.sqrt(var)
    return z, float(math.log(2.0) + stats.norm.logsf(abs(z)))


def positive_share_test(signs: object) -> tuple[float, float]:
    """Two-sided test that a 0/1 sequence has P(1) = 1/2 (normal approximation of the
    binomial): (z, log p) with z = (k - n/2) / (sqrt(n) / 2)."""
    s = np.asarray(signs).ravel().astype(bool)
    n = s.size
    if n < 1:
        raise StatisticsError("a share test needs at least one value")
    z = (float(s.sum()) - n / 2.0) / (math.sqrt(n) / 2.0)
    return z, float(math.log(2.0) + stats.norm.logsf(abs(z)))


def serial_sign_correlation(values: object, lag: int = 1) -> float:
    """Pearson correlation of sign(θ_i) and sign(θ_{i+lag}) (zeros count as positive): near 0
    for independent signs; encoded image bits are strongly correlated at lag 1 and at the
    image's row width."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1 or lag >= v.size - 1:
        raise StatisticsError(f"lag must be a whole number in [1, {v.size - 2}], got {lag!r}")
    s = np.where(v >= 0, 1.0, -1.0)
    a, b = s[:-lag], s[lag:]
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def block_correlations(values: object, rows: object, block: int, *, chunk: int = 256) -> np.ndarray:
    """|Pearson r| between every aligned block of `block` consecutive values (blocks start at
    multiples of `block`; a trailing partial block is dropped) and every row of `rows`
    (n, block): an array (blocks, n). A constant block or row has r = 0."""
    v = np.asarray(values, dtype=np.float64).ravel()
    r = np.asarray(rows, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] != block or len(r) == 0:
        raise StatisticsError(f"rows must have shape (n, {block}), got {r.shape}")
    count = v.size // block
    if count == 0:
        raise StatisticsError(f"{v.size} values hold no block of {block}")

    def standardise(m: np.ndarray) -> np.ndarray:
        m = m - m.mean(axis=1, keepdims=True)
        norm = np.linalg.norm(m, axis=1, keepdims=True)
        return np.divide(m, norm, out=np.zeros_like(m), where=norm > 0)

    blocks = standardise(v[: count * block].reshape(count, block))
    data = standardise(r)
    out = np.empty((count, len(r)))
    for start in range(0, count, chunk):
        out[start : start + chunk] = np.abs(blocks[start : start + chunk] @ data.T)
    return np.minimum(out, 1.0)
