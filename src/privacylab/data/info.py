"""What the checks before a run need to know of a dataset, without keeping it in memory."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

from privacylab.data.registry import load_dataset


class DatasetInfo(NamedTuple):
    """Rows, shape of one example and class count of a dataset."""

    size: int
    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int | None


def dataset_info(name: str, root: str | Path | None = None) -> DatasetInfo:
    """Load `name` once per process (memoised on name and root) and describe it; DataError for
    an unknown name or unreadable files, so a bad dataset is refused before any work."""
    return _info(str(name), None if root is None else str(root))


@functools.lru_cache(maxsize=16)
def _info(name: str, root: str | None) -> DatasetInfo:
    data = load_dataset(name, root)
    return DatasetInfo(len(data), tuple(data.input_shape), data.num_classes, data.train_size)
