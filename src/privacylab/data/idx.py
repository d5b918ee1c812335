"""MNIST and Fashion-MNIST from their released IDX files, as torchvision lays them out.

The IDX format (LeCun et al., http://yann.lecun.com/exdb/mnist/): a 4-byte magic number
`0x00 0x00 <type code> <number of dimensions>`, one big-endian uint32 per dimension, then the
values in row-major order, big-endian. Files may be gzip-compressed (`.gz`).
"""

from __future__ import annotations

import gzip
from pathlib import Path

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


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in one IDX file (gzip-compressed when its name ends in `.gz`)."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise DataError(f"cannot read IDX file {path}: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    dtype, ndim = IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise DataError(
            f"{path}: IDX header announces shape {shape} but the file holds "
            f"{len(raw) - header} bytes of data"
        )
    values = np.frombuffer(raw, dtype=dtype, count=count, offset=header)
    return values.reshape(shape).astype(dtype.newbyteorder("="))


def load_idx_images(name: str, root: Path | None, folder_name: str) -> Dataset:
    """Train then test images of an MNIST-format dataset found in `root` or `root/<folder>/raw`."""
    expected = [(f, f + ".gz") for f in IDX_FILES]
    root = require_root(name, root, IDX_FILES)
    folders = [root, root / folder_name / "raw", root / folder_name]
    _, paths = find_folder(name, folders, expected)
    train_x, train_y, test_x, test_y = (read_idx(p) for p in paths)
    for images, labels, part in ((train_x, train_y, "train"), (test_x, test_y, "t10k")):
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"dataset {name!r}: {part} images {images.shape} and labels {labels.shape} "
                "do not match"
            )
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"dataset {name!r}: train and test images differ in size")
    images = np.concatenate([train_x, test_x]).astype(np.float32)
    images /= 255.0
    labels = np.concatenate([train_y, test_y]).astype(np.int64)
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
