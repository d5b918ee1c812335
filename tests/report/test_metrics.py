"""The one metrics path: ROC/AUC against scikit-learn, TPR at low FPR, Clopper–Pearson, ε bound."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from privacylab.attacks.membership.result import MembershipResult
from privacylab.report.metrics import (
    MembershipMetrics,
    auc,
    clopper_pearson,
    clopper_pearson_upper,
    epsilon_lower_bound,
    membership_metrics,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)


@st.composite
def scored_labels(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(min_value=2, max_value=60))
    levels = draw(st.integers(min_value=1, max_value=8))
    scores = draw(st.lists(st.integers(0, levels), min_size=n, max_size=n))
    labels = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    labels[0], labels[1] = 0, 1
    return np.asarray(scores, dtype=np.float64) / 3.0, np.asarray(labels)


@settings(max_examples=80, deadline=None)
@given(scored_labels())
def test_roc_and_auc_match_sklearn_with_ties(data: tuple[np.ndarray, np.ndarray]) -> None:
    scores, labels = data
    fpr, tpr, thresholds = roc_curve(scores, labels)
    sk_fpr, sk_tpr, sk_thr = sk_roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    assert thresholds[0] == np.inf
    np.testing.assert_allclose(thresholds[1:], sk_thr[1:])
    assert auc(fpr, tpr) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_roc_handles_infinite_scores() -> None:
    scores = np.array([np.inf, np.inf, 1.0, -np.inf, 0.5])
    labels = np.array([1, 0, 1, 0, 0])
    fpr, tpr, thresholds = roc_curve(scores, labels)
    np.testing.assert_allclose(fpr, [0, 1 / 3, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 1, 1, 1])
    assert thresholds[1] == np.inf


def _result(scores: np.ndarray, labels: np.ndarray, **kwargs: object) -> MembershipResult:
    return MembershipResult(
        attack="test",
        scores=scores,
        membership=labels,
        access="scores",
        queries=len(scores),
        **kwargs,  # type: ignore[arg-type]
    )


def test_perfect_chance_and_inverted_attacks() -> None:
    labels = np.r_[np.ones(500), np.zeros(500)].astype(int)
    perfect = membership_metrics(_result(labels.astype(float) + 1.0, labels))
    assert perfect.auc == 1.0
    assert perfect.tpr_at_01pct_fpr == perfect.tpr_at_1pct_fpr == 1.0
    assert perfect.balanced_accuracy == perfect.advantage == 1.0
    assert perfect.threshold_source == "held-out half"
    assert perfect.epsilon_lower_bound > 4.0

    chance = membership_metrics(_result(np.zeros(1000), labels))
    assert chance.auc == 0.5
    assert chance.advantage == 0.0
    assert chance.balanced_accuracy == 0.5
    assert chance.tpr_at_1pct_fpr == 0.0
    assert chance.epsilon_lower_bound == 0.0

    inverted = membership_metrics(_result(-labels.astype(float), labels))
    assert inverted.auc == 0.0
    assert inverted.advantage == 0.0
    assert inverted.epsilon_lower_bound == 0.0


def test_metrics_use_attack_predictions_when_given() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 2000)
    scores = labels + rng.normal(0, 1.0, labels.size)
    predictions = (scores > 10.0).astype(int)
    m = membership_metrics(_result(scores, labels, predictions=predictions))
    assert m.threshold_source == "attack"
    assert m.balanced_accuracy == 0.5
    assert m.epsilon_lower_bound == 0.0
    assert m.auc == pytest.approx(roc_auc_score(labels, scores))
    best = membership_metrics(_result(scores, labels))
    assert best.balanced_accuracy > 0.6
    assert best.advantage == pytest.approx(2 * best.balanced_accuracy - 1)


def test_to_dict_is_json_safe() -> None:
    m = MembershipMetrics(
        attack="a",
        access="labels",
        queries=1,
        seconds=float("nan"),
        examples=2,
        auc=0.5,
        tpr_at_1pct_fpr=0.0,
        tpr_at_01pct_fpr=0.0,
        balanced_accuracy=0.5,
        advantage=0.0,
        threshold_source="attack",
        epsilon_lower_bound=float("inf"),
        confidence=0.95,
        delta=1e-5,
    )
    d = m.to_dict()
    assert d["seconds"] is None and d["epsilon_lower_bound"] is None
    assert json.loads(json.dumps(d, allow_nan=False)) == d


def test_tpr_at_fpr_on_hand_built_roc() -> None:
    fpr = np.array([0.0, 0.0, 0.0005, 0.001, 0.002, 0.01, 0.02, 1.0])
    tpr = np.array([0.0, 0.05, 0.10, 0.20, 0.30, 0.40, 0.90, 1.0])
    assert tpr_at_fpr(fpr, tpr, 0.001) == 0.20
    assert tpr_at_fpr(fpr, tpr, 0.0015) == 0.20
    assert tpr_at_fpr(fpr, tpr, 0.01) == 0.40
    assert tpr_at_fpr(fpr, tpr, 0.0) == 0.05
    assert tpr_at_fpr(fpr, tpr, 1.0) == 1.0
    with pytest.raises(ValueError, match="target FPR"):
        tpr_at_fpr(fpr, tpr, 1.5)


def test_clopper_pearson_closed_forms() -> None:
    n, conf = 50, 0.9
    alpha = 1 - conf
    low, high = clopper_pearson(0, n, conf)
    assert low == 0.0
    assert high == pytest.approx(1 - (alpha / 2) ** (1 / n))
    low, high = clopper_pearson(n, n, conf)
    assert high == 1.0
    assert low == pytest.approx((alpha / 2) ** (1 / n))
    assert clopper_pearson_upper(0, n, conf) == pytest.approx(1 - alpha ** (1 / n))
    assert clopper_pearson_upper(n, n, conf) == 1.0
    low, high = clopper_pearson(7, 20, 0.95)
    assert binom.sf(6, 20, low) == pytest.approx(0.025, rel=1e-6)
    assert binom.cdf(7, 20, high) == pytest.approx(0.025, rel=1e-6)
    with pytest.raises(ValueError):
        clopper_pearson(5, 3, 0.95)
    with pytest.raises(ValueError):
        clopper_pearson(1, 3, 1.5)


def test_epsilon_bound_is_valid_for_randomized_response() -> None:
    """A membership test against ε-RR has FPR = FNR = 1/(1+e^ε); the bound must stay ≤ ε."""
    rng = np.random.default_rng(7)
    eps, n, reps, conf = 1.0, 1000, 400, 0.9
    p_wrong = 1.0 / (1.0 + math.exp(eps))
    fn = rng.binomial(n, p_wrong, reps)
    fp = rng.binomial(n, p_wrong, reps)
    bounds = np.array(
        [
            epsilon_lower_bound(n - a, a, b, n - b, delta=0.0, confidence=conf)
            for a, b in zip(fn, fp, strict=True)
        ]
    )
    assert np.mean(bounds <= eps) >= conf
    assert np.median(bounds) > 0.7 * eps


def test_epsilon_bound_monotone_and_zero_at_chance() -> None:
    assert epsilon_lower_bound(500, 500, 500, 500, delta=1e-5) == 0.0
    better = [epsilon_lower_bound(tp, 1000 - tp, 100, 900, 1e-5) for tp in (500, 700, 900, 990)]
    assert all(a < b for a, b in itertools.pairwise(better))
    more_data = [epsilon_lower_bound(9 * k, k, k, 9 * k, 1e-5) for k in (10, 100, 1000)]
    assert all(a < b for a, b in itertools.pairwise(more_data))
    assert more_data[-1] < math.log(9)
    assert epsilon_lower_bound(900, 100, 100, 900, 1e-5, confidence=0.5) > epsilon_lower_bound(
        900, 100, 100, 900, 1e-5, confidence=0.99
    )


@pytest.mark.parametrize(
    ("scores", "labels", "message"),
    [
        (np.zeros((2, 2)), np.zeros((2, 2)), "1-D"),
        (np.zeros(3), np.array([0, 1]), "3 scores but 2"),
        (np.array([0.1, np.nan]), np.array([0, 1]), "NaN"),
        (np.array([0.1, 0.2]), np.array([1, 1]), "one class"),
        (np.array([0.1, 0.2]), np.array([0, 2]), "0 or 1"),
    ],
)
def test_bad_input_is_one_line_value_error(
    scores: np.ndarray, labels: np.ndarray, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        roc_curve(scores, labels)
    assert "\n" not in str(info.value)


def test_bad_counts_and_parameters() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        epsilon_lower_bound(-1, 1, 1, 1, 1e-5)
    with pytest.raises(ValueError, match="one member"):
        epsilon_lower_bound(0, 0, 1, 1, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(1, 1, 1, 1, 1.0)
    with pytest.raises(ValueError, match="confidence"):
        epsilon_lower_bound(1, 1, 1, 1, 1e-5, confidence=1.0)
    labels = np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match="one class"):
        membership_metrics(_result(np.zeros(4), np.zeros(4, dtype=int)))
    with pytest.raises(ValueError, match="delta"):
        membership_metrics(_result(np.zeros(4), labels), delta=-0.1)


def test_held_out_epsilon_is_a_valid_bound_for_an_exactly_dp_test() -> None:
    """Scores from ε-DP randomized response: the held-out bound stays below ε in at least
    `confidence` of repetitions, while a threshold chosen on all the data is more eager."""
    from privacylab.report.metrics import held_out_epsilon

    eps = 1.0
    keep = np.exp(eps) / (1 + np.exp(eps))
    labels = np.r_[np.ones(2000), np.zeros(2000)].astype(int)
    over = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        flip = rng.random(labels.size) > keep
        scores = np.where(flip, 1 - labels, labels) + 0.01 * rng.random(labels.size)
        bound = held_out_epsilon(scores, labels, delta=0.0, confidence=0.95, seed=seed)
        over += bound > eps
        assert bound > 0.3 * eps
    assert over <= 2


def test_held_out_epsilon_edge_cases() -> None:
    from privacylab.report.metrics import held_out_epsilon

    labels = np.r_[np.ones(400), np.zeros(400)].astype(int)
    assert held_out_epsilon(np.zeros(800), labels, delta=1e-5) == 0.0
    assert held_out_epsilon(labels.astype(float), labels, delta=1e-5) > 3.0
    assert held_out_epsilon(np.array([1.0, 0.0]), np.array([1, 0]), delta=1e-5) == 0.0
