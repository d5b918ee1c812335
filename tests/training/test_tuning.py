"""Accounting of private hyperparameter tuning (Papernot & Steinke 2022) against direct
evaluation of the paper's formulas, limits known in closed form (Liu & Talwar 2019), and
monotonicity; and the search itself on a tiny problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.accounting import calibrate_noise_multiplier
from privacylab.accounting.rdp import DEFAULT_ORDERS, rdp_subsampled_gaussian, rdp_to_epsilon
from privacylab.training.config import TrainingError
from privacylab.training.tuning import (
    calibrate_tuning,
    gamma_for_mean,
    poisson_tuning_rdp,
    sample_tnb,
    tnb_mean,
    tnb_pmf,
    tnb_tuning_rdp,
    trial_rdp,
    tuning_epsilon,
)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 3.0, -0.5])
@pytest.mark.parametrize("gamma", [0.05, 0.3, 0.8])
def test_tnb_pmf_sums_to_one_and_mean_matches_closed_form(eta: float, gamma: float) -> None:
    k = np.arange(1, 20000)
    p = tnb_pmf(k, eta, gamma)
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert (k * p).sum() == pytest.approx(tnb_mean(eta, gamma), rel=1e-9)


def test_geometric_case_is_the_geometric_distribution() -> None:
    # η = 1: P[K = k] = γ (1 − γ)^(k−1) (Liu & Talwar 2019's random stopping).
    gamma = 0.2
    k = np.arange(1, 50)
    np.testing.assert_allclose(tnb_pmf(k, 1.0, gamma), gamma * (1 - gamma) ** (k - 1), rtol=1e-12)
    assert tnb_mean(1.0, gamma) == pytest.approx(1 / gamma)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_samples_follow_the_distribution(eta: float) -> None:
    gamma = gamma_for_mean(eta, 4.0)
    rng = np.random.default_rng(0)
    draws = np.array([sample_tnb(rng, eta, gamma) for _ in range(20000)])
    assert draws.min() >= 1
    assert draws.mean() == pytest.approx(4.0, rel=0.05)
    assert np.mean(draws == 1) == pytest.approx(
        float(tnb_pmf(np.array([1]), eta, gamma)[0]), abs=0.01
    )


@pytest.mark.parametrize("eta", [0.0, 1.0, 2.0])
def test_gamma_for_mean_inverts_the_mean(eta: float) -> None:
    for mean in (1.5, 8.0, 100.0):
        assert tnb_mean(eta, gamma_for_mean(eta, mean)) == pytest.approx(mean, rel=1e-9)


def _theorem2_brute_force(orders, rdp, eta, gamma):
    """Theorem 2 of Papernot & Steinke 2022 written out term by term, order by order."""
    mean_k = tnb_mean(eta, gamma)
    out = []
    for lam, eps_lam in zip(orders, rdp, strict=True):
        best = math.inf
        for lam_hat, eps_hat in zip(orders, rdp, strict=True):
            value = (
                eps_lam
                + (1 + eta) * (1 - 1 / lam_hat) * eps_hat
                + (1 + eta) * math.log(1 / gamma) / lam_hat
                + math.log(mean_k) / (lam - 1)
            )
            best = min(best, value)
        out.append(best)
    return np.array(out)


@pytest.mark.parametrize("eta", [0.0, 1.0, -0.3])
def test_theorem2_matches_a_direct_evaluation(eta: float) -> None:
    orders = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    rdp = 300 * rdp_subsampled_gaussian(0.1, 2.0, orders)
    gamma = gamma_for_mean(eta, 10.0)
    np.testing.assert_allclose(
        tnb_tuning_rdp(orders, rdp, eta, gamma),
        _theorem2_brute_force(orders, rdp, eta, gamma),
        rtol=1e-12,
    )


@pytest.mark.parametrize(("eta", "factor"), [(1.0, 3.0), (0.0, 2.0)])
def test_pure_dp_limit_is_liu_talwar(eta: float, factor: float) -> None:
    # A pure ε-DP trial has RDP ≤ ε at every order; as λ, λ̂ → ∞ Theorem 2 tends to
    # (2 + η) ε: 3ε for the geometric distribution, as Liu & Talwar 2019 (Thm 3.4) prove
    # for random stopping, and 2ε for the logarithmic one (Papernot & Steinke 2022, §3.2).
    eps = 0.7
    orders = np.array([10.0, 1e3, 1e5, 1e7])
    bound = tnb_tuning_rdp(orders, np.full(4, eps), eta, gamma_for_mean(eta, 5.0))
    assert bound[-1] == pytest.approx(factor * eps, rel=1e-4)
    assert np.all(np.diff(bound) < 0)


def test_poisson_matches_a_direct_evaluation() -> None:
    orders = np.array([2.0, 4.0, 8.0, 16.0, 32.0])
    rdp = 100 * rdp_subsampled_gaussian(0.05, 3.0, orders)
    mu = 6.0
    expected = []
    for lam, eps_lam in zip(orders, rdp, strict=True):
        eps_hat = math.log(1 + 1 / (lam - 1))
        # Smallest δ at ε̂ over the orders (tight conversion, Balle et al. 2020, Thm 21).
        log_delta = min(
            (a - 1) * (r - eps_hat + math.log(1 - 1 / a)) - math.log(a)
            for a, r in zip(orders, rdp, strict=True)
        )
        delta_hat = min(1.0, math.exp(min(log_delta, 0.0)))
        expected.append(eps_lam + mu * delta_hat + math.log(mu) / (lam - 1))
    np.testing.assert_allclose(poisson_tuning_rdp(orders, rdp, mu), expected, rtol=1e-12)


curves = st.lists(st.floats(0.0, 50.0), min_size=3, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    curve=curves,
    scale=st.floats(1.0, 5.0),
    mean=st.floats(1.1, 50.0),
    eta=st.sampled_from([0.0, 1.0]),
)
def test_tuning_rdp_is_monotone_and_above_one_trial(curve, scale, mean, eta) -> None:
    orders = np.linspace(1.5, 40.0, len(curve))
    rdp = np.array(curve)
    gamma = gamma_for_mean(eta, mean)
    base = tnb_tuning_rdp(orders, rdp, eta, gamma)
    assert np.all(base >= rdp)
    assert np.all(tnb_tuning_rdp(orders, rdp * scale, eta, gamma) >= base - 1e-12)
    assert np.all(tnb_tuning_rdp(orders, rdp, eta, gamma_for_mean(eta, mean * 2)) >= base)
    assert np.all(
        poisson_tuning_rdp(orders, rdp, mean * 2) >= poisson_tuning_rdp(orders, rdp, mean)
    )


def test_calibrated_search_meets_the_target_and_is_tight() -> None:
    plans = [(0.1, 100), (0.2, 100)]
    budget = calibrate_tuning(1.0, 1e-5, plans, 8.0, score_noise=10.0)
    assert budget.total_epsilon <= 1.0
    assert budget.total_epsilon > 0.99
    assert budget.per_trial_epsilon < 0.6
    # Recompute the total from the σ's alone: the largest trial curve through Theorem 2.
    curve = np.max(
        [
            trial_rdp(s, q, t, DEFAULT_ORDERS, 10.0)
            for s, (q, t) in zip(budget.noise_multipliers, plans, strict=True)
        ],
        axis=0,
    )
    assert tuning_epsilon(curve, 1e-5, budget.eta, budget.gamma) == pytest.approx(
        budget.total_epsilon
    )
    # Each σ gives the per-trial ε for its plan (DP-SGD part, RDP accountant).
    for sigma, (q, t) in zip(budget.noise_multipliers, plans, strict=True):
        assert sigma == pytest.approx(
            calibrate_noise_multiplier(budget.per_trial_epsilon, 1e-5, q, t, "rdp")
        )
    # A per-trial budget 2% larger would break the target.
    more = [
        calibrate_noise_multiplier(budget.per_trial_epsilon * 1.02, 1e-5, q, t, "rdp")
        for q, t in plans
    ]
    curve = np.max(
        [trial_rdp(s, q, t, DEFAULT_ORDERS, 10.0) for s, (q, t) in zip(more, plans, strict=True)],
        axis=0,
    )
    assert tuning_epsilon(curve, 1e-5, budget.eta, budget.gamma) > 1.0


def test_one_trial_is_cheaper_than_the_search() -> None:
    orders = DEFAULT_ORDERS
    rdp = 100 * rdp_subsampled_gaussian(0.25, 5.0, orders)
    alone = rdp_to_epsilon(orders, rdp, 1e-5)[0]
    assert tuning_epsilon(rdp, 1e-5, 0.0, gamma_for_mean(0.0, 8.0)) > 1.5 * alone


@pytest.mark.parametrize(
    "call",
    [
        lambda: tnb_mean(-1.0, 0.5),
        lambda: tnb_mean(0.0, 1.0),
        lambda: gamma_for_mean(0.0, 1.0),
        lambda: tnb_tuning_rdp(np.array([1.0, 2.0]), np.array([0.1, 0.2]), 0.0, 0.5),
        lambda: tnb_tuning_rdp(np.array([2.0]), np.array([np.nan]), 0.0, 0.5),
        lambda: poisson_tuning_rdp(np.array([2.0]), np.array([0.1]), 0.0),
        lambda: calibrate_tuning(0.01, 1e-5, [(0.5, 1000)], 100.0),
        lambda: calibrate_tuning(1.0, 1e-5, [], 8.0),
    ],
)
def test_bad_input_is_one_training_error(call) -> None:
    with pytest.raises(TrainingError) as info:
        call()
    assert "\n" not in str(info.value)


def test_search_returns_the_best_noisy_trial_and_keeps_given_options() -> None:
    import torch

    from privacylab.data import load_dataset, split_train_test
    from privacylab.models import build_model
    from privacylab.training.config import PrivacyConfig, TrainConfig
    from privacylab.training.tuning import private_random_search

    torch.set_num_threads(1)
    train, _ = split_train_test(load_dataset("digits"))
    config = TrainConfig(
        epochs=2, batch_size=128, lr=0.5, seed=3, privacy=PrivacyConfig(epsilon=2.0)
    )
    lines: list[str] = []
    result = private_random_search(
        lambda seed: build_model("logreg", train.input_shape, train.num_classes, seed=seed),
        train,
        config,
        3.0,
        fixed={"lr"},
        progress=lines.append,
    )
    assert len(result.trials) == len(lines) >= 1
    assert result.best.noisy_validation_accuracy == max(
        t.noisy_validation_accuracy for t in result.trials
    )
    assert all(t.lr == 0.5 for t in result.trials)
    assert result.budget.total_epsilon <= 2.0
    assert result.train_size + result.validation_size == len(train)
    assert result.best.noisy_validation_accuracy > 0.3  # chance is 0.1
