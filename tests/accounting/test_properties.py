"""Property tests (hypothesis): monotonicity, inverse pairs and calibration round trips."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privacylab.accounting import (
    PldAccountant,
    PrivacyParameterError,
    RdpAccountant,
    calibrate_noise_multiplier,
    dp_sgd,
    make_accountant,
    max_steps,
    steps_from_epochs,
)
from privacylab.accounting.calibration import dp_sgd_epsilon

sigmas = st.floats(0.6, 8.0)
rates = st.floats(1e-3, 0.3)
steps = st.integers(1, 3000)
deltas = st.sampled_from([1e-4, 1e-6, 1e-9])
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(sigma=sigmas, q=rates, t=steps, delta=deltas, name=st.sampled_from(["rdp", "pld"]))
def test_epsilon_falls_with_noise(sigma: float, q: float, t: int, delta: float, name: str) -> None:
    assert (
        dp_sgd_epsilon(sigma * 1.2, q, t, delta, name)
        <= dp_sgd_epsilon(sigma, q, t, delta, name) + 1e-9
    )


@FAST
@given(sigma=sigmas, q=rates, t=steps, delta=deltas, name=st.sampled_from(["rdp", "pld"]))
def test_epsilon_rises_with_steps_and_rate(
    sigma: float, q: float, t: int, delta: float, name: str
) -> None:
    base = dp_sgd_epsilon(sigma, q, t, delta, name)
    assert dp_sgd_epsilon(sigma, q, t + max(1, t // 2), delta, name) >= base - 1e-9
    assert dp_sgd_epsilon(sigma, min(1.0, q * 1.5), t, delta, name) >= base - 1e-9


@FAST
@given(sigma=sigmas, q=rates, t=steps, name=st.sampled_from(["rdp", "pld"]))
def test_delta_and_epsilon_are_inverse(sigma: float, q: float, t: int, name: str) -> None:
    acc = make_accountant(name).compose(dp_sgd(sigma, q, t))
    for delta in (1e-5, 1e-8):
        eps = acc.epsilon(delta)
        if eps > 0:
            assert acc.delta(eps) <= delta * (1 + 1e-6)
            assert acc.delta(eps * 0.97) >= delta * (1 - 1e-6)


@settings(max_examples=12, deadline=None)
@given(
    target=st.floats(0.3, 10.0),
    q=st.floats(1e-3, 0.1),
    t=st.integers(10, 5000),
    name=st.sampled_from(["rdp", "pld"]),
)
def test_noise_calibration_round_trips(target: float, q: float, t: int, name: str) -> None:
    sigma = calibrate_noise_multiplier(target, 1e-5, q, t, accountant=name)
    assert dp_sgd_epsilon(sigma, q, t, 1e-5, name) <= target
    assert dp_sgd_epsilon(sigma * (1 - 2e-3), q, t, 1e-5, name) > target * (1 - 1e-9)


@settings(max_examples=8, deadline=None)
@given(sigma=st.floats(0.8, 3.0), q=st.floats(1e-3, 0.05), target=st.floats(0.5, 8.0))
def test_max_steps_is_the_largest_that_fits(sigma: float, q: float, target: float) -> None:
    t = max_steps(sigma, q, target, 1e-5, accountant="rdp")
    if t > 0:
        assert dp_sgd_epsilon(sigma, q, t, 1e-5, "rdp") <= target
    assert dp_sgd_epsilon(sigma, q, t + 1, 1e-5, "rdp") > target


def test_pld_calibration_for_the_tf_mnist_setting() -> None:
    q = 256 / 60000
    sigma = calibrate_noise_multiplier(2.38, 1e-5, q, steps_from_epochs(60, q), accountant="pld")
    assert sigma == pytest.approx(1.1, rel=2e-3)


def test_pld_never_above_rdp_on_the_published_settings() -> None:
    for sigma, q, epochs in ((1.1, 256 / 60000, 60), (4.0, 0.01, 100)):
        t = steps_from_epochs(epochs, q)
        pld = PldAccountant().compose(dp_sgd(sigma, q, t)).epsilon(1e-5)
        rdp = RdpAccountant().compose(dp_sgd(sigma, q, t)).epsilon(1e-5)
        assert pld < rdp


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: calibrate_noise_multiplier(0.0, 1e-5, 0.01, 100), "target epsilon"),
        (lambda: calibrate_noise_multiplier(1.0, 1.0, 0.01, 100), "delta"),
        (lambda: calibrate_noise_multiplier(1.0, 1e-5, 1.5, 100), "sample rate"),
        (lambda: calibrate_noise_multiplier(1.0, 1e-5, 0.01, 0), "steps"),
        (lambda: max_steps(-1.0, 0.01, 1.0, 1e-5), "noise multiplier"),
        (lambda: steps_from_epochs(math.nan, 0.01), "epochs"),
        (lambda: make_accountant("moments"), "unknown accountant"),
    ],
)
def test_bad_input_is_one_clear_line(call, message: str) -> None:
    with pytest.raises(PrivacyParameterError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
