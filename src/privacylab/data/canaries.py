"""Canaries: crafted examples whose membership an auditor later tests.

Kinds (all seeded):

- `mislabeled`: copies of distinct real examples with the label moved to another class, chosen
  uniformly — hard-to-fit, memorised examples, as the mislabeled canaries of Aerni, Zhang &
  Tramèr 2024 ("Evaluations of Machine Learning Privacy Defenses are Misleading").
- `random`: inputs drawn at random with uniformly random labels — uniform pixels in [0, 1] for
  images, fair coin flips for binary tabular data, standard normal for other tabular data, uniform
  token ids below the largest id in the data for text.
- `blank-corner` (images only): an all-zero image with one square patch of ones (side
  max(1, min(H, W) // 7)) in a corner, the four corners in turn, with a uniformly random label.
  Jagielski, Ullman & Oprea 2020 ("Auditing Differentially Private Machine Learning: How Private
  is Private SGD?") audit DP-SGD with poison that adds a pattern in the corner of an image
  (seed 002); here the pattern sits on a blank image so the canary owes nothing to real data.

Canaries are placed at the end of the training part (after row `train_size - 1`, whose
`train_size` grows by `count`) or, when there is no canonical cut, at the end of the dataset.
"""

from __future__ import annotations

import numpy as np
import torch

from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError

CANARY_KINDS = ("mislabeled", "random", "blank-corner")


def _random_labels(rng: np.random.Generator, count: int, num_classes: int) -> np.ndarray:
    return rng.integers(0, num_classes, size=count, dtype=np.int64)


def _mislabeled(
    dataset: Dataset, count: int, rng: np.random.Generator
) -> tuple[torch.Tensor, np.ndarray]:
    if dataset.num_classes < 2:
        raise DataError("mislabeled canaries need at least 2 classes")
    if count > len(dataset):
        raise DataError(f"cannot copy {count} distinct examples from {len(dataset)}")
    rows = rng.choice(len(dataset), size=count, replace=False)
    shift = rng.integers(1, dataset.num_classes, size=count, dtype=np.int64)
    labels = (dataset.labels.numpy()[rows] + shift) % dataset.num_classes
    return dataset.features[torch.from_numpy(rows)], labels


def _random(
    dataset: Dataset, count: int, rng: np.random.Generator
) -> tuple[torch.Tensor, np.ndarray]:
    shape = (count, *dataset.input_shape)
    values = dataset.features.numpy()
    if dataset.kind == "image":
        features = rng.random(shape, dtype=np.float32)
    elif dataset.kind == "text":
        features = rng.integers(0, max(int(values.max(initial=0)) + 1, 1), size=shape)
    elif np.isin(values, (0.0, 1.0)).all():
        features = rng.integers(0, 2, size=shape).astype(np.float32)
    else:
        features = rng.standard_normal(shape, dtype=np.float32)
    return torch.from_numpy(features), _random_labels(rng, count, dataset.num_classes)


def _blank_corner(
    dataset: Dataset, count: int, rng: np.random.Generator
) -> tuple[torch.Tensor, np.ndarray]:
    if dataset.kind != "image" or len(dataset.input_shape) != 3:
        raise DataError("blank-corner canaries need image data of shape (C, H, W)")
    _, height, width = dataset.input_shape
    side = max(1, min(height, width) // 7)
    features = torch.zeros((count, *dataset.input_shape), dtype=torch.float32)
    for i in range(count):
        top = 0 if i % 4 in (0, 1) else height - side
        left = 0 if i % 2 == 0 else width - side
        features[i, :, top : top + side, left : left + side] = 1.0
    return features, _random_labels(rng, count, dataset.num_classes)


_MAKERS = {"mislabeled": _mislabeled, "random": _random, "blank-corner": _blank_corner}


def insert_canaries(
    dataset: Dataset, count: int, *, kind: str = "mislabeled", seed: int
) -> tuple[Dataset, np.ndarray]:
    """`dataset` with `count` canaries of `kind` inserted, and the canaries' row indices.

    See the module docstring for the kinds and where the canaries are placed.
    """
    if kind not in _MAKERS:
        raise DataError(f"unknown canary kind {kind!r}; choose one of {', '.join(CANARY_KINDS)}")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise DataError(f"canary count must be an integer >= 0, got {count!r}")
    count = int(count)
    rng = np.random.default_rng(seed)
    features, labels = _MAKERS[kind](dataset, count, rng)
    features = features.to(dataset.features.dtype)
    at = len(dataset) if dataset.train_size is None else dataset.train_size
    merged = Dataset(
        name=dataset.name,
        features=torch.cat([dataset.features[:at], features, dataset.features[at:]]),
        labels=torch.cat([dataset.labels[:at], torch.from_numpy(labels), dataset.labels[at:]]),
        num_classes=dataset.num_classes,
        input_shape=dataset.input_shape,
        kind=dataset.kind,
        train_size=None if dataset.train_size is None else dataset.train_size + count,
    )
    return merged, np.arange(at, at + count, dtype=np.int64)
