"""Your own data: arrays `x_train, y_train, x_test, y_test` from an .npz file or a folder.

The training rows are the target model's members; the test rows are never trained on. The
dataset keeps that cut as its canonical one (`train_size`), so everything that splits a dataset
(`train_test_indices`, the membership game of a saved model) sees members first. Arrays are read
with `allow_pickle=False` and their sizes are checked from the file headers before any is read.

Features of 2 dimensions (n, d) are tabular; of 3 (n, H, W) are one-channel images and of 4
(n, C, H, W) images, all as float32. Labels are integers in [0, num_classes); num_classes is
`num_classes` in the file when present, else the largest label + 1.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError

ARRAYS = ("x_train", "y_train", "x_test", "y_test")
MAX_ARRAY_BYTES = 16 * 1024**3
"""Largest total size of the arrays `load_arrays` will read (16 GiB)."""


def is_array_source(name: object) -> bool:
    """Whether a dataset name is a path to user arrays (.npz file, or a folder of .npy files)."""
    if not isinstance(name, str) or not name:
        return False
    path = Path(name).expanduser()
    return name.endswith(".npz") or (path.is_dir() and (path / "x_train.npy").exists())


def _npy_header(handle: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{where} is not a valid .npy array: {error}") from None
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects; only numeric arrays are read")
    return tuple(int(s) for s in shape), dtype


MAX_DEFLATE_RATIO = 1032
"""Deflate expands at most ~1032-fold."""


def _check_size(
    header: tuple[tuple[int, ...], np.dtype], data: int, compressed: int | None, where: str
) -> None:
    """Refuse an array whose header announces more (or fewer) bytes than its file holds, or more
    than its compressed size can expand to, before numpy allocates what the header announces."""
    shape, dtype = header
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != data:
        raise DataError(f"{where}: header announces shape {shape} but the file holds {data} bytes")
    if compressed is not None and nbytes > MAX_DEFLATE_RATIO * compressed + 1024:
        raise DataError(f"{where}: shape {shape} cannot come from {compressed} compressed bytes")


def _headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each required array, read from headers only."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    if path.is_dir():
        for key in ARRAYS:
            file = path / f"{key}.npy"
            if not file.is_file():
                raise DataError(f"{path} has no {key}.npy (need {', '.join(ARRAYS)})")
            with open(file, "rb") as handle:
                out[key] = _npy_header(handle, str(file))
                _check_size(out[key], file.stat().st_size - handle.tell(), None, str(file))
        return out
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            for key in ARRAYS:
                if f"{key}.npy" not in names:
                    raise DataError(f"{path} has no array {key!r} (need {', '.join(ARRAYS)})")
                info = archive.getinfo(f"{key}.npy")
                with archive.open(info) as handle:
                    out[key] = _npy_header(handle, f"{path}:{key}")
                    data = info.file_size - handle.tell()
                _check_size(out[key], data, info.compress_size, f"{path}:{key}")
    except (zipfile.BadZipFile, OSError) as error:
        raise DataError(f"{path} is not a readable .npz file: {error}") from None
    return out


def _read(path: Path, key: str) -> np.ndarray:
    try:
        if path.is_dir():
            return np.load(path / f"{key}.npy", allow_pickle=False)
        with np.load(path, allow_pickle=False) as archive:
            return archive[key]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise DataError(f"cannot read {key} from {path}: {error}") from None


def _num_classes(path: Path) -> int | None:
    if path.is_dir():
        file = path / "num_classes.npy"
        value = np.load(file, allow_pickle=False) if file.is_file() else None
    else:
        with np.load(path, allow_pickle=False) as archive:
            value = archive["num_classes"] if "num_classes" in archive.files else None
    if value is None:
        return None
    if value.size != 1 or not np.issubdtype(value.dtype, np.integer) or int(value) < 2:
        raise DataError(f"{path}: num_classes must be one integer >= 2")
    return int(value)


def _features(x: np.ndarray, where: str) -> torch.Tensor:
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise DataError(f"{where}: features must be numbers, got dtype {x.dtype}")
    x = x.astype(np.float32, copy=False)
    if not np.isfinite(x).all():
        raise DataError(f"{where}: features contain NaN or infinity")
    if x.ndim == 3:
        x = x[:, None]
    return torch.from_numpy(np.ascontiguousarray(x))


def _labels(y: np.ndarray, where: str) -> np.ndarray:
    if y.ndim != 1:
        raise DataError(f"{where}: labels must be 1-D, got shape {y.shape}")
    if np.issubdtype(y.dtype, np.floating):
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            raise DataError(f"{where}: labels must be whole numbers")
    elif not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise DataError(f"{where}: labels must be >= 0")
    return y


def load_arrays(path: str | Path, name: str | None = None) -> Dataset:
    """The dataset in `path` (.npz with `x_train, y_train, x_test, y_test`, or a folder of those
    `.npy` files): training rows first, then test rows, `train_size` = number of training rows.

    Every problem (missing array, mismatched shapes, NaN features, non-integer labels, a file
    larger than it claims or than `MAX_ARRAY_BYTES`) is one DataError line.
    """
    source = Path(path).expanduser()
    if not source.exists():
        raise DataError(f"no data at {source}")
    headers = _headers(source)
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
    if total > MAX_ARRAY_BYTES:
        raise DataError(f"{source}: arrays of {total} bytes exceed the {MAX_ARRAY_BYTES} limit")
    (xs, _), (ys, _) = headers["x_train"], headers["y_train"]
    (xt, _), (yt, _) = headers["x_test"], headers["y_test"]
    if len(xs) not in (2, 3, 4) or len(xt) != len(xs):
        raise DataError(
            f"{source}: features must be (n, d), (n, H, W) or (n, C, H, W) in both parts, "
            f"got x_train {xs} and x_test {xt}"
        )
    if xs[1:] != xt[1:]:
        raise DataError(f"{source}: x_train rows {xs[1:]} differ from x_test rows {xt[1:]}")
    if (xs[0],) != ys[:1] or (xt[0],) != yt[:1]:
        raise DataError(
            f"{source}: {xs[0]} training rows but labels {ys}; {xt[0]} test rows but labels {yt}"
        )
    if xs[0] < 2 or xt[0] < 2:
        raise DataError(f"{source}: need at least 2 training and 2 test rows")
    x_train = _features(_read(source, "x_train"), f"{source}:x_train")
    x_test = _features(_read(source, "x_test"), f"{source}:x_test")
    y_train = _labels(_read(source, "y_train"), f"{source}:y_train")
    y_test = _labels(_read(source, "y_test"), f"{source}:y_test")
    labels = np.concatenate([y_train, y_test])
    num_classes = _num_classes(source) or max(2, int(labels.max()) + 1)
    if labels.max() >= num_classes:
        raise DataError(f"{source}: labels must lie in [0, {num_classes})")
    features = torch.cat([x_train, x_test])
    return Dataset(
        name=name or source.stem,
        features=features,
        labels=torch.from_numpy(labels),
        num_classes=num_classes,
        input_shape=tuple(features.shape[1:]),
        kind="tabular" if features.ndim == 2 else "image",
        train_size=int(x_train.shape[0]),
    )


def save_arrays(
    path: str | Path,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    *,
    num_classes: int | None = None,
) -> Path:
    """Write the four arrays (numpy or torch) to the .npz file `path` that `load_arrays` reads."""
    arrays = {
        k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v)
        for k, v in zip(ARRAYS, (x_train, y_train, x_test, y_test), strict=True)
    }
    if num_classes is not None:
        arrays["num_classes"] = np.asarray(int(num_classes))
    target = Path(path)
    np.savez(target, **arrays)  # type: ignore[arg-type]
    return target if target.suffix == ".npz" else target.with_suffix(target.suffix + ".npz")
