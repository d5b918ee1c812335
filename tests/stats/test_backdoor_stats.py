"""Backdoor statistics against independent oracles: ASR closed forms and a loop (all-to-one and
all-to-all), the Carlini & Terzis z-score against a direct double loop, Neural Cleanse's anomaly
index against a hand MAD and scipy's, STRIP's FRR/FAR by hand and their monotonicity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import median_abs_deviation

from privacylab.errors import PrivacylabError
from privacylab.stats.backdoor import (
    anomaly_index,
    attack_success_rate,
    backdoor_z_score,
    detection_rates,
)


def test_asr_closed_forms() -> None:
    true = np.array([0, 1, 2, 3])
    assert attack_success_rate(np.array([0, 0, 2, 0]), true, 0) == pytest.approx(2 / 3)
    assert attack_success_rate(np.zeros(4, dtype=int), true, 0) == 1.0
    assert attack_success_rate(np.array([0, 1, 2, 3]), true, 0) == 0.0
    assert math.isnan(attack_success_rate(np.array([1, 1]), np.array([0, 0]), 0))
    assert math.isnan(attack_success_rate(np.array([], dtype=int), np.array([], dtype=int), 0))


def test_asr_all_to_all_per_input_targets() -> None:
    true = np.array([0, 1, 2, 9, 5])
    wanted = (true + 1) % 10
    predicted = np.array([1, 2, 0, 0, 5])
    assert attack_success_rate(predicted, true, wanted) == pytest.approx(3 / 5)
    wanted_some_equal = np.array([0, 2, 3, 0, 6])
    assert attack_success_rate(predicted, true, wanted_some_equal) == pytest.approx(2 / 4)


@settings(max_examples=60)
@given(
    data=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)), max_size=40)
)
def test_asr_equals_a_loop(data: list[tuple[int, int, int]]) -> None:
    predicted = np.array([d[0] for d in data], dtype=np.int64)
    true = np.array([d[1] for d in data], dtype=np.int64)
    wanted = np.array([d[2] for d in data], dtype=np.int64)
    counted = [(p, w) for p, t, w in data if t != w]
    got = attack_success_rate(predicted, true, wanted)
    if not counted:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(sum(p == w for p, w in counted) / len(counted))
    one = attack_success_rate(predicted, true, 2)
    rows = [p for p, t, _ in data if t != 2]
    assert math.isnan(one) if not rows else one == pytest.approx(np.mean(np.array(rows) == 2))


def test_asr_bad_input_is_one_line() -> None:
    for args in [
        (np.array([0, 1]), np.array([0]), 0),
        (np.array([0.5, 1.0]), np.array([0, 1]), 0),
        (np.array([[0, 1]]), np.array([[0, 1]]), 0),
        (np.array([0, 1]), np.array([0, 1]), np.array([0, 1, 2])),
        (np.array([0, 1]), np.array([0, 1]), 0.5),
        (np.array([0, 1]), np.array([0, 1]), float("nan")),
        (np.array([0, 1]), np.array([0, 1]), "a"),
    ]:
        with pytest.raises(PrivacylabError) as error:
            attack_success_rate(*args)
        assert "\n" not in str(error.value)


def _z_by_loop(clean: np.ndarray, patched: np.ndarray) -> float:
    n = len(clean)
    base, bd = [], []
    for u in range(n):
        for v in range(n):
            if u != v:
                base.append(sum(clean[u, i] * clean[v, i] for i in range(clean.shape[1])))
                bd.append(sum(patched[u, i] * patched[v, i] for i in range(clean.shape[1])))
    mean = sum(base) / len(base)
    variance = sum((b - mean) ** 2 for b in base) / len(base)
    return (sum(bd) / len(bd) - mean) / variance


def test_z_score_against_double_loop() -> None:
    rng = np.random.default_rng(0)
    clean = rng.normal(size=(9, 5))
    clean /= np.linalg.norm(clean, axis=1, keepdims=True)
    shift = rng.normal(size=5)
    patched = clean + 2 * shift
    patched /= np.linalg.norm(patched, axis=1, keepdims=True)
    z = backdoor_z_score(clean, patched)
    assert z == pytest.approx(_z_by_loop(clean, patched), rel=1e-10)
    assert z > 0
    assert backdoor_z_score(clean, clean) == pytest.approx(0.0, abs=1e-12)


def test_z_score_divides_by_the_variance_not_the_deviation() -> None:
    rng = np.random.default_rng(1)
    clean = rng.normal(size=(6, 4))
    patched = rng.normal(size=(6, 4)) + 1
    z = backdoor_z_score(clean, patched)
    assert backdoor_z_score(3 * clean, 3 * patched) == pytest.approx(z / 9, rel=1e-10)


def test_z_score_bad_input() -> None:
    rng = np.random.default_rng(2)
    for clean, patched in [
        (rng.normal(size=(2, 3)), rng.normal(size=(2, 3))),
        (rng.normal(size=(4, 3)), rng.normal(size=(4, 2))),
        (np.ones((4, 3)), rng.normal(size=(4, 3))),
        (np.full((4, 3), np.nan), rng.normal(size=(4, 3))),
    ]:
        with pytest.raises(PrivacylabError) as error:
            backdoor_z_score(clean, patched)
        assert "\n" not in str(error.value)


def test_anomaly_index_by_hand() -> None:
    values = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    # median 3; |x - 3| = 2, 1, 0, 1, 97; MAD = 1
    expected = np.array([2.0, 1.0, 0.0, 1.0, 97.0]) / 1.4826
    np.testing.assert_allclose(anomaly_index(values), expected, rtol=1e-12)
    flat = anomaly_index(np.array([5.0, 5.0, 5.0]))
    assert np.array_equal(flat, np.zeros(3))
    spike = anomaly_index(np.array([5.0, 5.0, 5.0, 1.0]))
    assert spike[3] == np.inf and (spike[:3] == 0).all()


@settings(max_examples=60)
@given(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=30))
def test_anomaly_index_matches_scipy(values: list[float]) -> None:
    x = np.array(values)
    mad = median_abs_deviation(x, scale="normal")
    if mad < 1e-6:
        return
    np.testing.assert_allclose(anomaly_index(x), np.abs(x - np.median(x)) / mad, rtol=1e-5)


def test_anomaly_index_bad_input() -> None:
    for values in ([1.0], [[1.0, 2.0]], [1.0, np.inf]):
        with pytest.raises(PrivacylabError):
            anomaly_index(values)


def test_detection_rates_by_hand() -> None:
    clean = np.array([0.1, 0.5, 0.9, 1.2])
    trojaned = np.array([0.05, 0.2, 0.5, 0.6])
    frr, far = detection_rates(clean, trojaned, 0.5)
    assert (frr, far) == (0.25, 0.5)
    assert detection_rates(clean, trojaned, -1.0) == (0.0, 1.0)
    assert detection_rates(clean, trojaned, 10.0) == (1.0, 0.0)
    with pytest.raises(PrivacylabError):
        detection_rates([], trojaned, 0.5)
    with pytest.raises(PrivacylabError):
        detection_rates(clean, trojaned, float("nan"))


@settings(max_examples=60)
@given(
    clean=st.lists(st.floats(0, 3), min_size=1, max_size=20),
    trojaned=st.lists(st.floats(0, 3), min_size=1, max_size=20),
    low=st.floats(0, 3),
    high=st.floats(0, 3),
)
def test_detection_rates_monotone_in_threshold(
    clean: list[float], trojaned: list[float], low: float, high: float
) -> None:
    low, high = min(low, high), max(low, high)
    frr_low, far_low = detection_rates(clean, trojaned, low)
    frr_high, far_high = detection_rates(clean, trojaned, high)
    assert frr_low <= frr_high and far_low >= far_high
