"""Bad and extreme privacy parameters: one-line refusals, bounded work, honest answers."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from privacylab.accounting import (
    PrivacyParameterError,
    calibrate_noise_multiplier,
    dp_sgd,
    make_accountant,
    max_steps,
    step_budget,
    steps_from_epochs,
)
from privacylab.accounting import _validate as check
from privacylab.accounting.calibration import dp_sgd_epsilon
from privacylab.accounting.rdp import (
    DEFAULT_ORDERS,
    _log_a_fractional,
    rdp_subsampled_gaussian,
)
from privacylab.cli import app

runner = CliRunner()


@pytest.mark.parametrize("accountant", ["rdp", "rdp-classic", "gdp", "pld"])
@pytest.mark.parametrize("sigma", [1e-308, 1e-7, 1e7, 1e308])
def test_noise_multiplier_outside_the_accountable_range_is_one_line(
    accountant: str, sigma: float
) -> None:
    with pytest.raises(PrivacyParameterError, match="noise multiplier must be in") as info:
        make_accountant(accountant).compose(dp_sgd(sigma, 0.01, 10)).epsilon(1e-5)
    assert "\n" not in str(info.value)


def test_rdp_of_small_sigma_is_bounded_work_and_an_upper_bound() -> None:
    """Below σ ≈ 0.06 the quadrature grid would exceed its cap; the RDP at ⌈α⌉ stands in, which
    is never below the exact RDP at α (RDP is non-decreasing in α)."""
    q, sigma = 0.01, 0.05
    fractional = DEFAULT_ORDERS[np.round(DEFAULT_ORDERS) != DEFAULT_ORDERS]
    exact = _log_a_fractional(q, sigma, fractional) / (fractional - 1.0)
    bound = rdp_subsampled_gaussian(q, sigma, fractional)
    assert np.all(bound >= exact * (1 - 1e-12))
    for tiny in (1e-2, 1e-4, 1e-6):
        rdp = rdp_subsampled_gaussian(q, tiny, DEFAULT_ORDERS)
        assert np.all(np.isfinite(rdp)) and np.all(rdp > 0)


def test_epsilon_keeps_decreasing_in_sigma_across_the_fallback() -> None:
    sigmas = [0.04, 0.05, 0.06, 0.07, 0.1]
    eps = [dp_sgd_epsilon(s, 0.01, 100, 1e-5, "rdp") for s in sigmas]
    assert all(a >= b for a, b in itertools.pairwise(eps))


def test_absurd_targets_are_refused() -> None:
    with pytest.raises(PrivacyParameterError, match="at most"):
        calibrate_noise_multiplier(1e308, 1e-5, 0.01, 100)
    with pytest.raises(PrivacyParameterError, match="at most"):
        calibrate_noise_multiplier(1.0, 1e-5, 0.01, 10**30)
    with pytest.raises(PrivacyParameterError, match="steps"):
        steps_from_epochs(1e308, 0.01)
    with pytest.raises(PrivacyParameterError, match="at most"):
        max_steps(1.0, 0.01, 1e308, 1e-5)
    assert math.isfinite(calibrate_noise_multiplier(1e4, 1e-5, 0.01, 100, accountant="rdp"))


def test_step_budget_is_checked_and_says_when_capped() -> None:
    steps, capped = step_budget(1.0, 0.01, 1.0, 1e-5, accountant="rdp")
    assert not capped and steps == max_steps(1.0, 0.01, 1.0, 1e-5, accountant="rdp")
    assert dp_sgd_epsilon(1.0, 0.01, steps, 1e-5, "rdp") <= 1.0
    assert dp_sgd_epsilon(1.0, 0.01, steps + 1, 1e-5, "rdp") > 1.0
    steps, capped = step_budget(100.0, 0.01, 10.0, 1e-5, accountant="rdp", limit=1000)
    assert capped and steps == 1000
    assert dp_sgd_epsilon(100.0, 0.01, 1000, 1e-5, "rdp") <= 10.0
    half = max_steps(1.0, 0.01, 1.0, 1e-5, accountant="rdp") // 2
    assert step_budget(1.0, 0.01, 1.0, 1e-5, accountant="rdp", limit=half) == (half, True)


def test_account_steps_reports_its_search_cap_honestly() -> None:
    args = ["account", "steps", "--noise-multiplier", "1000", "--sample-rate", "0.01"]
    args += ["--delta", "1e-5", "--epsilon", "10", "--accountant", "rdp"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("more than 1000000000 steps")
    assert "search cap" in result.stdout
    payload = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert payload["capped"] is True and payload["steps"] == 10**9
    small = runner.invoke(app, [*args[:3], "1", *args[4:], "--json"])
    assert json.loads(small.stdout)["capped"] is False


def test_validators_name_the_bound() -> None:
    assert check.noise_multiplier(1.0) == 1.0
    assert check.target_epsilon(1e4) == 1e4
    assert check.steps(10**12) == 10**12
    with pytest.raises(PrivacyParameterError):
        check.steps(10**12 + 1)
    with pytest.raises(PrivacyParameterError):
        check.noise_multiplier(float("nan"))
