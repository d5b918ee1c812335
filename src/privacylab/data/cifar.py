"""CIFAR-10 (Krizhevsky 2009) from the released python batches `cifar-10-batches-py/`.

The batches are pickles of plain dicts holding a uint8 array `data` of shape (n, 3072) and a
list `labels`. They are read with `NumpyOnlyUnpickler`, which resolves only the globals needed to
rebuild numpy arrays and refuses every other global, so a tampered batch cannot run code.
"""

from __future__ import annotations

import codecs
import importlib
import io
import math
import pickle
import pickletools
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


class _PendingDtype:
    """Stands for `numpy.dtype(spec, align, copy)` until its state arrives: only plain
    numeric or bytes dtypes of at most 16 bytes (no records, no sub-arrays, no objects)."""

    def __init__(self, spec: object, align: object = False, copy: object = False) -> None:
        if not isinstance(spec, str) or spec[:1] not in "biufcSU" or len(spec) > 4:
            raise DataError(f"refusing pickled dtype {spec!r}: only plain numeric dtypes")
        self.spec = spec
        self.dtype = self._make("|")

    def _make(self, order: str) -> np.dtype:
        try:
            dtype = np.dtype(self.spec).newbyteorder(order if order in "<>" else "=")
        except (TypeError, ValueError):
            raise DataError(f"refusing pickled dtype {self.spec!r}") from None
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
            raise DataError(f"refusing pickled dtype {self.spec!r}: only plain numeric dtypes")
        if dtype.itemsize > 16:
            raise DataError(f"refusing pickled dtype {self.spec!r}: items over 16 bytes")
        return dtype

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) < 2 or not isinstance(state[1], str):
            raise DataError("refusing a pickled dtype with an unexpected state")
        self.dtype = self._make(state[1])


def _as_dtype(value: object) -> np.dtype:
    if isinstance(value, _PendingDtype):
        return value.dtype
    raise DataError(f"refusing pickled array of dtype {value!r}")


class _PendingArray:
    """Stands for `numpy.core.multiarray._reconstruct(ndarray, shape, dtype)`: allocates nothing
    until `__setstate__` brings the data, and then only views the bytes already in the pickle, so
    no array can be larger than the file it came from."""

    def __init__(self, subtype: object, shape: object, dtype: object) -> None:
        if subtype is not np.ndarray:
            raise DataError("refusing to rebuild anything but a plain numpy array")
        self.array: np.ndarray | None = None

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) != 5:
            raise DataError("refusing a pickled array with an unexpected state")
        _, shape, dtype, fortran, raw = state
        self.array = _view(raw, _as_dtype(dtype), shape, "F" if fortran else "C")


def _view(raw: object, dtype: np.dtype, shape: object, order: str) -> np.ndarray:
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    if not isinstance(raw, (bytes, bytearray)):
        raise DataError("refusing a pickled array whose data are not raw bytes")
    if not isinstance(shape, tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise DataError(f"refusing a pickled array of shape {shape!r}")
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise DataError(
            f"a pickled array of shape {shape} and dtype {dtype} does not match its "
            f"{len(raw)} bytes of data"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape, order=order)  # type: ignore[call-overload]


def _frombuffer_checked(buf: object, dtype: object, shape: object, order: str = "C") -> np.ndarray:
    """`numpy._core.numeric._frombuffer` (protocol-5 arrays), checked like `_PendingArray`."""
    real = dtype if isinstance(dtype, np.dtype) else _as_dtype(dtype)
    return _view(buf, real, shape, "F" if order == "F" else "C")


def _resolved(value: object) -> object:
    """`value` with every `_PendingArray` replaced by its array (dicts, lists and tuples walked)."""
    if isinstance(value, _PendingArray):
        if value.array is None:
            raise DataError("a pickled array has no data")
        return value.array
    if isinstance(value, dict):
        return {k: _resolved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolved(v) for v in value)
    return value


SAFE_GLOBALS: dict[tuple[str, str], object] = {
    **{
        (m, "_reconstruct"): _PendingArray
        for m in ("numpy.core.multiarray", "numpy._core.multiarray")
    },
    **{
        (m, "_frombuffer"): _frombuffer_checked
        for m in ("numpy.core.numeric", "numpy._core.numeric")
    },
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _PendingDtype,
    ("_codecs", "encode"): _latin1_encode,
}
"""What each allowed global resolves to: stand-ins that check sizes before anything is built."""

MEMO_SLACK = 1024
"""A memo index may run at most this far ahead of the values memoised so far."""


def _scan(payload: bytes) -> None:
    """Walk the opcodes without running any (`pickletools.genops`) and refuse a memo index far
    beyond the values memoised so far: the C unpickler sizes its memo table by the largest
    index, so a 10-byte `LONG_BINPUT 2**31` would allocate gigabytes."""
    stored = 0
    try:
        for opcode, arg, _ in pickletools.genops(payload):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                index = stored if arg is None else int(arg)  # type: ignore[arg-type]
                if not 0 <= index <= stored + MEMO_SLACK:
                    raise DataError(f"refusing a pickle memo index {index} (only {stored} stored)")
                stored += 1
    except DataError:
        raise
    except Exception as error:
        raise DataError(f"not a readable pickle: {error}") from None


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An Unpickler that rebuilds dicts, lists, strings, numbers and numpy arrays, nothing else.

    `find_class` resolves only the numpy array reconstruction globals in `ALLOWED_GLOBALS`
    (`_reconstruct`, `_frombuffer`, `ndarray`, `dtype`, and a latin-1-only `_codecs.encode`) and
    raises DataError for any other global, before anything is called. Arrays and dtypes are
    rebuilt through size-checked stand-ins (`SAFE_GLOBALS`), so an array is a view of bytes
    already in the pickle; `load_numpy_pickle` also scans the opcodes first (`_scan`).
    """

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in ALLOWED_GLOBALS:
            raise DataError(
                f"refusing to unpickle global {module}.{name}: only numpy arrays are allowed"
            )
        return SAFE_GLOBALS[(module, name)]

    def load(self) -> object:
        """Unpickle, then replace each array stand-in by its array."""
        return _resolved(super().load())

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
        _scan(payload)
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
