"""The datasets shipped inside installed packages, and the registry."""

from __future__ import annotations

import pytest
import torch

from privacylab.data import DataError, available_datasets, load_dataset, split_train_test


def test_registry_lists_every_loader() -> None:
    names = set(available_datasets())
    expected = {"mnist5k", "digits", "breast_cancer", "mnist", "fashion_mnist", "cifar10"}
    assert expected | {"purchase100", "texas100"} <= names


def test_unknown_name_lists_available() -> None:
    with pytest.raises(DataError, match=r"available: .*mnist5k") as info:
        load_dataset("imagenet")
    assert "\n" not in str(info.value)


def test_mnist5k_shape_range_and_balanced_cut() -> None:
    data = load_dataset("mnist5k")
    assert data.features.shape == (5000, 1, 28, 28) and data.features.dtype == torch.float32
    assert data.input_shape == (1, 28, 28) and data.kind == "image" and data.num_classes == 10
    assert data.features.min() >= 0.0 and data.features.max() <= 1.0
    assert data.features.max() == 1.0
    assert data.train_size == 4000
    train, test = split_train_test(data)
    assert torch.bincount(train.labels).tolist() == [400] * 10
    assert torch.bincount(test.labels).tolist() == [100] * 10
    assert len(set(train.labels[:20].tolist())) > 3, "training rows must not be sorted by class"
    assert torch.equal(load_dataset("mnist5k").labels, data.labels), "cut must be fixed"


def test_digits() -> None:
    data = load_dataset("digits")
    assert data.features.shape == (1797, 1, 8, 8) and data.input_shape == (1, 8, 8)
    assert data.features.min() == 0.0 and data.features.max() == 1.0
    assert data.labels.dtype == torch.int64 and set(data.labels.tolist()) == set(range(10))
    assert data.train_size is None


def test_breast_cancer_standardised_on_train_part() -> None:
    data = load_dataset("breast-cancer")
    assert data.features.shape == (569, 30) and data.kind == "tabular"
    assert data.num_classes == 2 and set(data.labels.tolist()) == {0, 1}
    train, test = split_train_test(data)
    assert len(train) == 455 and len(test) == 114
    assert torch.allclose(train.features.mean(0), torch.zeros(30), atol=1e-5)
    assert torch.allclose(train.features.std(0, unbiased=False), torch.ones(30), atol=1e-4)
    assert not torch.allclose(test.features.mean(0), torch.zeros(30), atol=1e-3)
