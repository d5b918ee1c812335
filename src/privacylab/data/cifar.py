"""CIFAR-10 (Krizhevsky 2009) from the released python batches `cifar-10-batches-py/`.

The batches are pickles of plain dicts holding a uint8 array `data` of shape (n, 3072) and a
list `labels`. They are read with `NumpyOnlyUnpickler`, which resolves only the globals needed to
rebuild numpy arrays and refuses every other global, so a tampered batch cannot run code.
"""

from __future__ import annotations

import codecs
import importlib
import io
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from privacylab.data._files import find_folder, require_root
from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import register_dataset

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"


def _numpy_global(name: str, *modules: str) -> Callable[[], object]:
    def resolve() -> object:
        for module in modules:
            try:
                return getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
        raise DataError(f"this numpy has no {name} to rebuild pickled arrays")

    return resolve


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """`_codecs.encode` as Python 3 pickles bytes at protocol <= 2, limited to latin-1."""
    if not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise DataError(f"refusing _codecs.encode with encoding {encoding!r} in a pickle")
    return text.encode("latin-1")


_reconstruct = _numpy_global("_reconstruct", "numpy._core.multiarray", "numpy.core.multiarray")
_frombuffer = _numpy_global("_frombuffer", "numpy._core.numeric", "numpy.core.numeric")

ALLOWED_GLOBALS: dict[tuple[str, str], Callable[[], object]] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1_encode,
}


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An Unpickler that rebuilds dicts, lists, strings, numbers and numpy arrays, nothing else.

    `find_class` resolves only the numpy array reconstruction globals in `ALLOWED_GLOBALS`
    (`_reconstruct`, `_frombuffer`, `ndarray`, `dtype`, and a latin-1-only `_codecs.encode`) and
    raises DataError for any other global, before anything is called.
    """

    def find_class(self, module: str, name: str) -> object:
        resolve = ALLOWED_GLOBALS.get((module, name))
        if resolve is None:
            raise DataError(
                f"refusing to unpickle global {module}.{name}: only numpy arrays are allowed"
            )
        return resolve()

    def persistent_load(self, pid: object) -> object:
        raise DataError("refusing to unpickle a persistent id: only numpy arrays are allowed")


def load_numpy_pickle(path: str | Path) -> object:
    """Unpickle `path` with `NumpyOnlyUnpickler` (latin-1 for Python 2 strings, as torchvision)."""
    path = Path(path)
    try:
        payload = path.read_bytes()
    except OSError as error:
        raise DataError(f"cannot read {path}: {error}") from None
    try:
        return NumpyOnlyUnpickler(io.BytesIO(payload), encoding="latin1").load()
    except DataError as error:
        raise DataError(f"{path}: {error}") from None
    except Exception as error:
        raise DataError(f"{path} is not a readable pickle of numpy arrays: {error}") from None


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = load_numpy_pickle(path)
    if not isinstance(batch, dict):
        raise DataError(f"{path}: expected a dict, got {type(batch).__name__}")
    batch = {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DataError(f"{path}: expected keys 'data' and 'labels'")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: 'data' must be uint8 of shape (n, 3072), got {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: {data.shape[0]} images but {labels.size} labels")
    return data, labels


@register_dataset("cifar10")
def load_cifar10(root: Path | None) -> Dataset:
    """CIFAR-10: 50,000 train then 10,000 test images, (3, 32, 32) in [0, 1].

    Reads `data_batch_1..5` and `test_batch` from `root/cifar-10-batches-py/` or `root/`
    (extract `cifar-10-python.tar.gz` first).
    """
    files = (*TRAIN_BATCHES, TEST_BATCH)
    root = require_root("cifar10", root, files)
    _, paths = find_folder("cifar10", [root / "cifar-10-batches-py", root], [(f,) for f in files])
    batches = [_read_batch(p) for p in paths]
    data = np.concatenate([d for d, _ in batches])
    labels = np.concatenate([y for _, y in batches])
    images = data.reshape(-1, 3, 32, 32).astype(np.float32)
    images /= 255.0
    return Dataset(
        name="cifar10",
        features=torch.from_numpy(images),
        labels=torch.from_numpy(labels),
        num_classes=10,
        input_shape=(3, 32, 32),
        kind="image",
        train_size=sum(len(y) for _, y in batches[:-1]),
    )
