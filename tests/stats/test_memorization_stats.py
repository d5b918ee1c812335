"""Bit streams and recovery statistics of memorization attacks (Song et al. 2017):
`to_bits`/`from_bits` round trips for every width 1..64 (hypothesis), most-significant-first
order against numpy's `unpackbits` (8 bits) and Python's `format`, the statistics against
direct numpy computations, ⌊log2 n⌋ against integer bit lengths, and one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from privacylab.errors import PrivacylabError
from privacylab.stats.memorization import (
    bit_accuracy,
    bits_per_label,
    exact_match_rate,
    from_bits,
    mean_absolute_error,
    to_bits,
)


def _one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    assert isinstance(error.value, PrivacylabError)
    return text


@st.composite
def _values(draw: st.DrawFn) -> tuple[int, list[int]]:
    bits = draw(st.integers(1, 64))
    values = draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=30))
    return bits, values


@given(_values())
def test_round_trip(case: tuple[int, list[int]]) -> None:
    bits, values = case
    stream = to_bits(np.array(values, dtype=np.uint64), bits)
    assert stream.dtype == np.uint8 and stream.size == bits * len(values)
    assert np.array_equal(from_bits(stream, bits), np.array(values, dtype=np.uint64))
    expected = "".join(format(v, f"0{bits}b") for v in values)
    assert "".join(map(str, stream.tolist())) == expected


@given(st.lists(st.integers(0, 255), min_size=1, max_size=64))
def test_msb_first_like_unpackbits(values: list[int]) -> None:
    array = np.array(values, dtype=np.uint8)
    assert np.array_equal(to_bits(array, 8), np.unpackbits(array))
    assert np.array_equal(from_bits(np.unpackbits(array), 8), array.astype(np.uint64))


def test_shapes_and_empty() -> None:
    grid = np.arange(12).reshape(3, 4)
    assert np.array_equal(from_bits(to_bits(grid, 4), 4), grid.ravel())
    assert to_bits(np.array([], dtype=np.int64), 3).size == 0
    assert from_bits(np.array([], dtype=np.uint8), 3).size == 0
    assert np.array_equal(to_bits([2**64 - 1], 64), np.ones(64, np.uint8))


@given(
    st.integers(1, 500),
    st.floats(0.0, 1.0),
    st.integers(0, 2**32 - 1),
)
def test_bit_accuracy_matches_numpy(n: int, flip: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 2, n)
    decoded = np.where(rng.random(n) < flip, 1 - truth, truth)
    assert bit_accuracy(truth, decoded) == pytest.approx(np.count_nonzero(truth == decoded) / n)


def test_exact_match_and_mae_match_numpy() -> None:
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 4, (50, 2, 3))
    decoded = truth.copy()
    decoded[rng.random(50) < 0.4, 1, 2] += 1
    same = sum(np.array_equal(t, d) for t, d in zip(truth, decoded, strict=True))
    assert exact_match_rate(truth, decoded) == same / 50
    x, y = rng.random((7, 1, 5, 5)), rng.random((7, 1, 5, 5))
    mae = mean_absolute_error(x, y)
    assert mae.shape == (7,)
    for i in range(7):
        assert mae[i] == pytest.approx(np.sum(np.abs(x[i] - y[i])) / 25)
    assert np.array_equal(mean_absolute_error(x, x), np.zeros(7))


def test_bits_per_label_against_bit_length() -> None:
    for n in range(2, 1001):
        assert bits_per_label(n) == n.bit_length() - 1 == int(math.log2(n))
    assert bits_per_label(np.int64(1024)) == 10
    assert bits_per_label(2**40 - 1) == 39


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: to_bits([1], 0), "bits per value must be a whole number in [1, 64]"),
        (lambda: to_bits([1], 65), "[1, 64]"),
        (lambda: to_bits([1], True), "[1, 64]"),
        (lambda: to_bits([1], 2.0), "[1, 64]"),
        (lambda: to_bits([0.5], 4), "must be integers"),
        (lambda: to_bits([-1], 4), "must lie in [0, 2^4)"),
        (lambda: to_bits([16], 4), "must lie in [0, 2^4)"),
        (lambda: from_bits([1, 0, 1], 2), "3 bits is not a whole number of 2-bit values"),
        (lambda: from_bits([1, 2], 1), "only 0 and 1"),
        (lambda: from_bits([1], 0), "[1, 64]"),
        (lambda: bit_accuracy([], []), "non-empty streams of one length"),
        (lambda: bit_accuracy([1, 0], [1]), "got 2 and 1"),
        (lambda: exact_match_rate([[1]], [[1, 2]]), "one shape"),
        (lambda: exact_match_rate(3, 3), "non-empty arrays"),
        (lambda: mean_absolute_error(np.zeros((2, 3)), np.zeros((3, 2))), "one shape"),
        (lambda: mean_absolute_error([], []), "non-empty"),
        (lambda: bits_per_label(1), "no bits with 1 class"),
        (lambda: bits_per_label(0), "no bits"),
        (lambda: bits_per_label(True), "whole number"),
        (lambda: bits_per_label(2.5), "whole number"),
    ],
)
def test_bad_input_one_line(call, fragment: str) -> None:
    with pytest.raises(PrivacylabError) as error:
        call()
    assert fragment in _one_line(error)
