"""Privacy amplification by shuffling (Feldman, McMillan & Talwar 2021, Theorems 3.1 and 3.8).

Oracles: the theorems' formulas written out as printed and evaluated at 50 digits with mpmath;
monotonicity in n and ε0 and ε < ε0 (hypothesis); the validity region's edge.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import mpmath
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from privacylab.accounting import PrivacyParameterError, ShuffleGuarantee, shuffled_epsilon
from privacylab.accounting.shuffling import shuffle_threshold

FAST = settings(max_examples=60, deadline=None)


def theorem_3_1(epsilon0: float, n: int, delta: float) -> float:
    """ε = log(1 + (e^ε0 − 1)/(e^ε0 + 1) · (8√(e^ε0 log(4/δ))/√n + 8 e^ε0/n)), as printed."""
    with mpmath.workdps(50):
        e0, d = mpmath.mpf(epsilon0), mpmath.mpf(delta)
        grow = mpmath.exp(e0)
        spread = 8 * mpmath.sqrt(grow * mpmath.log(4 / d)) / mpmath.sqrt(n) + 8 * grow / n
        return float(mpmath.log(1 + (grow - 1) / (grow + 1) * spread))


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta"),
    [(4.0, 10**5, 1e-6), (1.0, 1000, 1e-5), (0.1, 50_000, 1e-8), (8.0, 10**7, 1e-6)],
)
def test_closed_form_by_hand(epsilon0: float, n: int, delta: float) -> None:
    guarantee = shuffled_epsilon(epsilon0, n, delta)
    assert guarantee.epsilon == pytest.approx(theorem_3_1(epsilon0, n, delta), rel=1e-12)
    assert guarantee.delta == delta
    assert guarantee.theorem.endswith("Theorem 3.1")
    assert "shuffler" in guarantee.assumption


def test_a_worked_point() -> None:
    """ε0 = 1, n = 1000, δ = 1e-5: tanh(1/2) = 0.46212, log(4e5) = 12.8992,
    8√(e · 12.8992 / 1000) = 1.49802, 8e/1000 = 0.02175, ε = log(1 + 0.46212 · 1.51977)
    = log(1.70232) = 0.53199; inside the region: log(1000 / (16 log 2e5)) = 1.633 ≥ 1."""
    assert shuffled_epsilon(1.0, 1000, 1e-5).epsilon == pytest.approx(0.53199, abs=2e-5)


@FAST
@given(
    epsilon0=st.floats(0.01, 8.0),
    n=st.integers(1000, 10**8),
    factor=st.integers(2, 1000),
    log_delta=st.floats(math.log(1e-10), math.log(1e-3)),
)
def test_more_users_give_less_epsilon(
    epsilon0: float, n: int, factor: int, log_delta: float
) -> None:
    delta = math.exp(log_delta)
    assume(epsilon0 <= shuffle_threshold(n, delta))
    assert (
        shuffled_epsilon(epsilon0, n * factor, delta).epsilon
        < shuffled_epsilon(epsilon0, n, delta).epsilon
    )


@FAST
@given(
    epsilon0=st.floats(0.01, 8.0),
    bigger=st.floats(1.01, 3.0),
    n=st.integers(1000, 10**8),
    log_delta=st.floats(math.log(1e-10), math.log(1e-3)),
)
def test_larger_local_epsilon_gives_larger_epsilon_but_less_than_itself(
    epsilon0: float, bigger: float, n: int, log_delta: float
) -> None:
    delta = math.exp(log_delta)
    assume(epsilon0 * bigger <= shuffle_threshold(n, delta))
    small = shuffled_epsilon(epsilon0, n, delta).epsilon
    large = shuffled_epsilon(epsilon0 * bigger, n, delta).epsilon
    assert 0 < small < large
    assert small < epsilon0 and large < epsilon0 * bigger


def test_validity_edge() -> None:
    n, delta = 100_000, 1e-6
    limit = math.log(n / (16 * math.log(2 / delta)))
    assert shuffle_threshold(n, delta) == pytest.approx(limit, rel=1e-15)
    shuffled_epsilon(limit * (1 - 1e-12), n, delta)
    with pytest.raises(PrivacyParameterError, match="log\\(n / \\(16 log\\(2/delta\\)\\)\\)"):
        shuffled_epsilon(limit * (1 + 1e-9), n, delta)


@pytest.mark.parametrize(("epsilon0", "n"), [(0.5, 10), (0.5, 300), (10.0, 10**5)])
def test_refused_outside_the_theorem(epsilon0: float, n: int) -> None:
    with pytest.raises(PrivacyParameterError) as error:
        shuffled_epsilon(epsilon0, n, 1e-6)
    assert "\n" not in str(error.value) and "n >=" in str(error.value)


def test_approximate_local_dp_adds_the_theorem_3_8_delta() -> None:
    epsilon0, n, delta, delta0 = 2.0, 10**6, 1e-7, 1e-10
    guarantee = shuffled_epsilon(epsilon0, n, delta, delta0=delta0)
    eps = theorem_3_1(epsilon0, n, delta)
    assert guarantee.epsilon == pytest.approx(eps, rel=1e-12)
    expected = delta + (math.exp(eps) + 1) * (1 + math.exp(-epsilon0) / 2) * n * delta0
    assert guarantee.delta == pytest.approx(expected, rel=1e-12)
    assert guarantee.delta > delta
    assert guarantee.theorem.endswith("Theorem 3.8")
    with pytest.raises(PrivacyParameterError, match="total delta"):
        shuffled_epsilon(epsilon0, n, delta, delta0=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon0": 0.0, "n": 1000, "delta": 1e-5},
        {"epsilon0": float("nan"), "n": 1000, "delta": 1e-5},
        {"epsilon0": 1.0, "n": 0, "delta": 1e-5},
        {"epsilon0": 1.0, "n": 10.5, "delta": 1e-5},
        {"epsilon0": 1.0, "n": 1000, "delta": 0.0},
        {"epsilon0": 1.0, "n": 1000, "delta": 1.0},
        {"epsilon0": 1.0, "n": 1000, "delta": 1e-5, "delta0": -0.1},
        {"epsilon0": 1.0, "n": 1000, "delta": 1e-5, "delta0": float("nan")},
        {"epsilon0": 1.0, "n": 1000, "delta": 1e-5, "delta0": 1.0},
    ],
)
def test_bad_input_is_one_line(kwargs: dict) -> None:
    with pytest.raises(PrivacyParameterError) as error:
        shuffled_epsilon(**kwargs)
    assert "\n" not in str(error.value)


def test_guarantee_is_json_ready() -> None:
    guarantee = shuffled_epsilon(1.0, 5000, 1e-6, delta0=1e-12)
    data = json.loads(json.dumps(guarantee.to_dict()))
    assert set(data) == {"epsilon", "delta", "n", "epsilon0", "delta0", "theorem", "assumption"}
    assert ShuffleGuarantee(**data) == guarantee


def test_accounting_stays_free_of_torch() -> None:
    code = (
        "import sys, privacylab.accounting.shuffling; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
