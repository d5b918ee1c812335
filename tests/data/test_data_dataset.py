"""The Dataset container and the canonical train/test cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privacylab.data import DataError, Dataset, split_train_test


def make(n: int = 10, train_size: int | None = None) -> Dataset:
    return Dataset(
        name="toy",
        features=torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
        labels=torch.arange(n, dtype=torch.int64) % 3,
        num_classes=3,
        input_shape=(3,),
        kind="tabular",
        train_size=train_size,
    )


def test_len_subset_and_tensors() -> None:
    data = make(10, train_size=6)
    assert len(data) == 10
    part = data.subset([4, 1, 1])
    assert part.labels.tolist() == [1, 1, 1]
    assert torch.equal(part.features[0], data.features[4])
    assert part.train_size is None and part.name == "toy"
    features, labels = data.to_tensors()
    assert features is data.features and labels is data.labels
    assert len(data.subset(np.array([], dtype=np.int64))) == 0
    assert len(data.subset(torch.tensor([0, 9]))) == 2


@pytest.mark.parametrize("indices", [[10], [-1], [[0, 1]], [True, False], [0.5]])
def test_subset_rejects_bad_indices(indices: object) -> None:
    with pytest.raises(DataError):
        make(10).subset(indices)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"labels": torch.zeros(10, dtype=torch.int32)},
        {"labels": torch.full((10,), 3, dtype=torch.int64)},
        {"features": torch.zeros(9, 3)},
        {"features": torch.zeros(10, 3, dtype=torch.float64)},
        {"input_shape": (4,)},
        {"kind": "audio"},
        {"train_size": 11},
    ],
)
def test_rejects_inconsistent_fields(change: dict) -> None:
    fields = {
        "name": "toy",
        "features": torch.zeros(10, 3),
        "labels": torch.zeros(10, dtype=torch.int64),
        "num_classes": 3,
        "input_shape": (3,),
        "kind": "tabular",
    }
    with pytest.raises(DataError):
        Dataset(**{**fields, **change})


def test_split_uses_canonical_cut() -> None:
    train, test = split_train_test(make(10, train_size=7))
    assert len(train) == 7 and len(test) == 3
    assert train.labels.tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_split_without_cut_is_seeded_and_disjoint() -> None:
    data = make(50)
    train, test = split_train_test(data, test_fraction=0.2, seed=3)
    again, _ = split_train_test(data, test_fraction=0.2, seed=3)
    assert len(train) == 40 and len(test) == 10
    assert torch.equal(train.features, again.features)
    rows = {tuple(r.tolist()) for r in torch.cat([train.features, test.features])}
    assert len(rows) == 50
    with pytest.raises(DataError):
        split_train_test(data, test_fraction=1.0)
