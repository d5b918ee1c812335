"""The in-memory dataset every loader returns, and its canonical train/test cut."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from privacylab.data.errors import DataError

KINDS = ("image", "tabular", "text")

IndexLike = Sequence[int] | np.ndarray | torch.Tensor


@dataclass(eq=False)
class Dataset:
    """Features and labels of one dataset, held as CPU tensors.

    `features` is float32 for images, shape (n, C, H, W) scaled to [0, 1], and for tabular data,
    shape (n, d), standardised or binary as released; int64 token ids of shape (n, L) for text.
    `labels` is int64 of shape (n,) with values in [0, num_classes). `input_shape` is the shape of
    one example. `train_size`, where the source defines a canonical cut, says that the first
    `train_size` rows are the training part and the rest the test part.
    """

    name: str
    features: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    kind: str
    train_size: int | None = None

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        if self.kind not in KINDS:
            raise DataError(f"dataset kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.features, torch.Tensor) or not isinstance(self.labels, torch.Tensor):
            raise DataError(f"{self.name}: features and labels must be torch tensors")
        if self.labels.dtype != torch.int64 or self.labels.ndim != 1:
            raise DataError(
                f"{self.name}: labels must be a 1-D int64 tensor, got {self.labels.dtype} "
                f"of shape {tuple(self.labels.shape)}"
            )
        expected_dtype = torch.int64 if self.kind == "text" else torch.float32
        if self.features.dtype != expected_dtype:
            raise DataError(
                f"{self.name}: {self.kind} features must be {expected_dtype}, "
                f"got {self.features.dtype}"
            )
        if tuple(self.features.shape[1:]) != self.input_shape:
            raise DataError(
                f"{self.name}: features of shape {tuple(self.features.shape)} do not match "
                f"input_shape {self.input_shape}"
            )
        if self.features.shape[0] != self.labels.shape[0]:
            raise DataError(
                f"{self.name}: {self.features.shape[0]} feature rows but "
                f"{self.labels.shape[0]} labels"
            )
        if isinstance(self.num_classes, bool) or int(self.num_classes) < 1:
            raise DataError(f"{self.name}: num_classes must be >= 1, got {self.num_classes!r}")
        self.num_classes = int(self.num_classes)
        if len(self) and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise DataError(f"{self.name}: labels must lie in [0, {self.num_classes})")
        if self.train_size is not None and not 0 <= self.train_size <= len(self):
            raise DataError(f"{self.name}: train_size {self.train_size} outside [0, {len(self)}]")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices: IndexLike) -> Dataset:
        """The rows at `indices` (in that order) as a new Dataset; the canonical cut is dropped."""
        index = as_index(indices, len(self), self.name)
        return replace(
            self, features=self.features[index], labels=self.labels[index], train_size=None
        )

    def to_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(features, labels)`."""
        return self.features, self.labels


def as_index(indices: IndexLike, n: int, name: str = "dataset") -> torch.Tensor:
    """`indices` as an int64 tensor of positions in [0, n), or DataError."""
    array = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices)
    if array.dtype == bool:
        raise DataError(f"{name}: indices must be integer positions, not a boolean mask")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{name}: indices must be a 1-D sequence of integers")
    if array.size and (array.min() < 0 or array.max() >= n):
        raise DataError(f"{name}: indices must lie in [0, {n})")
    return torch.from_numpy(array.astype(np.int64, copy=False))


def split_train_test(
    dataset: Dataset, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[Dataset, Dataset]:
    """The canonical (train, test) cut at `dataset.train_size`.

    Sources without a canonical cut are split by a seeded permutation, `test_fraction` of the
    rows going to the test part.
    """
    train, test = train_test_indices(dataset, test_fraction=test_fraction, seed=seed)
    return dataset.subset(train), dataset.subset(test)


def train_test_indices(
    dataset: Dataset, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The row indices `split_train_test` gives to (train, test)."""
    n = len(dataset)
    if dataset.train_size is not None:
        return np.arange(dataset.train_size), np.arange(dataset.train_size, n)
    if not 0 < test_fraction < 1:
        raise DataError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    order = np.random.default_rng(seed).permutation(n)
    n_test = round(n * test_fraction)
    return order[n_test:], order[:n_test]
