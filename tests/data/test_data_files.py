"""On-disk loaders, tested on tiny files written in the exact released formats."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from privacylab.data import DataError, load_dataset, load_numpy_pickle, read_idx


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_mnist(folder: Path, compress: bool, n_train: int = 6, n_test: int = 4) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n_train + n_test, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n_train + n_test, dtype=np.uint8)
    write_idx(folder / "train-images-idx3-ubyte", images[:n_train], compress)
    write_idx(folder / "train-labels-idx1-ubyte", labels[:n_train], compress)
    write_idx(folder / "t10k-images-idx3-ubyte", images[n_train:], compress)
    write_idx(folder / "t10k-labels-idx1-ubyte", labels[n_train:], compress)
    return images, labels


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(("name", "sub"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_idx_loaders_read_both_layouts(tmp_path: Path, compress: bool, name: str, sub: str) -> None:
    images, labels = write_mnist(tmp_path / sub / "raw", compress)
    for root in (tmp_path, tmp_path / sub / "raw"):
        data = load_dataset(name, root)
        assert data.features.shape == (10, 1, 28, 28) and data.train_size == 6
        assert torch.allclose(data.features[:, 0] * 255, torch.from_numpy(images).float())
        assert data.labels.tolist() == labels.tolist() and data.labels.dtype == torch.int64


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match="magic"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 5) + b"\x00\x01")
    with pytest.raises(DataError, match="announces"):
        read_idx(short)
    wide = tmp_path / "wide"
    wide.write_bytes(struct.pack(">BBBBI", 0, 0, 0x0C, 1, 2) + struct.pack(">ii", -3, 7))
    assert read_idx(wide).tolist() == [-3, 7]


def test_missing_files_one_line_naming_them(tmp_path: Path) -> None:
    for name in ("mnist", "fashion_mnist", "cifar10", "purchase100", "texas100"):
        with pytest.raises(DataError, match="nothing is downloaded") as info:
            load_dataset(name, tmp_path)
        assert "\n" not in str(info.value)
        with pytest.raises(DataError, match="local folder"):
            load_dataset(name)
    with pytest.raises(DataError, match="train-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path)
    with pytest.raises(DataError, match="not a folder"):
        load_dataset("mnist", tmp_path / "absent")


def write_cifar(folder: Path, per_batch: int = 3, protocol: int = 2, byte_keys: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batch = {"batch_label": name, "labels": labels, "data": data, "filenames": ["x.png"] * 3}
        if byte_keys:
            batch = {k.encode(): v for k, v in batch.items()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        batches.append((data, labels))
    return batches


@pytest.mark.parametrize(("protocol", "byte_keys"), [(2, True), (2, False), (4, False), (5, False)])
def test_cifar10(tmp_path: Path, protocol: int, byte_keys: bool) -> None:
    batches = write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol, byte_keys=byte_keys)
    data = load_dataset("cifar10", tmp_path)
    assert data.features.shape == (18, 3, 32, 32) and data.train_size == 15
    assert data.input_shape == (3, 32, 32) and data.features.max() <= 1.0
    expected = np.concatenate([d for d, _ in batches]).reshape(-1, 3, 32, 32)
    assert torch.allclose(data.features * 255, torch.from_numpy(expected).float())
    assert data.labels.tolist() == [y for _, labels in batches for y in labels]
    assert len(load_dataset("cifar10", tmp_path / "cifar-10-batches-py")) == 18


class RunsShell:
    """A pickle payload that would run a shell command if unpickled naively."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_restricted_unpickler_refuses_code(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    marker = tmp_path / "pwned"
    payload = {"data": np.zeros((1, 3072), np.uint8), "labels": RunsShell(f"echo hi > {marker}")}
    evil = tmp_path / "evil"
    evil.write_bytes(pickle.dumps(payload))
    with pytest.raises(DataError, match=r"refusing to unpickle global (posix|nt)\.system"):
        load_numpy_pickle(evil)
    assert not marker.exists()
    assert "hi" not in capfd.readouterr().out
    write_cifar(tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(evil.read_bytes())
    with pytest.raises(DataError, match="refusing"):
        load_dataset("cifar10", tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"cbuiltins\neval\n(S'1+1'\ntR.",
        b"c_codecs\nencode\n(S'x'\nS'rot13'\ntR.",
        b"cnumpy\nload\n(S'x'\ntR.",
        b"not a pickle",
    ],
)
def test_restricted_unpickler_refuses_other_globals(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "batch"
    path.write_bytes(payload)
    with pytest.raises(DataError):
        load_numpy_pickle(path)


def write_purchase(path: Path, rows: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    labels = rng.integers(1, 101, size=rows)
    features = rng.integers(0, 2, size=(rows, 600))
    lines = [",".join(map(str, [y, *x])) for y, x in zip(labels, features, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return labels, features


def test_purchase100(tmp_path: Path) -> None:
    labels, features = write_purchase(tmp_path / "dataset_purchase")
    data = load_dataset("purchase100", tmp_path)
    assert data.features.shape == (5, 600) and data.kind == "tabular" and data.num_classes == 100
    assert data.labels.tolist() == (labels - 1).tolist()
    assert torch.equal(data.features, torch.from_numpy(features).float())
    assert data.train_size is None


def test_purchase100_rejects_bad_rows(tmp_path: Path) -> None:
    (tmp_path / "dataset_purchase").write_text("1,0,1\n")
    with pytest.raises(DataError, match="601 columns"):
        load_dataset("purchase100", tmp_path)
    (tmp_path / "dataset_purchase").write_text(",".join(["0"] * 601) + "\n")
    with pytest.raises(DataError, match=r"1\.\.100"):
        load_dataset("purchase100", tmp_path)


@pytest.mark.parametrize("nested", [True, False])
def test_texas100(tmp_path: Path, nested: bool) -> None:
    folder = tmp_path / "texas" / "100" if nested else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    features = rng.integers(0, 2, size=(4, 6169))
    labels = rng.integers(1, 101, size=4)
    (folder / "feats").write_text("\n".join(",".join(map(str, row)) for row in features) + "\n")
    (folder / "labels").write_text("\n".join(map(str, labels)) + "\n")
    data = load_dataset("texas100", tmp_path)
    assert data.features.shape == (4, 6169) and data.input_shape == (6169,)
    assert data.labels.tolist() == (labels - 1).tolist()
    assert torch.equal(data.features, torch.from_numpy(features).float())
    (folder / "labels").write_text("1\n2\n")
    with pytest.raises(DataError, match="one label per line"):
        load_dataset("texas100", tmp_path)
