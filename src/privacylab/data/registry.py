"""Datasets by name: loaders register themselves with `@register_dataset`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.registry import Registry

Loader = Callable[[Path | None], Dataset]

DATASETS: Registry[Loader] = Registry("dataset", error=DataError, choices="available:")
"""Every dataset by name; `my-digits` and `my_digits` are one name (see `Registry.key`)."""


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator registering `loader(root) -> Dataset` under `name`."""
    return DATASETS.register(name)


def available_datasets() -> list[str]:
    """Names accepted by `load_dataset`, sorted."""
    return sorted(DATASETS.names())


def load_dataset(name: str, root: str | Path | None = None) -> Dataset:
    """Load dataset `name`; on-disk datasets are read from `root`, nothing is ever downloaded.

    A path to an .npz file (or a folder of .npy files) with `x_train, y_train, x_test, y_test`
    loads the user's own arrays (`privacylab.data.arrays.load_arrays`).
    """
    from privacylab.data.arrays import is_array_source, load_arrays

    if is_array_source(name):
        return load_arrays(name)
    loader = DATASETS.get(name)
    folder = None if root is None else Path(root).expanduser()
    return loader(folder)
