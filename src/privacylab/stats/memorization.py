"""Recovery statistics of memorization attacks (Song, Ristenpart & Shmatikov, CCS 2017):
bit streams in and out, bit accuracy, exact-match rate, mean absolute error, and the bits a
label carries.

Secrets are handled as bit streams: a value quantised to `bits` bits is written most
significant bit first (`to_bits`), and read back by `from_bits`. Numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from privacylab.stats._checks import StatisticsError

__all__ = [
    "bit_accuracy",
    "bits_per_label",
    "exact_match_rate",
    "from_bits",
    "mean_absolute_error",
    "to_bits",
]


def _bits_arg(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int | np.integer) or not 1 <= bits <= 64:
        raise StatisticsError(f"bits per value must be a whole number in [1, 64], got {bits!r}")
    return int(bits)


def to_bits(values: object, bits: int) -> np.ndarray:
    """The non-negative integers `values` (any shape) as one flat uint8 stream of 0/1, `bits`
    per value, most significant first; a value outside [0, 2^bits) is refused."""
    width = _bits_arg(bits)
    v = np.asarray(values)
    if v.size and not np.issubdtype(v.dtype, np.integer):
        raise StatisticsError(f"values to write as bits must be integers, got {v.dtype}")
    flat = v.astype(np.uint64).ravel()
    if v.size and (np.any(v < 0) or (width < 64 and np.any(flat >> np.uint64(width)))):
        raise StatisticsError(f"values must lie in [0, 2^{width}) to be written in {width} bits")
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint64)
    return ((flat[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8).ravel()


def from_bits(stream: object, bits: int) -> np.ndarray:
    """Inverse of `to_bits`: a flat stream of 0/1 (length a multiple of `bits`) as uint64
    values."""
    width = _bits_arg(bits)
    s = np.asarray(stream).ravel()
    if s.size % width:
        raise StatisticsError(
            f"a stream of {s.size} bits is not a whole number of {width}-bit values"
        )
    if s.size and not np.all((s == 0) | (s == 1)):
        raise StatisticsError("a bit stream holds only 0 and 1")
    grouped = s.astype(np.uint64).reshape(-1, width)
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint64)
    return (grouped << shifts[None, :]).sum(axis=1, dtype=np.uint64)


def bit_accuracy(true_bits: object, decoded_bits: object) -> float:
    """Share of positions where the decoded stream equals the true one (same length)."""
    t, d = np.asarray(true_bits).ravel(), np.asarray(decoded_bits).ravel()
    if t.size == 0 or t.shape != d.shape:
        raise StatisticsError(
            f"bit accuracy needs two non-empty streams of one length, got {t.size} and {d.size}"
        )
    return float(np.mean(t == d))


def exact_match_rate(true_rows: object, decoded_rows: object) -> float:
    """Share of rows (first axis) decoded exactly, every value equal."""
    t, d = np.asarray(true_rows), np.asarray(decoded_rows)
    if t.ndim == 0 or len(t) == 0 or t.shape != d.shape:
        raise StatisticsError(
            f"exact match needs two non-empty arrays of one shape, got {t.shape} and {d.shape}"
        )
    return float(np.mean(np.all(t.reshape(len(t), -1) == d.reshape(len(d), -1), axis=1)))


def mean_absolute_error(true_rows: object, decoded_rows: object) -> np.ndarray:
    """Mean absolute error per row (first axis), in the rows' own units: Song et al. 2017's
    mean absolute pixel error (MAPE) for images; their code (csong27/ml-model-remember)
    reports it on the 0..255 pixel scale, so with pixels in [0, 1] multiply by 255 to
    compare."""
    t = np.asarray(true_rows, dtype=np.float64)
    d = np.asarray(decoded_rows, dtype=np.float64)
    if t.ndim == 0 or len(t) == 0 or t.shape != d.shape:
        raise StatisticsError(
            f"MAE needs two non-empty arrays of one shape, got {t.shape} and {d.shape}"
        )
    return np.abs(t - d).reshape(len(t), -1).mean(axis=1)


def bits_per_label(num_classes: int) -> int:
    """⌊log2 n⌋: the secret bits one label of an n-class model carries in capacity-abuse
    encoding (Song et al. 2017, Sec. 5: each synthetic input is labelled with the class whose
    index is the next ⌊log2 n⌋ bits)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
        raise StatisticsError(f"the number of classes must be a whole number, got {num_classes!r}")
    if num_classes < 2:
        raise StatisticsError(f"a label carries no bits with {num_classes} class(es)")
    return math.floor(math.log2(int(num_classes)))
