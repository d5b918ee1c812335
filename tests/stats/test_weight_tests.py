"""Weight-test statistics (privacylab.stats.weight_tests) against independent oracles: scipy's
chisquare, mpmath's incomplete gamma, a direct count of runs and a Monte Carlo of the runs
distribution, numpy's corrcoef, struct's IEEE-754 bytes."""

from __future__ import annotations

import itertools
import math
import struct

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privacylab.stats._checks import StatisticsError
from privacylab.stats.weight_tests import (
    block_correlations,
    bonferroni_log10,
    chi2_logsf,
    chi_square_uniform,
    low_mantissa_bits,
    positive_share_test,
    runs_test,
    serial_sign_correlation,
    window_chi_square,
    windows,
)


def test_chi_square_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    for cells in (2, 16, 256):
        counts = rng.integers(0, 40, size=cells)
        statistic, log_p = chi_square_uniform(counts)
        oracle = stats.chisquare(counts)
        assert statistic == pytest.approx(oracle.statistic, rel=1e-12)
        assert math.exp(log_p) == pytest.approx(oracle.pvalue, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(
    ("statistic", "df"),
    [(2295.0, 255), (3000.0, 255), (5000.0, 255), (1e5, 255), (1e7, 255), (1500.0, 1),
     (12285.0, 4095), (20475.0, 4095)],
)  # fmt: skip
def test_chi2_log_tail_beyond_float_range_matches_mpmath(statistic: float, df: int) -> None:
    """Below scipy's float range (p < 1e-308), down to 3 df where p is e^-1851 (a normal
    approximation of the cube root is 2 % off there)."""
    tail = mpmath.gammainc(mpmath.mpf(df) / 2, statistic / 2, mpmath.inf, regularized=True)
    assert chi2_logsf(statistic, df) == pytest.approx(float(mpmath.log(tail)), rel=1e-12)


def test_chi2_log_tail_is_monotone_and_finite() -> None:
    xs = np.geomspace(200, 2e5, 400)
    values = np.array([chi2_logsf(x, 255) for x in xs])
    assert np.all(np.isfinite(values)) and np.all(np.diff(values) < 0)


def test_low_mantissa_bits_match_struct() -> None:
    values = np.array([1.0, -0.375, 3.14159, 1e-30, -2.5e7, 0.0], dtype=np.float32)
    oracle = [struct.unpack("<I", struct.pack("<f", float(v)))[0] & 0xFF for v in values]
    assert low_mantissa_bits(values, 8).tolist() == oracle
    assert low_mantissa_bits(values, 3).tolist() == [o & 7 for o in oracle]


def test_window_chi_square_uniform_low_bits_are_not_flagged_and_images_are() -> None:
    rng = np.random.default_rng(1)
    honest = rng.normal(0, 0.05, size=40_000).astype(np.float32)
    log_p = window_chi_square(honest, 4096, 8)
    assert len(log_p) == len(windows(honest.size, 4096))
    assert bonferroni_log10(log_p) < 3
    bits = honest.view(np.uint32).copy()
    pixels = np.where(rng.random(8192) < 0.8, 0, rng.integers(0, 256, 8192)).astype(np.uint32)
    bits[:8192] = (bits[:8192] & ~np.uint32(0xFF)) | pixels
    assert bonferroni_log10(window_chi_square(bits.view(np.float32), 4096, 8)) > 100


def test_bonferroni_closed_form() -> None:
    log_p = np.log([0.5, 1e-6, 0.2, 0.9])
    assert bonferroni_log10(log_p) == pytest.approx(-math.log10(4e-6))
    assert bonferroni_log10(np.log([0.5, 0.9])) == 0.0
    assert math.copysign(1.0, bonferroni_log10([0.0, -0.1])) == 1.0


def _runs_direct(s: list[bool]) -> int:
    runs = 1
    for a, b in itertools.pairwise(s):
        runs += a != b
    return runs


def test_runs_test_against_direct_count_and_monte_carlo() -> None:
    rng = np.random.default_rng(2)
    s = rng.random(300) < 0.3
    n1, n2 = int(s.sum()), int((~s).sum())
    z, log_p = runs_test(s)
    shuffled = rng.permuted(np.tile(s, (4000, 1)), axis=1)
    draws = 1 + (shuffled[:, 1:] != shuffled[:, :-1]).sum(axis=1)
    runs = _runs_direct(list(s))
    mean = 2 * n1 * n2 / 300 + 1
    # the formula's moments are those of the permutation distribution (Monte Carlo, 5 se)
    assert abs(draws.mean() - mean) < 5 * draws.std() / math.sqrt(len(draws))
    sd = math.sqrt(2 * n1 * n2 * (2 * n1 * n2 - 300) / (300**2 * 299))
    assert draws.std() == pytest.approx(sd, rel=0.06)
    assert z == pytest.approx((runs - mean) / sd)
    assert math.exp(log_p) == pytest.approx(2 * stats.norm.sf(abs(z)))


def test_runs_test_sees_serial_dependence() -> None:
    blocks = np.repeat(np.random.default_rng(3).random(500) < 0.5, 8)
    z, log_p = runs_test(blocks)
    assert z < -20 and log_p < math.log(1e-50)
    assert runs_test(np.ones(10, bool)) == (0.0, 0.0)


def test_positive_share_closed_form() -> None:
    s = np.array([1] * 70 + [0] * 30)
    z, log_p = positive_share_test(s)
    assert z == pytest.approx(4.0)
    assert math.exp(log_p) == pytest.approx(2 * stats.norm.sf(4.0))


def test_serial_sign_correlation() -> None:
    rng = np.random.default_rng(4)
    v = rng.normal(size=20_000)
    assert abs(serial_sign_correlation(v, 1)) < 5 / math.sqrt(v.size)
    smooth = np.convolve(v, np.ones(10), mode="same")
    s = np.sign(smooth)
    oracle = np.corrcoef(s[:-28], s[28:])[0, 1]
    assert serial_sign_correlation(smooth, 28) == pytest.approx(oracle)
    assert serial_sign_correlation(smooth, 1) > 0.5


def test_block_correlations_match_corrcoef() -> None:
    rng = np.random.default_rng(5)
    rows = rng.random((7, 12))
    rows[3] = 0.25
    values = rng.normal(size=12 * 5 + 4)
    values[12:24] = 3 * rows[1] - 2
    r = block_correlations(values, rows, 12)
    assert r.shape == (5, 7)
    for b in range(5):
        for i in range(7):
            oracle = (
                0.0 if i == 3 else abs(np.corrcoef(values[b * 12 : b * 12 + 12], rows[i])[0, 1])
            )
            assert r[b, i] == pytest.approx(oracle, abs=1e-12)
    assert r[1, 1] == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 700))
def test_windows_cover_every_position_once(size: int, window: int) -> None:
    spans = windows(size, window)
    assert spans[0][0] == 0 and spans[-1][1] == size
    assert all(a < b and b == c for (a, b), (c, _) in itertools.pairwise(spans))
    assert all(b - a >= min(window // 2, size) for a, b in spans)


@pytest.mark.parametrize(
    "call",
    [
        lambda: low_mantissa_bits(np.ones(3, np.float64)),
        lambda: low_mantissa_bits(np.ones(3, np.float32), 24),
        lambda: chi_square_uniform([5]),
        lambda: runs_test([True]),
        lambda: serial_sign_correlation(np.ones(5), 0),
        lambda: block_correlations(np.ones(10), np.ones((2, 3)), 4),
        lambda: bonferroni_log10([]),
    ],
)
def test_bad_input_is_one_line(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StatisticsError) as error:
        call()
    assert "\n" not in str(error.value)
