"""privacylab.stats.images: reconstruction quality in [0, 1] pixel space, checked against
scikit-image (the independent oracle for SSIM and PSNR) and by properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from privacylab.stats import StatisticsError
from privacylab.stats.images import (
    PSNR_CAP,
    image_scores,
    label_accuracy,
    match,
    mse,
    psnr,
    ssim,
    to_unit,
)


def _noisy(shape: tuple[int, ...], seed: int, scale: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.random(shape)
    return a, np.clip(a + scale * rng.standard_normal(shape), 0, 1)


@pytest.mark.parametrize("shape", [(3, 1, 28, 28), (2, 1, 8, 8), (2, 3, 16, 12)])
def test_ssim_equals_scikit_image(shape: tuple[int, ...]) -> None:
    a, b = _noisy(shape, seed=sum(shape))
    ours = ssim(a, b)
    theirs = [
        structural_similarity(a[i], b[i], data_range=1.0, channel_axis=0) for i in range(len(a))
    ]
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_psnr_equals_scikit_image_and_is_capped() -> None:
    a, b = _noisy((4, 1, 8, 8), seed=3)
    theirs = [peak_signal_noise_ratio(a[i], b[i], data_range=1.0) for i in range(4)]
    np.testing.assert_allclose(psnr(a, b), theirs, rtol=1e-10)
    assert psnr(a, a).tolist() == [PSNR_CAP] * 4
    assert mse(a, a).tolist() == [0.0] * 4


def test_scores_are_taken_in_unit_pixel_space_whatever_the_bounds() -> None:
    """An image normalised to [-1, 1] scores exactly like its [0, 1] original: PSNR is never
    computed on normalised tensors (a complaint about the reference tools)."""
    a, b = _noisy((2, 1, 8, 8), seed=5)
    plain = image_scores(a, b)
    scaled = image_scores(2 * a - 1, 2 * b - 1, bounds=(-1.0, 1.0))
    for key in ("mse", "psnr", "ssim"):
        assert scaled[key] == pytest.approx(plain[key], rel=1e-12)
    np.testing.assert_array_equal(to_unit(np.array([-3.0, 0.5, 9.0]), (0.0, 1.0)), [0, 0.5, 1])


@settings(max_examples=25, deadline=None)
@given(st.permutations(list(range(5))), st.integers(0, 10_000))
def test_match_undoes_any_permutation(perm: list[int], seed: int) -> None:
    truth = np.random.default_rng(seed).random((5, 1, 6, 6))
    shuffled = truth[perm]
    order = match(shuffled, truth)
    np.testing.assert_array_equal(shuffled[order], truth)
    scores = image_scores(shuffled, truth)
    assert scores["psnr"] == PSNR_CAP and scores["ssim"] == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.randoms())
def test_label_accuracy_is_order_free_and_one_on_the_same_multiset(labels, rnd) -> None:
    shuffled = list(labels)
    rnd.shuffle(shuffled)
    assert label_accuracy(shuffled, labels) == 1.0
    wrong = [(v + 1) % 10 for v in labels]
    assert label_accuracy(wrong, labels) < 1.0 or len(set(labels)) == 10


def test_label_accuracy_counts_repeats() -> None:
    assert label_accuracy([3, 3, 1], [3, 1, 1]) == pytest.approx(2 / 3)
    assert label_accuracy([7], [7]) == 1.0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.5))
def test_more_noise_never_scores_better(seed: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    a = rng.random((1, 1, 8, 8))
    noise = rng.standard_normal(a.shape)
    near, far = a + scale * noise, a + 2 * scale * noise
    assert mse(near, a)[0] < mse(far, a)[0]
    assert psnr(near, a)[0] > psnr(far, a)[0]
    assert math.isfinite(ssim(far, a)[0])


@pytest.mark.parametrize(
    ("a", "b", "bounds"),
    [
        (np.zeros((2, 1, 4, 4)), np.zeros((3, 1, 4, 4)), (0, 1)),
        (np.full((1, 1, 4, 4), np.nan), np.zeros((1, 1, 4, 4)), (0, 1)),
        (np.zeros((0, 1, 4, 4)), np.zeros((0, 1, 4, 4)), (0, 1)),
        (np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 4, 4)), (1, 0)),
    ],
)
def test_bad_input_is_one_line(a: np.ndarray, b: np.ndarray, bounds: tuple[int, int]) -> None:
    with pytest.raises(StatisticsError) as info:
        image_scores(a, b, bounds)
    assert "\n" not in str(info.value)


def test_label_accuracy_needs_labels() -> None:
    with pytest.raises(StatisticsError):
        label_accuracy([1], [])
