from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.accounting.events import RandomizedResponse
from privacylab.mechanisms import (
    add_laplace_noise,
    laplace_scale,
    randomized_response,
    rr_estimate_frequencies,
    rr_keep_probability,
)


def test_laplace_scale() -> None:
    assert laplace_scale(0.5) == 2.0
    assert laplace_scale(2.0, sensitivity=3.0) == 1.5


def test_laplace_noise_is_seeded_with_the_right_scale() -> None:
    noisy = add_laplace_noise(np.full(100_000, 5.0), 2.0, 3)
    np.testing.assert_array_equal(noisy, add_laplace_noise(np.full(100_000, 5.0), 2.0, 3))
    assert np.mean(np.abs(noisy - 5.0)) == pytest.approx(2.0, rel=0.02)
    assert np.median(noisy) == pytest.approx(5.0, abs=0.05)


@settings(max_examples=50, deadline=None)
@given(epsilon=st.floats(1e-3, 10.0), k=st.integers(2, 50))
def test_keep_probability_gives_ratio_e_to_epsilon(epsilon: float, k: int) -> None:
    p = rr_keep_probability(epsilon, k)
    q = (1 - p) / (k - 1)
    assert 1 / k < p < 1
    assert math.log(p / q) == pytest.approx(epsilon, rel=1e-9, abs=1e-12)
    assert p == pytest.approx(RandomizedResponse(epsilon, k=k).keep_probability, rel=1e-15)


def test_binary_keep_probability() -> None:
    assert rr_keep_probability(1.0, 2) == pytest.approx(math.e / (1 + math.e), rel=1e-15)


def test_randomized_response_distribution() -> None:
    epsilon, k, n = 1.0, 4, 200_000
    truth = np.zeros(n, dtype=int)
    reports = randomized_response(truth, epsilon, k, 11)
    np.testing.assert_array_equal(reports, randomized_response(truth, epsilon, k, 11))
    assert reports.shape == truth.shape and reports.dtype.kind == "i"
    counts = np.bincount(reports, minlength=k) / n
    p = rr_keep_probability(epsilon, k)
    assert counts[0] == pytest.approx(p, abs=0.005)
    np.testing.assert_allclose(counts[1:], (1 - p) / (k - 1), atol=0.005)


def test_estimator_is_unbiased() -> None:
    epsilon, k = 0.7, 5
    frequencies = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
    truth = np.repeat(np.arange(k), (frequencies * 1000).astype(int))
    estimates = np.array(
        [
            rr_estimate_frequencies(randomized_response(truth, epsilon, k, seed), epsilon, k)
            for seed in range(400)
        ]
    )
    mean = estimates.mean(axis=0)
    stderr = estimates.std(axis=0, ddof=1) / math.sqrt(len(estimates))
    assert np.all(np.abs(mean - frequencies) < 4 * stderr + 1e-12)
    np.testing.assert_allclose(estimates.sum(axis=1), 1.0, atol=1e-12)


def test_estimator_recovers_expected_counts_exactly() -> None:
    epsilon, k = math.log(3.0), 3
    p = rr_keep_probability(epsilon, k)
    assert p == pytest.approx(0.6)
    frequencies = np.array([0.5, 0.3, 0.2])
    expected_share = p * frequencies + (1 - p) / (k - 1) * (1 - frequencies)
    reports = np.repeat(np.arange(k), np.round(expected_share * 1000).astype(int))
    np.testing.assert_allclose(
        rr_estimate_frequencies(reports, epsilon, k), frequencies, atol=1e-12
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: laplace_scale(0.0),
        lambda: laplace_scale(1.0, sensitivity=float("nan")),
        lambda: add_laplace_noise([1.0], -1.0, 0),
        lambda: add_laplace_noise([float("inf")], 1.0, 0),
        lambda: rr_keep_probability(1.0, 1),
        lambda: rr_keep_probability(-1.0, 2),
        lambda: randomized_response([0, 3], 1.0, 3, 0),
        lambda: randomized_response([0, -1], 1.0, 3, 0),
        lambda: randomized_response([0.5], 1.0, 3, 0),
        lambda: randomized_response([True], 1.0, 3, 0),
        lambda: randomized_response([0], 1.0, 2.5, 0),
        lambda: rr_estimate_frequencies([], 1.0, 3),
        lambda: rr_estimate_frequencies(["a"], 1.0, 3),
    ],
)
def test_bad_input_raises_one_line(call) -> None:
    with pytest.raises(PrivacyParameterError) as info:
        call()
    assert "\n" not in str(info.value)
