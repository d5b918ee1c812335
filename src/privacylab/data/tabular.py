"""Purchase-100 and Texas-100 from the text files released with Shokri et al. 2017.

Both are the membership-inference benchmarks of Shokri et al., "Membership Inference Attacks
Against Machine Learning Models" (IEEE S&P 2017), as redistributed by their authors:

- `dataset_purchase`: one row per customer, comma-separated; the first column is the class
  1..100, then 600 binary features.
- `texas/100/feats`: 6,169 comma-separated binary features per row; `texas/100/labels`: one class
  1..100 per line.

Features are kept binary as released; classes become 0..99. There is no canonical train/test cut.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from privacylab.data._files import find_folder, require_root
from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import register_dataset

NUM_CLASSES = 100
PURCHASE_FEATURES = 600
TEXAS_FEATURES = 6169


def read_csv_matrix(path: Path, name: str) -> np.ndarray:
    """A comma-separated numeric text file as a 2-D float32 array, or DataError.

    pandas' C parser: about 5x faster than np.loadtxt on the released Texas-100 file.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            frame = pd.read_csv(path, header=None, dtype=np.float32, engine="c")
            matrix = frame.to_numpy().reshape(len(frame), -1)
    except (OSError, ValueError) as error:
        raise DataError(f"dataset {name!r}: cannot parse {path}: {error}") from None
    if matrix.shape[0] == 0:
        raise DataError(f"dataset {name!r}: {path} holds no rows")
    if not np.isfinite(matrix).all():
        raise DataError(f"dataset {name!r}: {path} holds non-finite values")
    return matrix


def classes_from_one(values: np.ndarray, path: Path, name: str) -> np.ndarray:
    """Released labels 1..100 as int64 classes 0..99, or DataError."""
    labels = values.astype(np.int64)
    if (labels != values).any() or labels.min() < 1 or labels.max() > NUM_CLASSES:
        raise DataError(f"dataset {name!r}: labels in {path} must be integers 1..{NUM_CLASSES}")
    return labels - 1


def tabular_dataset(name: str, features: np.ndarray, labels: np.ndarray) -> Dataset:
    """A tabular Dataset over float32 `features` and int64 `labels`."""
    return Dataset(
        name=name,
        features=torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)),
        labels=torch.from_numpy(labels),
        num_classes=NUM_CLASSES,
        input_shape=(features.shape[1],),
        kind="tabular",
    )


@register_dataset("purchase100")
def load_purchase100(root: Path | None) -> Dataset:
    """Purchase-100 from `root/dataset_purchase` (or `root/purchase100/`, `root/purchase/`)."""
    root = require_root("purchase100", root, ["dataset_purchase"])
    folders = [root, root / "purchase100", root / "purchase"]
    _, (path,) = find_folder("purchase100", folders, [("dataset_purchase",)])
    table = read_csv_matrix(path, "purchase100")
    if table.shape[1] != PURCHASE_FEATURES + 1:
        raise DataError(
            f"dataset 'purchase100': {path} must have {PURCHASE_FEATURES + 1} columns "
            f"(label, then {PURCHASE_FEATURES} features), got {table.shape[1]}"
        )
    labels = classes_from_one(table[:, 0], path, "purchase100")
    return tabular_dataset("purchase100", table[:, 1:], labels)


@register_dataset("texas100")
def load_texas100(root: Path | None) -> Dataset:
    """Texas-100 from `root/texas/100/{feats,labels}` or `root/{feats,labels}`."""
    root = require_root("texas100", root, ["texas/100/feats", "texas/100/labels"])
    _, (feats_path, labels_path) = find_folder(
        "texas100", [root / "texas" / "100", root], [("feats",), ("labels",)]
    )
    features = read_csv_matrix(feats_path, "texas100")
    if features.shape[1] != TEXAS_FEATURES:
        raise DataError(
            f"dataset 'texas100': {feats_path} must have {TEXAS_FEATURES} columns, "
            f"got {features.shape[1]}"
        )
    raw_labels = read_csv_matrix(labels_path, "texas100")
    if raw_labels.shape[1] != 1 or raw_labels.shape[0] != features.shape[0]:
        raise DataError(
            f"dataset 'texas100': {labels_path} must hold one label per line for the "
            f"{features.shape[0]} rows of {feats_path}"
        )
    labels = classes_from_one(raw_labels[:, 0], labels_path, "texas100")
    return tabular_dataset("texas100", features, labels)
