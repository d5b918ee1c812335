"""DP-SGD as a poisoning defence: the group-privacy ASR bound min(1, e^{kε} p0 + δ_k) against
its closed form and `group_privacy_dp`'s numbers, its monotonicity in k and ε, its
vacuousness beyond k ~ 1/ε, and `max_poisons_for` as the exact inverse."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.defenses.backdoor.dp import max_poisons_for, poisoning_asr_bound
from privacylab.errors import PrivacylabError
from privacylab.mechanisms.group import group_privacy_dp


def test_closed_form() -> None:
    eps, delta, k, p0 = 0.5, 1e-5, 3, 0.02
    delta_k = delta * (math.exp(k * eps) - 1) / (math.exp(eps) - 1)
    expected = math.exp(k * eps) * p0 + delta_k
    assert poisoning_asr_bound(eps, delta, k, p0) == pytest.approx(expected, rel=1e-12)
    assert poisoning_asr_bound(eps, 0.0, k, p0) == pytest.approx(math.exp(1.5) * p0, rel=1e-12)
    assert poisoning_asr_bound(1.0, 1e-5, 1, 0.0) == pytest.approx(1e-5)


@pytest.mark.parametrize(
    ("eps", "delta", "k", "p0"),
    [(0.1, 1e-5, 1, 0.01), (1.0, 1e-5, 2, 0.05), (0.3, 1e-6, 7, 0.001), (2.0, 1e-5, 1, 0.1)],
)
def test_equals_group_privacy_numbers(eps: float, delta: float, k: int, p0: float) -> None:
    group_eps, group_delta = group_privacy_dp(eps, delta, k)
    assert group_eps == pytest.approx(k * eps)
    bound = poisoning_asr_bound(eps, delta, k, p0)
    assert bound == pytest.approx(min(1.0, math.exp(group_eps) * p0 + group_delta), rel=1e-12)


def test_no_poisons_is_the_clean_rate_and_many_are_vacuous() -> None:
    assert poisoning_asr_bound(1.0, 1e-5, 0, 0.03) == 0.03
    assert poisoning_asr_bound(8.0, 1e-5, 1, 0.01) == 1.0
    assert poisoning_asr_bound(8.0, 1e-5, 35, 0.0) == 1.0
    assert poisoning_asr_bound(1.0, 1e-5, 35, 0.01) == 1.0
    assert poisoning_asr_bound(1.0, 1e-5, 10_000, 0.5) == 1.0


@settings(max_examples=60)
@given(
    eps=st.floats(0.01, 5.0),
    delta=st.sampled_from([0.0, 1e-7, 1e-5, 1e-3]),
    k=st.integers(0, 200),
    p0=st.floats(0.0, 1.0),
)
def test_monotone_in_k_and_epsilon(eps: float, delta: float, k: int, p0: float) -> None:
    bound = poisoning_asr_bound(eps, delta, k, p0)
    assert p0 <= bound <= 1.0
    assert poisoning_asr_bound(eps, delta, k + 1, p0) >= bound
    assert poisoning_asr_bound(eps * 1.5, delta, k, p0) >= bound


@settings(max_examples=60)
@given(
    eps=st.floats(0.05, 4.0),
    p0=st.floats(0.0, 0.2),
    asr=st.floats(0.3, 0.99),
)
def test_max_poisons_is_the_exact_inverse(eps: float, p0: float, asr: float) -> None:
    k = max_poisons_for(eps, 1e-5, p0, asr)
    assert poisoning_asr_bound(eps, 1e-5, k, p0) < asr
    assert poisoning_asr_bound(eps, 1e-5, k + 1, p0) >= asr
    assert k <= math.log(asr / max(p0, 1e-5)) / eps + 1


def test_max_poisons_about_one_over_epsilon() -> None:
    assert max_poisons_for(1.0, 1e-5, 0.01, 0.5) == 3
    assert max_poisons_for(0.1, 1e-5, 0.01, 0.5) == 39
    assert max_poisons_for(8.0, 1e-5, 0.01, 0.95) == 0
    assert max_poisons_for(1.0, 1e-5, 0.6, 0.5) == 0


@pytest.mark.parametrize(
    ("eps", "delta", "k", "p0"),
    [
        (0.0, 1e-5, 1, 0.1),
        (-1.0, 1e-5, 1, 0.1),
        (1.0, 1.0, 1, 0.1),
        (1.0, -0.1, 1, 0.1),
        (1.0, 1e-5, -1, 0.1),
        (1.0, 1e-5, 1.5, 0.1),
        (1.0, 1e-5, True, 0.1),
        (1.0, 1e-5, 1, 1.5),
        (1.0, 1e-5, 1, float("nan")),
        (float("nan"), 1e-5, 1, 0.1),
    ],
)
def test_bad_input_is_one_line(eps: float, delta: float, k: int, p0: float) -> None:
    with pytest.raises(PrivacylabError) as error:
        poisoning_asr_bound(eps, delta, k, p0)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("eps", "delta", "p0", "asr"),
    [(0.0, 1e-5, 0.1, 0.9), (1.0, 1.5, 0.1, 0.9), (1.0, 1e-5, -0.1, 0.9), (1.0, 1e-5, 0.1, 2.0)],
)
def test_max_poisons_bad_input_is_one_line(eps: float, delta: float, p0: float, asr: float) -> None:
    with pytest.raises(PrivacylabError) as error:
        max_poisons_for(eps, delta, p0, asr)
    assert "\n" not in str(error.value)
