"""The thief's query sets: the extraction split, in-distribution, out-of-distribution and
random pools."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from privacylab.attacks.extraction import ExtractionError
from privacylab.attacks.extraction.pools import (
    extraction_split,
    in_distribution_pool,
    out_of_distribution_pool,
    random_pool,
)
from privacylab.data import load_dataset
from privacylab.data.dataset import train_test_indices
from privacylab.data.errors import DataError


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.mark.parametrize("seed", [0, 3])
def test_split_halves_the_victims_test_rows(digits, seed: int) -> None:
    train_rows, test_rows = train_test_indices(digits, seed=seed)
    pool, held = extraction_split(digits, seed)
    assert len(np.intersect1d(pool, held)) == 0
    assert np.array_equal(np.sort(np.concatenate([pool, held])), np.sort(test_rows))
    assert len(np.intersect1d(pool, train_rows)) == 0
    assert len(np.intersect1d(held, train_rows)) == 0
    assert abs(len(pool) - len(held)) <= 1
    assert np.all(np.diff(pool) > 0) and np.all(np.diff(held) > 0)
    again = extraction_split(digits, seed)
    assert np.array_equal(again[0], pool) and np.array_equal(again[1], held)


def test_split_uses_the_canonical_cut_when_there_is_one(digits) -> None:
    from dataclasses import replace

    cut = replace(digits, train_size=1000)
    pool, held = extraction_split(cut, 5)
    assert min(pool.min(), held.min()) >= 1000
    assert len(pool) + len(held) == len(digits) - 1000
    other = extraction_split(cut, 6)
    assert not np.array_equal(other[0], pool)


def test_in_distribution_pool_is_the_rows_without_labels(digits) -> None:
    rows = np.array([5, 1, 9])
    pool = in_distribution_pool(digits, rows)
    assert torch.equal(pool, digits.features[rows])
    pool[0] += 1
    assert not torch.equal(pool[0], digits.features[5])
    with pytest.raises(DataError):
        in_distribution_pool(digits, [len(digits)])
    with pytest.raises(ExtractionError, match="at least one row"):
        in_distribution_pool(digits, np.array([], dtype=np.int64))


def test_random_pool_is_uniform_in_bounds() -> None:
    x = random_pool((3,), 4000, bounds=(-2.0, 1.0), seed=1)
    assert x.shape == (4000, 3) and x.dtype == torch.float32
    assert float(x.min()) >= -2.0 and float(x.max()) <= 1.0
    for column in x.T.numpy():
        assert stats.kstest(column, stats.uniform(loc=-2.0, scale=3.0).cdf).pvalue > 1e-3
    assert torch.equal(x, random_pool((3,), 4000, bounds=(-2.0, 1.0), seed=1))


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 8, 8)])
def test_image_ood_pool_shape_bounds_and_seed(shape: tuple[int, ...]) -> None:
    x = out_of_distribution_pool(shape, 50, seed=2)
    assert tuple(x.shape) == (50, *shape) and x.dtype == torch.float32
    flat = x.reshape(50, -1)
    assert torch.allclose(flat.min(1).values, torch.zeros(50), atol=1e-6)
    assert torch.allclose(flat.max(1).values, torch.ones(50), atol=1e-6)
    assert torch.equal(x, out_of_distribution_pool(shape, 50, seed=2))
    assert not torch.equal(x, out_of_distribution_pool(shape, 50, seed=3))


def test_image_ood_pool_is_far_from_digits(digits) -> None:
    """Photograph patches are further from every digit than digits are from each other
    (nearest-neighbour distance, numpy), and their pixel statistics differ: digits are mostly
    black background, patches are not."""
    rng = np.random.default_rng(0)
    rows = rng.permutation(len(digits))
    reference = digits.features[rows[:800]].reshape(800, -1).double()
    queries = digits.features[rows[800:1000]].reshape(200, -1).double()
    ood = out_of_distribution_pool((1, 8, 8), 200, seed=0).reshape(200, -1).double()
    in_nn = torch.cdist(queries, reference).min(1).values.median()
    ood_nn = torch.cdist(ood, reference).min(1).values.median()
    assert float(ood_nn) > 1.3 * float(in_nn)
    dark = float((queries < 0.05).double().mean())
    assert float((ood < 0.05).double().mean()) < dark - 0.2


def test_tabular_ood_keeps_marginals_and_breaks_dependence() -> None:
    rng = np.random.default_rng(4)
    a = rng.normal(size=2000)
    reference = np.stack([a, 2 * a + 1, rng.integers(0, 3, size=2000)], axis=1)
    x = out_of_distribution_pool((3,), 3000, seed=4, reference=reference).numpy()
    assert abs(np.corrcoef(reference[:, 0], reference[:, 1])[0, 1]) > 0.99
    assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1]) < 0.1
    for j in range(3):
        assert np.isin(x[:, j].astype(np.float32), reference[:, j].astype(np.float32)).all()
        assert stats.ks_2samp(x[:, j], reference[:, j]).pvalue > 1e-3
    uniform = out_of_distribution_pool((3,), 10, seed=0, bounds=(-1.0, 1.0))
    assert torch.equal(uniform, random_pool((3,), 10, bounds=(-1.0, 1.0), seed=0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: random_pool((3,), 0), "pool size"),
        (lambda: random_pool((3,), 5, bounds=(1.0, 1.0)), "bounds"),
        (lambda: random_pool((0,), 5), "input shape"),
        (lambda: out_of_distribution_pool((3,), 5, reference=np.zeros((4, 2))), "reference"),
        (lambda: out_of_distribution_pool((1, 8, 8), 5, seed=-1), "seed"),
    ],
)
def test_bad_input_one_line(call, message: str) -> None:
    with pytest.raises(ExtractionError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
