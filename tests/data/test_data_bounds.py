"""Loaders bound every allocation by what the file really holds, and still read good files."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from privacylab.data import DataError, load_numpy_pickle, read_idx
from privacylab.data.arrays import load_arrays
from privacylab.data.idx import read_idx_header


def _idx(code: int, shape: tuple[int, ...], data: bytes) -> bytes:
    return bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + data


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(
    ("code", "dtype"), [(0x08, "u1"), (0x09, "i1"), (0x0B, ">i2"), (0x0C, ">i4"), (0x0D, ">f4")]
)
def test_idx_round_trip(tmp_path: Path, compress: bool, code: int, dtype: str) -> None:
    values = (np.arange(3 * 5 * 7) % 100).astype(dtype).reshape(3, 5, 7)
    blob = _idx(code, values.shape, values.tobytes())
    path = tmp_path / ("a.gz" if compress else "a")
    path.write_bytes(gzip.compress(blob) if compress else blob)
    assert read_idx_header(path).shape == (3, 5, 7)
    out = read_idx(path)
    assert out.dtype.isnative and np.array_equal(out, values)


def test_idx_gzip_longer_than_its_header_is_refused_after_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "bomb.gz"
    path.write_bytes(gzip.compress(_idx(0x08, (2, 2), b"\0" * (8 << 20))))
    with pytest.raises(DataError, match="holds more bytes"):
        read_idx(path)


def test_idx_header_beyond_what_gzip_can_hold_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "claims.gz"
    path.write_bytes(gzip.compress(_idx(0x08, (10**6, 28, 28), b"")))
    with pytest.raises(DataError, match="more than a"):
        read_idx_header(path)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_numpy_pickles_of_every_protocol_load(tmp_path: Path, protocol: int) -> None:
    arrays = {
        "u8": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "i8": np.arange(5, dtype=np.int64),
        "big_endian": np.arange(6, dtype=">f4").reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
        "bool": np.array([True, False]),
    }
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({"data": arrays, "labels": [1, 2]}, protocol=protocol))
    out = load_numpy_pickle(path)
    assert isinstance(out, dict) and out["labels"] == [1, 2]
    for key, value in arrays.items():
        got = out["data"][key]
        assert got.dtype == value.dtype and np.array_equal(got, value)


def test_npz_member_shorter_than_its_header_is_refused(tmp_path: Path) -> None:
    x = np.zeros((4, 3), np.float32)
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x, y_train=np.zeros(4, np.int64), x_test=x, y_test=np.zeros(4, np.int64))
    blob = bytearray(path.read_bytes())
    # announce 40 rows where 4 are stored: numpy would allocate the 40 before reading
    marker = b"'shape': (4, 3)"
    index = blob.index(marker)
    blob[index : index + len(marker)] = b"'shape': (40,3)"
    path.write_bytes(bytes(blob))
    with pytest.raises(DataError):
        load_arrays(path)
