from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from privacylab.accounting._validate import PrivacyParameterError
from privacylab.mechanisms import group_privacy_dp, group_privacy_rdp, rr_keep_probability


def test_group_of_one_is_the_original() -> None:
    assert group_privacy_dp(0.7, 1e-5, 1) == (0.7, 1e-5)


def test_lemma_1_formula() -> None:
    eps, delta, k = 0.5, 1e-6, 4
    expected = delta * (math.exp(k * eps) - 1) / (math.exp(eps) - 1)
    got_eps, got_delta = group_privacy_dp(eps, delta, k)
    assert got_eps == 2.0
    assert got_delta == pytest.approx(expected, rel=1e-13)
    assert got_delta == pytest.approx(delta * sum(math.exp(i * eps) for i in range(k)), rel=1e-13)


def test_pure_dp_and_vacuous_cases() -> None:
    assert group_privacy_dp(0.3, 0.0, 5) == pytest.approx((1.5, 0.0))
    assert group_privacy_dp(5.0, 1e-5, 1000) == (5000.0, 1.0)


def rr_profile(p: float, eps: float) -> float:
    """δ(ε) of binary RR with keep probability p: it is (ε, δ(ε))-DP for every ε ≥ 0."""
    return max(0.0, p - math.exp(eps) * (1 - p))


def outcome_probabilities(records: tuple[int, ...], p: float) -> np.ndarray:
    """Exact law of independent binary RR applied to each record, over all 2^k outcomes."""
    outs = []
    for outcome in itertools.product([0, 1], repeat=len(records)):
        outs.append(
            math.prod(p if o == r else 1 - p for o, r in zip(outcome, records, strict=True))
        )
    return np.array(outs)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("rr_eps", [0.5, 1.5])
def test_lemma_1_holds_exhaustively_on_randomized_response(k: int, rr_eps: float) -> None:
    p = rr_keep_probability(rr_eps, 2)
    base = (0,) * k
    subsets = np.array(list(itertools.product([0, 1], repeat=2**k)), dtype=bool)
    for eps in [0.1, 0.3, 0.6 * rr_eps, rr_eps]:
        delta = rr_profile(p, eps)
        group_eps, group_delta = group_privacy_dp(eps, max(delta, 1e-300), k)
        for changed in range(1, k + 1):
            other = (1,) * changed + (0,) * (k - changed)
            first, second = outcome_probabilities(base, p), outcome_probabilities(other, p)
            for a, b in [(first, second), (second, first)]:
                worst = np.max(subsets @ a - math.exp(group_eps) * (subsets @ b))
                assert worst <= group_delta + 1e-12


def test_lemma_1_factor_is_needed() -> None:
    p = rr_keep_probability(0.5, 2)
    eps, k = 0.05, 3
    delta = rr_profile(p, eps)
    first, second = outcome_probabilities((0,) * k, p), outcome_probabilities((1,) * k, p)
    hockey = np.sum(np.maximum(first - math.exp(k * eps) * second, 0.0))
    assert hockey > delta
    assert hockey <= group_privacy_dp(eps, delta, k)[1]


def test_rdp_group_of_two() -> None:
    orders, rdp = group_privacy_rdp([1.5, 2.0, 4.0, 8.0, 32.0], [0.1, 0.2, 0.4, 0.8, 3.2], 2)
    np.testing.assert_allclose(orders, [2.0, 4.0, 16.0])
    np.testing.assert_allclose(rdp, [1.2, 2.4, 9.6])


def test_rdp_group_rounds_up_to_a_power_of_two() -> None:
    for size in [3, 4]:
        orders, rdp = group_privacy_rdp([8.0, 16.0], [1.0, 2.0], size)
        np.testing.assert_allclose(orders, [2.0, 4.0])
        np.testing.assert_allclose(rdp, [9.0, 18.0])
    orders, _ = group_privacy_rdp([8.0, 16.0, 32.0], [1.0, 2.0, 4.0], 5)
    np.testing.assert_allclose(orders, [2.0, 4.0])


def test_rdp_group_of_one_is_unchanged() -> None:
    orders, rdp = group_privacy_rdp([1.25, 3.0], [0.1, math.inf], 1)
    np.testing.assert_array_equal(orders, [1.25, 3.0])
    np.testing.assert_array_equal(rdp, [0.1, math.inf])


def test_rdp_group_bound_holds_for_the_gaussian() -> None:
    """Gaussian(σ): RDP α/(2σ²) per record and exactly α m²/(2σ²) for a group of m."""
    sigma = 3.0
    alphas = np.arange(2.0, 257.0)
    for size in [2, 4, 8]:
        orders, bound = group_privacy_rdp(alphas, alphas / (2 * sigma**2), size)
        assert np.all(bound >= orders * size**2 / (2 * sigma**2))


@pytest.mark.parametrize(
    "call",
    [
        lambda: group_privacy_dp(0.0, 1e-5, 2),
        lambda: group_privacy_dp(1.0, 1.0, 2),
        lambda: group_privacy_dp(1.0, -1e-5, 2),
        lambda: group_privacy_dp(1.0, 1e-5, 0),
        lambda: group_privacy_dp(1.0, 1e-5, 2.5),
        lambda: group_privacy_rdp([2.0, 4.0], [1.0], 2),
        lambda: group_privacy_rdp([[4.0]], [[1.0]], 2),
        lambda: group_privacy_rdp([1.0, 4.0], [1.0, 1.0], 2),
        lambda: group_privacy_rdp([4.0], [float("nan")], 2),
        lambda: group_privacy_rdp([4.0], [1.0], 4),
    ],
)
def test_bad_input_raises_one_line(call) -> None:
    with pytest.raises(PrivacyParameterError) as info:
        call()
    assert "\n" not in str(info.value)
