"""`privacylab.stats.embedding`: token recall (Du et al. 2023, Sec. 6.3) on a hand-computed
example and its properties, and the majority share (chance of attribute inference)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privacylab.stats import StatisticsError
from privacylab.stats.embedding import majority_share, token_recall


def test_recall_by_hand() -> None:
    truth = np.array([[101, 7, 8, 9, 7, 102, 0, 0], [101, 5, 6, 102, 0, 0, 0, 0]])
    recovered = np.array([[101, 9, 7, 3, 3, 3, 3, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    # row 0: content {7, 8, 9}; recovered {7, 9} (specials and 3 not counted) -> 2/3
    np.testing.assert_allclose(token_recall(recovered, truth), [2 / 3, 0.0])


def test_recall_nan_without_content_and_ragged_rows() -> None:
    out = token_recall([[1, 2], [4]], [[101, 102, 0], [4, 5]])
    assert np.isnan(out[0]) and out[1] == 0.5


def test_recall_refuses_bad_input() -> None:
    with pytest.raises(StatisticsError, match="sequences"):
        token_recall(np.zeros((2, 3), int), np.zeros((3, 3), int))
    with pytest.raises(StatisticsError, match="integer"):
        token_recall(np.zeros((2, 3)), np.zeros((2, 3), int))
    with pytest.raises(StatisticsError, match="shape"):
        token_recall(np.zeros(3, int), np.zeros(3, int))


rows = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(rows, st.randoms(use_true_random=False))
def test_recall_properties(truth: list[list[int]], rng: object) -> None:
    recall = token_recall(truth, truth)
    content = [bool(set(r) - {0, 101, 102}) for r in truth]
    assert np.all(np.isnan(recall) == ~np.array(content))
    assert np.all(recall[np.array(content)] == 1.0)
    shuffled = [rng.sample(r, len(r)) for r in truth]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(token_recall(shuffled, truth), recall)
    other = [[(t * 7 + 3) % 41 for t in r] for r in truth]
    values = token_recall(other, truth)
    finite = values[~np.isnan(values)]
    assert np.all((finite >= 0) & (finite <= 1))


def test_majority_share() -> None:
    assert majority_share([0, 1, 1, 2]) == 0.5
    assert majority_share(np.array(["a"])) == 1.0
    with pytest.raises(StatisticsError):
        majority_share([])
