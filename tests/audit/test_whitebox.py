"""Tests of the Dirac-canary white-box audit (Nasr et al. 2023, "Tight Auditing of Differentially
Private Machine Learning", Sec. 4–5).

The headline bound for q = 1 is the certified GDP bound of Nasr et al. 2023 (Sec. 4); with the
110 canaries of one run it reaches ε_LB ≥ 0.7·ε at ε = 4 and 8 from 20 runs per world.  The
Clopper–Pearson bound (Jagielski et al. 2020), valid for any mechanism, is checked for soundness
everywhere and must catch the broken implementations too.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kstest

from privacylab.audit.result import AuditResult
from privacylab.audit.runner import run_trials
from privacylab.audit.whitebox import (
    DiracAudit,
    _train_and_observe,
    held_out_audit,
    run_per_step_audit,
    run_whitebox_audit,
    whitebox_trial,
)
from privacylab.execution import ResultStore

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
TRIALS = {0.5: 20, 1.0: 20, 2.0: 20, 4.0: 20, 8.0: 20}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict[float, tuple[AuditResult, float]]:
    store = ResultStore(tmp_path_factory.mktemp("whitebox") / "store.db")
    out = {}
    for eps in EPSILONS:
        start = time.perf_counter()
        result = run_whitebox_audit(DiracAudit(epsilon=eps), TRIALS[eps], store=store)
        out[eps] = (result, time.perf_counter() - start)
    store.close()
    return out


@pytest.mark.parametrize("eps", EPSILONS)
def test_soundness_certified_bound_below_accountant(
    table: dict[float, tuple[AuditResult, float]], eps: float
) -> None:
    result, _ = table[eps]
    assert result.method == "dirac"
    assert result.epsilon_theory == pytest.approx(eps, rel=1e-2)
    assert 0.0 <= result.epsilon_lower_bound <= result.epsilon_theory
    assert result.params["bound"] == "gdp"
    assert result.epsilon_lower_bound == result.params["epsilon_lower_bound_gdp"]
    assert 0.0 <= result.params["epsilon_lower_bound_cp"] <= result.epsilon_theory
    assert not result.violated
    assert result.params["epsilon_actual"] == pytest.approx(result.epsilon_theory)
    assert result.trials == TRIALS[eps]
    assert result.counts["runs"] == 2 * TRIALS[eps]
    assert result.counts["canaries"] == 110


@pytest.mark.parametrize("eps", (4.0, 8.0))
def test_power_certified_bound_nearly_tight(
    table: dict[float, tuple[AuditResult, float]], eps: float
) -> None:
    result, _ = table[eps]
    assert result.epsilon_lower_bound >= 0.7 * eps
    assert result.params["epsilon_gdp_estimate"] >= 0.8 * eps
    assert result.params["epsilon_lower_bound_cp"] > 0.0


def test_observations_are_the_claimed_gaussians() -> None:
    """Oracle: with q = 1 every canary's D0 sum over T steps, in units of σC, is N(0, T) and the
    D1 sum is N(T/σ, T) (the Gaussian mechanism the accountant analyses), canaries independent."""
    config = DiracAudit(epsilon=2.0, steps=10)
    sigma = config.reported_noise_multiplier()
    out = _train_and_observe(config, sigma, canary=False, seed=11, claimed=sigma)
    into = _train_and_observe(config, sigma, canary=True, seed=12, claimed=sigma)
    assert out.shape == into.shape == (110, 10)
    steps = config.steps
    assert kstest(out.ravel(), "norm").pvalue > 1e-3
    assert kstest(into.ravel() - 1.0 / sigma, "norm").pvalue > 1e-3
    assert kstest(out.sum(1) / np.sqrt(steps), "norm").pvalue > 1e-3
    assert abs(np.corrcoef(out[:, :5].ravel(), out[:, 5:].ravel())[0, 1]) < 0.15


@pytest.mark.parametrize("bound", ["gdp", "clopper-pearson"])
def test_noise_scale_bug_is_caught(tmp_path: Path, bound: str) -> None:
    config = DiracAudit(epsilon=1.0, noise_scale_bug=0.1, bound=bound)
    with ResultStore(tmp_path / "s.db") as store:
        result = run_whitebox_audit(config, 20, store=store)
    assert result.params["bound"] == bound
    assert result.violated
    assert result.epsilon_lower_bound > result.epsilon_theory
    assert result.params["epsilon_actual"] > result.epsilon_theory


@pytest.mark.parametrize("bound", ["gdp", "clopper-pearson"])
def test_rate_bug_is_caught(tmp_path: Path, bound: str) -> None:
    config = DiracAudit(epsilon=1.0, rate_bug=0.1, steps=30, bound=bound)
    with ResultStore(tmp_path / "s.db") as store:
        result = run_whitebox_audit(config, 20, store=store)
    assert result.params["sample_rate_reported"] == pytest.approx(0.1)
    assert result.violated
    assert result.epsilon_lower_bound > result.epsilon_theory


def test_poisson_rate_below_one_is_sound(tmp_path: Path) -> None:
    config = DiracAudit(epsilon=4.0, sample_rate=0.5, steps=10)
    with ResultStore(tmp_path / "s.db") as store:
        result = run_whitebox_audit(config, 20, store=store)
    assert result.params["bound"] == "clopper-pearson"
    assert result.epsilon_lower_bound <= result.epsilon_theory


def test_trials_are_durable_and_resumed(tmp_path: Path) -> None:
    config = DiracAudit(epsilon=2.0, steps=3)
    path = tmp_path / "s.db"
    with ResultStore(path) as store:
        first = run_whitebox_audit(config, 20, store=store)
    with ResultStore(path) as store:
        done: list[bool] = []
        rows = run_trials(
            whitebox_trial,
            asdict(config),
            40,
            store=store,
            on_done=lambda key, row, cached: done.append(cached),
        )
        again = run_whitebox_audit(config, 20, store=store)
    assert sum(done) == 20 and len(done) == 40
    assert again.to_dict()["counts"] == first.to_dict()["counts"]
    assert len(rows) == 40


def test_per_step_design_is_sound_against_the_one_step_epsilon(tmp_path: Path) -> None:
    config = DiracAudit(epsilon=8.0)
    with ResultStore(tmp_path / "s.db") as store:
        result = run_per_step_audit(config, 100, store=store)
    assert result.method == "dirac-per-step"
    assert result.trials == 100 * 110
    assert result.counts["steps"] == 100
    assert result.epsilon_theory > config.epsilon / 10
    assert result.epsilon_lower_bound <= result.epsilon_theory
    assert result.params["epsilon_lower_bound_cp"] <= result.epsilon_theory
    assert result.epsilon_lower_bound >= 0.7 * result.epsilon_theory


def test_per_step_design_catches_noise_scale_bug(tmp_path: Path) -> None:
    config = DiracAudit(epsilon=2.0, noise_scale_bug=0.1)
    with ResultStore(tmp_path / "s.db") as store:
        result = run_per_step_audit(config, 100, store=store)
    assert result.violated
    assert result.params["epsilon_lower_bound_cp"] > result.epsilon_theory


def test_held_out_audit_separated_scores_give_positive_bound() -> None:
    inside = np.linspace(10.0, 11.0, 200)
    outside = np.linspace(0.0, 1.0, 200)
    found = held_out_audit(inside, outside, 1e-5, 0.95)
    assert found["epsilon_cp"] > 2.0
    assert found["counts"] == {"tp": 100, "fn": 0, "fp": 0, "tn": 100}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": -1.0}, "epsilon must be > 0"),
        ({"delta": 1.0}, "delta must be in (0, 1)"),
        ({"sample_rate": 0.0}, "sample_rate must be in (0, 1]"),
        ({"noise_scale_bug": 2.0}, "noise_scale_bug must be in (0, 1]"),
        ({"steps": 0}, "steps must be a whole number >= 1"),
        ({"score": "max"}, "score must be one of"),
        ({"accountant": "moments"}, "accountant must be one of"),
        ({"epsilon": float("nan")}, "epsilon must be finite"),
        ({"bound": "wilson"}, "bound must be one of"),
        ({"canaries": -1}, "canaries must be a whole number >= 0"),
    ],
)
def test_bad_config_one_line_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        DiracAudit(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_trials_and_confidence(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db") as store:
        with pytest.raises(ValueError, match="trials must be a whole number >= 2"):
            run_whitebox_audit(DiracAudit(), 1, store=store)
        with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
            run_whitebox_audit(DiracAudit(), 4, store=store, confidence=1.5)
        with pytest.raises(ValueError, match="steps must be a whole number >= 4"):
            run_per_step_audit(DiracAudit(), 2, store=store)
        with pytest.raises(ValueError, match="only 110 weights sit on zero pixels"):
            run_whitebox_audit(DiracAudit(canaries=111), 2, store=store)
        with pytest.raises(ValueError, match="config must be a DiracAudit"):
            run_whitebox_audit({"epsilon": 1.0}, 4, store=store)  # type: ignore[arg-type]
