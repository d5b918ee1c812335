"""MNIST and Fashion-MNIST from their released IDX files, as torchvision lays them out.

The IDX format (LeCun et al., http://yann.lecun.com/exdb/mnist/): a 4-byte magic number
`0x00 0x00 <type code> <number of dimensions>`, one big-endian uint32 per dimension, then the
values in row-major order, big-endian. Files may be gzip-compressed (`.gz`).
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import torch

from privacylab.data._files import find_folder, require_root
from privacylab.data.dataset import Dataset
from privacylab.data.errors import DataError
from privacylab.data.registry import register_dataset

IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


MAX_IDX_BYTES = 1024**3
"""Largest IDX payload read (1 GiB; MNIST's largest file holds 47 MB)."""

MAX_DEFLATE_RATIO = 1032
"""Deflate expands at most ~1032-fold, so a gzip file of n bytes decompresses to < 1032 n + 64."""

CHUNK = 1 << 20


class IdxHeader(NamedTuple):
    """What the first 4 + 4·ndim bytes of an IDX file say: the dtype, the shape, and where the
    values start."""

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of values the header announces."""
        return math.prod(self.shape) * self.dtype.itemsize


def _open(path: Path) -> BinaryIO:
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as error:
        raise DataError(f"cannot read IDX file {path}: {error.strerror or error}") from None


def _read_exactly(stream: BinaryIO, size: int, path: Path, what: str) -> bytes:
    try:
        data = stream.read(size)
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read IDX file {path}: {error}") from None
    if len(data) != size:
        raise DataError(f"{path}: truncated IDX {what}")
    return data


def read_idx_header(path: str | Path) -> IdxHeader:
    """The header of one IDX file, checked against the file's size before any value is read.

    A plain file must hold exactly the announced bytes; a gzip file's announced size must be
    reachable from its compressed size (deflate expands at most ~1032-fold); both must be at most
    `MAX_IDX_BYTES`.
    """
    path = Path(path)
    with _open(path) as stream:
        return _header(stream, path)


def _header(stream: BinaryIO, path: Path) -> IdxHeader:
    magic = _read_exactly(stream, 4, path, "magic number")
    if magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = IDX_DTYPES[magic[2]], magic[3]
    if ndim == 0:
        raise DataError(f"{path}: IDX header announces 0 dimensions")
    dims = _read_exactly(stream, 4 * ndim, path, "header")
    shape = tuple(int(d) for d in np.frombuffer(dims, dtype=">u4"))
    header = IdxHeader(dtype, shape, 4 + 4 * ndim)
    if header.nbytes > MAX_IDX_BYTES:
        raise DataError(
            f"{path}: IDX header announces shape {shape} ({header.nbytes:,} bytes), more than "
            f"the {MAX_IDX_BYTES:,}-byte limit"
        )
    try:
        size = path.stat().st_size
    except OSError as error:
        raise DataError(f"cannot read IDX file {path}: {error.strerror or error}") from None
    if path.suffix == ".gz":
        if header.offset + header.nbytes > MAX_DEFLATE_RATIO * size + 64:
            raise DataError(
                f"{path}: IDX header announces shape {shape}, more than a {size}-byte gzip "
                "file can hold"
            )
    elif size != header.offset + header.nbytes:
        raise DataError(
            f"{path}: IDX header announces shape {shape} but the file holds "
            f"{size - header.offset} bytes of data"
        )
    return header


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in one IDX file (gzip-compressed when its name ends in `.gz`).

    The header is checked first (`read_idx_header`); the values are then read in 1 MiB chunks
    and the file refused as soon as it holds more, or at the end if it holds fewer, bytes than
    the header announces, so memory never exceeds the announced size.
    """
    path = Path(path)
    with _open(path) as stream:
        header = _header(stream, path)
        data = bytearray()
        try:
            while len(data) <= header.nbytes:
                chunk = stream.read(min(CHUNK, header.nbytes + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        except (OSError, EOFError, zlib.error) as error:
            raise DataError(f"cannot read IDX file {path}: {error}") from None
    if len(data) != header.nbytes:
        more = "more" if len(data) > header.nbytes else f"only {len(data)}"
        raise DataError(
            f"{path}: IDX header announces shape {header.shape} ({header.nbytes} bytes of "
            f"data) but the file holds {more} bytes"
        )
    values = np.frombuffer(data, dtype=header.dtype)
    return values.reshape(header.shape).astype(header.dtype.newbyteorder("="))


def load_idx_images(name: str, root: Path | None, folder_name: str) -> Dataset:
    """Train then test images of an MNIST-format dataset found in `root` or `root/<folder>/raw`.

    All four headers are read and checked against each other before any values are read."""
    expected = [(f, f + ".gz") for f in IDX_FILES]
    root = require_root(name, root, IDX_FILES)
    folders = [root, root / folder_name / "raw", root / folder_name]
    _, paths = find_folder(name, folders, expected)
    headers = [read_idx_header(p).shape for p in paths]
    for images, labels, part in (
        (headers[0], headers[1], "train"),
        (headers[2], headers[3], "t10k"),
    ):
        if len(images) != 3 or len(labels) != 1 or images[0] != labels[0]:
            raise DataError(
                f"dataset {name!r}: {part} images {images} and labels {labels} do not match"
            )
    if headers[0][1:] != headers[2][1:]:
        raise DataError(f"dataset {name!r}: train and test images differ in size")
    train_x, train_y, test_x, test_y = (read_idx(p) for p in paths)
    images = np.concatenate([train_x, test_x]).astype(np.float32)
    if not np.isfinite(images).all():
        raise DataError(f"dataset {name!r}: images contain NaN or infinity")
    images /= 255.0
    labels = np.concatenate([train_y, test_y])
    if not np.issubdtype(labels.dtype, np.integer) or (
        labels.size and (labels.min() < 0 or labels.max() > 9)
    ):
        raise DataError(f"dataset {name!r}: labels must be integers 0..9")
    labels = labels.astype(np.int64)
    height, width = images.shape[1:]
    return Dataset(
        name=name,
        features=torch.from_numpy(images.reshape(-1, 1, height, width)),
        labels=torch.from_numpy(labels),
        num_classes=10,
        input_shape=(1, height, width),
        kind="image",
        train_size=len(train_y),
    )


@register_dataset("mnist")
def load_mnist(root: Path | None) -> Dataset:
    """MNIST (LeCun et al. 1998): 60,000 train then 10,000 test digits, (1, 28, 28) in [0, 1]."""
    return load_idx_images("mnist", root, "MNIST")


@register_dataset("fashion_mnist")
def load_fashion_mnist(root: Path | None) -> Dataset:
    """Fashion-MNIST (Xiao et al. 2017): 60,000 train then 10,000 test, (1, 28, 28) in [0, 1]."""
    return load_idx_images("fashion_mnist", root, "FashionMNIST")
