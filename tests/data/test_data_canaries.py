"""Canary insertion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privacylab.data import DataError, Dataset, insert_canaries


def images(n: int = 20, train_size: int | None = 15) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    return Dataset(
        name="img",
        features=torch.rand(n, 1, 14, 14, generator=generator),
        labels=torch.arange(n, dtype=torch.int64) % 4,
        num_classes=4,
        input_shape=(1, 14, 14),
        kind="image",
        train_size=train_size,
    )


def test_mislabeled_copies_real_points_with_other_labels() -> None:
    data = images()
    out, idx = insert_canaries(data, 5, kind="mislabeled", seed=0)
    assert len(out) == 25 and out.train_size == 20
    assert idx.tolist() == list(range(15, 20))
    assert torch.equal(out.features[:15], data.features[:15])
    assert torch.equal(out.features[20:], data.features[15:])
    for i in idx:
        matches = (data.features == out.features[i]).flatten(1).all(1).nonzero().flatten()
        assert len(matches) == 1
        assert data.labels[matches[0]] != out.labels[i]


def test_random_and_blank_corner() -> None:
    data = images(train_size=None)
    out, idx = insert_canaries(data, 6, kind="random", seed=1)
    assert idx.tolist() == list(range(20, 26)) and out.train_size is None
    canaries = out.features[idx]
    assert canaries.min() >= 0 and canaries.max() <= 1 and canaries.std() > 0.2
    out, idx = insert_canaries(data, 4, kind="blank-corner", seed=1)
    canaries = out.features[idx]
    side = 2
    assert canaries.sum(dim=(1, 2, 3)).tolist() == [side * side] * 4
    assert canaries[0, 0, 0, 0] == 1 and canaries[1, 0, 0, -1] == 1
    assert canaries[2, 0, -1, 0] == 1 and canaries[3, 0, -1, -1] == 1
    assert ((out.labels[idx] >= 0) & (out.labels[idx] < 4)).all()


def test_seeded() -> None:
    data = images()
    a, _ = insert_canaries(data, 3, kind="random", seed=7)
    b, _ = insert_canaries(data, 3, kind="random", seed=7)
    c, _ = insert_canaries(data, 3, kind="random", seed=8)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.features, c.features)


def test_random_tabular_and_text() -> None:
    binary = Dataset(
        "bin",
        torch.randint(0, 2, (10, 6)).float(),
        torch.zeros(10, dtype=torch.int64),
        2,
        (6,),
        "tabular",
    )
    out, idx = insert_canaries(binary, 4, kind="random", seed=0)
    assert set(out.features[idx].unique().tolist()) <= {0.0, 1.0}
    text = Dataset(
        "txt", torch.randint(0, 30, (10, 5)), torch.zeros(10, dtype=torch.int64), 2, (5,), "text"
    )
    out, idx = insert_canaries(text, 4, kind="random", seed=0)
    assert out.features.dtype == torch.int64 and out.features[idx].max() < 30


@pytest.mark.parametrize(
    ("count", "kind"), [(3, "poison"), (-1, "random"), (21, "mislabeled"), (1.5, "random")]
)
def test_bad_arguments(count: object, kind: str) -> None:
    with pytest.raises(DataError):
        insert_canaries(images(), count, kind=kind, seed=0)  # type: ignore[arg-type]


def test_blank_corner_needs_images() -> None:
    table = Dataset("t", torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), 2, (3,), "tabular")
    with pytest.raises(DataError, match="image"):
        insert_canaries(table, 1, kind="blank-corner", seed=0)
    assert isinstance(insert_canaries(table, 0, kind="random", seed=0)[1], np.ndarray)
