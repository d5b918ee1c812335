"""Tests of the one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1)
Training Run", Algorithm 1): soundness, power, a deliberately broken run, seeding, bad input.

Measured on digits / logreg, rdp accountant, δ = 1e-5, m = 1000, 20 epochs of batch 256
(140 steps), k₊ = k₋ = 100, confidence 0.95 (white box):

    ε     r    v    ε_LB
    0.5  200  117  0.10
    1    200  123  0.22
    2    200  142  0.63
    4    200  167  1.30
    8    200  188  2.25
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from torch import nn

from privacylab.audit import AuditResult
from privacylab.audit.one_run import (
    OneRunAudit,
    _first_linear,
    one_run_guesses,
    run_one_run_audit,
)


@functools.cache
def _audit(variant: str, epsilon: float, **options: object) -> AuditResult:
    defaults: dict[str, object] = {"accountant": "rdp"}
    if variant == "one-run":
        defaults.update(m=200, epochs=5, k_plus=20, k_minus=20)
    defaults.update(options)
    return run_one_run_audit(OneRunAudit(variant=variant, epsilon=epsilon, **defaults))


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_white_box_bound_is_sound(epsilon: float) -> None:
    result = _audit("one-run-whitebox", epsilon)
    assert result.method == "one-run-whitebox"
    assert result.trials == 1
    assert result.epsilon_theory <= epsilon + 1e-9
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_theory
    assert not result.violated
    counts = result.counts
    assert (counts["m"], counts["r"], counts["k_plus"], counts["k_minus"]) == (1000, 200, 100, 100)
    assert 0 <= counts["v"] <= counts["r"]


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_black_box_bound_is_sound(epsilon: float) -> None:
    result = _audit("one-run", epsilon)
    assert result.method == "one-run"
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_theory <= epsilon + 1e-9
    assert result.counts["r"] == 40


def test_white_box_audit_has_power_at_high_epsilon() -> None:
    result = _audit("one-run-whitebox", 8.0)
    assert result.epsilon_lower_bound >= 1.5
    low = _audit("one-run-whitebox", 1.0)
    assert result.counts["v"] > low.counts["v"]


def test_black_box_bound_at_high_epsilon_is_nonnegative() -> None:
    result = _audit("one-run", 8.0)
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_theory


def test_pld_accountant_bound_is_sound() -> None:
    result = _audit("one-run-whitebox", 4.0, accountant="pld", m=500, epochs=5)
    assert result.accountant == "pld"
    assert 0.0 < result.epsilon_lower_bound <= result.epsilon_theory <= 4.0 + 1e-9


def test_broken_noise_is_caught() -> None:
    result = _audit("one-run-whitebox", 1.0, noise_scale_bug=0.1)
    assert result.epsilon_theory <= 1.0 + 1e-9
    assert result.epsilon_lower_bound > 1.0
    assert result.violated


def test_grid_pays_bonferroni() -> None:
    grid = ((50, 50), (100, 100), (20, 0))
    result = _audit("one-run-whitebox", 8.0, grid=grid)
    assert result.params["per_point_confidence"] == pytest.approx(1 - 0.05 / 3)
    assert (result.counts["k_plus"], result.counts["k_minus"]) in grid
    assert result.epsilon_lower_bound <= result.epsilon_theory


def test_same_seed_same_numbers_other_seed_other_draw() -> None:
    config = OneRunAudit(m=300, epochs=2, accountant="rdp", seed=7)
    first, second = run_one_run_audit(config), run_one_run_audit(config)
    assert first.counts == second.counts
    assert first.epsilon_lower_bound == second.epsilon_lower_bound
    other = run_one_run_audit(OneRunAudit(m=300, epochs=2, accountant="rdp", seed=8))
    assert other.counts["included"] != first.counts["included"] or other.counts != first.counts


def test_guesses_count_top_and_bottom() -> None:
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    included = np.array([True, False, True, False, False])
    assert one_run_guesses(scores, included, 2, 2) == (4, 3)
    assert one_run_guesses(scores, included, 1, 0) == (1, 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"variant": "two-run"}, "variant"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 1.5}, "delta"),
        ({"m": 0}, "m must"),
        ({"k_plus": 600, "k_minus": 600}, "exceed"),
        ({"k_plus": 0, "k_minus": 0}, "at least one guess"),
        ({"noise_scale_bug": float("nan")}, "noise_scale_bug"),
        ({"grid": []}, "grid"),
        ({"canary_kind": "golden"}, "canary_kind"),
        ({"k_plus_fraction": 2.0}, "k_plus_fraction"),
    ],
)
def test_bad_input_is_one_line(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        run_one_run_audit(OneRunAudit(**options))  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_bad_confidence_and_model_are_one_line() -> None:
    with pytest.raises(ValueError, match="confidence"):
        run_one_run_audit(OneRunAudit(m=10), confidence=1.0)
    with pytest.raises(ValueError, match=r"first layer is nn\.Linear"):
        _first_linear(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 10)), 64)
