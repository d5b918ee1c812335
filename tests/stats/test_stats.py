"""privacylab.stats: the one home of the statistics; report.metrics and audit.statistics keep
re-exporting the same functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

import privacylab.audit.statistics as audit_statistics
import privacylab.report.metrics as report_metrics
from privacylab import stats
from privacylab.errors import PrivacylabError


@pytest.mark.parametrize(
    ("module", "name"),
    [(report_metrics, n) for n in (
        "auc", "clopper_pearson", "clopper_pearson_upper", "epsilon_from_counts",
        "epsilon_lower_bound", "held_out_epsilon", "roc_auc", "roc_counts", "roc_curve",
        "tpr_at_fpr",
    )]
    + [(audit_statistics, n) for n in audit_statistics.__all__],
)  # fmt: skip
def test_old_homes_re_export_the_same_objects(module: object, name: str) -> None:
    assert getattr(module, name) is getattr(stats, name)


def test_bad_input_is_one_privacylab_error_that_is_still_a_value_error() -> None:
    with pytest.raises(stats.StatisticsError, match="scores contain NaN") as info:
        stats.roc_curve([0.1, float("nan")], [0, 1])
    assert isinstance(info.value, PrivacylabError) and isinstance(info.value, ValueError)
    with pytest.raises(ValueError, match="confidence must be in"):
        stats.clopper_pearson(1, 2, confidence=1.0)


def test_gdp_mu_and_epsilon_round_trip() -> None:
    eps = stats.epsilon_from_gdp_mu(1.0, 1e-5)
    assert stats.gdp_delta(eps, 1.0) == pytest.approx(1e-5, rel=1e-6)
    from scipy.stats import norm

    fpr = 0.05
    fnr = float(norm.cdf(norm.ppf(1 - fpr) - 1.0))  # on the 1-GDP trade-off curve
    assert stats.gdp_mu_from_rates(fpr, fnr) == pytest.approx(1.0)


def test_group_privacy_matches_vadhan_lemma() -> None:
    eps, delta = stats.group_privacy(0.5, 1e-6, 3)
    assert eps == pytest.approx(1.5)
    assert delta == pytest.approx(1e-6 * (1 + math.exp(0.5) + math.exp(1.0)))
    assert stats.group_privacy(0.0, 1e-6, 4) == (0.0, pytest.approx(4e-6))
    with pytest.raises(stats.StatisticsError, match="k must be an integer >= 1"):
        stats.group_privacy(1.0, 1e-6, 0)


def test_roc_and_bounds_on_a_perfect_test() -> None:
    scores = np.r_[np.ones(500), np.zeros(500)]
    truth = np.r_[np.ones(500), np.zeros(500)].astype(int)
    fpr, tpr, _ = stats.roc_curve(scores, truth)
    assert stats.auc(fpr, tpr) == 1.0 and stats.tpr_at_fpr(fpr, tpr, 0.0) == 1.0
    eps = stats.epsilon_lower_bound(500, 0, 0, 500, delta=0.0)
    hi = 1 - 0.025 ** (1 / 500)  # one-sided Clopper–Pearson upper bound of 0/500 at 97.5%
    assert eps == pytest.approx(math.log((1 - hi) / hi))
