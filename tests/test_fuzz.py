"""The bad-input contract, everywhere: a table of bad invocations of every command and of bad
files (damaged IDX, CIFAR pickles, npz, safetensors, sidecars, checkpoints).

For each: exit code 2, exactly one stderr line starting with `error: `, no traceback, nothing on
stdout, within a per-case time limit. Most cases run the typer app in-process; a few run the
installed command in a subprocess. Bad input is refused before any work, so each case takes
milliseconds (a first dataset load aside). A last test checks in subprocesses that no small bad
file makes a loader allocate more than 256 MB before it is refused.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from privacylab.cli import app
from privacylab.errors import PrivacylabError

runner = CliRunner()

CASE_SECONDS = 30
"""Per-case limit: a case that runs longer has started work it should have refused."""

HUGE = str(10**30)
ACC = ["--sample-rate", "0.01", "--delta", "1e-5"]
SIGMA = ["--noise-multiplier", "1.1"]


# --------------------------------------------------------------------------- bad files


def _idx(code: int, shape: tuple[int, ...], data: bytes) -> bytes:
    return bytes([0, 0, code, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + data


def _good_idx() -> dict[str, bytes]:
    images = np.zeros((4, 28, 28), np.uint8).tobytes()
    return {
        "train-images-idx3-ubyte": _idx(0x08, (4, 28, 28), images),
        "train-labels-idx1-ubyte": _idx(0x08, (4,), bytes([0, 1, 2, 3])),
        "t10k-images-idx3-ubyte": _idx(0x08, (2, 28, 28), images[: 2 * 784]),
        "t10k-labels-idx1-ubyte": _idx(0x08, (2,), bytes([0, 1])),
    }


def _gzip_zeros(header: bytes, count: int) -> bytes:
    """A gzip stream of `header` then `count` zero bytes, compressed chunk by chunk."""
    out = gzip.compress(header)
    chunk = gzip.compress(b"\0" * (1 << 20))
    full, rest = divmod(count, 1 << 20)
    return out + chunk * full + gzip.compress(b"\0" * rest)


IDX_DAMAGE: dict[str, Callable[[dict[str, bytes]], None]] = {
    "bad-magic": lambda f: f.update({"train-images-idx3-ubyte": b"\1\0\x08\3" + b"\0" * 20}),
    "short-header": lambda f: f.update({"train-images-idx3-ubyte": b"\0\0\x08\3\0\0"}),
    "empty-file": lambda f: f.update({"train-labels-idx1-ubyte": b""}),
    "zero-dims": lambda f: f.update({"train-labels-idx1-ubyte": b"\0\0\x08\0"}),
    "unknown-type": lambda f: f.update({"train-labels-idx1-ubyte": _idx(0x07, (4,), b"\0" * 4)}),
    "claims-more": lambda f: f.update(
        {"train-images-idx3-ubyte": _idx(0x08, (60000, 28, 28), b"\0" * 784)}
    ),
    "claims-less": lambda f: f.update({"train-labels-idx1-ubyte": _idx(0x08, (2,), b"\0" * 9)}),
    "over-limit": lambda f: f.update(
        {"train-images-idx3-ubyte": _idx(0x08, (2**32 - 1, 2**16, 2**16), b"")}
    ),
    "label-count": lambda f: f.update({"train-labels-idx1-ubyte": _idx(0x08, (3,), b"\0" * 3)}),
    "label-value": lambda f: f.update({"train-labels-idx1-ubyte": _idx(0x08, (4,), b"\x0c" * 4)}),
    "images-2d": lambda f: f.update(
        {"train-images-idx3-ubyte": _idx(0x08, (4, 784), b"\0" * 3136)}
    ),
    "sizes-differ": lambda f: f.update(
        {"t10k-images-idx3-ubyte": _idx(0x08, (2, 27, 27), b"\0" * 2 * 729)}
    ),
    "nan-pixels": lambda f: f.update(
        {
            "train-images-idx3-ubyte": _idx(
                0x0D, (4, 28, 28), np.full((4, 28, 28), np.nan, ">f4").tobytes()
            ),
            "t10k-images-idx3-ubyte": _idx(
                0x0D, (2, 28, 28), np.zeros((2, 28, 28), ">f4").tobytes()
            ),
        }
    ),
}

IDX_GZ_DAMAGE: dict[str, Callable[[], bytes]] = {
    # 2 MB of gzip that inflates to 2 GB of zeros behind a header announcing 4 images
    "gz-longer-than-header": lambda: _gzip_zeros(_idx(0x08, (4, 28, 28), b""), 2 * 1024**3),
    "gz-shorter-than-header": lambda: gzip.compress(_idx(0x08, (4, 28, 28), b"\0" * 100)),
    "gz-header-beyond-ratio": lambda: gzip.compress(_idx(0x08, (1_000_000, 28, 28), b"\0" * 784)),
    "gz-not-gzip": lambda: b"this is not gzip at all",
    "gz-truncated": lambda: gzip.compress(_idx(0x08, (4, 28, 28), b"\0" * 3136))[:40],
}


def make_idx_roots(base: Path) -> dict[str, Path]:
    roots = {}
    for name, damage in IDX_DAMAGE.items():
        files = _good_idx()
        damage(files)
        root = base / f"idx-{name}"
        root.mkdir()
        for fname, blob in files.items():
            (root / fname).write_bytes(blob)
        roots[name] = root
    for name, build in IDX_GZ_DAMAGE.items():
        files = _good_idx()
        root = base / f"idx-{name}"
        root.mkdir()
        for fname, blob in files.items():
            if fname == "train-images-idx3-ubyte":
                (root / (fname + ".gz")).write_bytes(build())
            else:
                (root / fname).write_bytes(blob)
        roots[name] = root
    return roots


class _Reduce:
    """Pickles as `fn(*args)` then BUILD `state`: hand-made pickles of numpy internals."""

    def __init__(self, fn: object, args: tuple, state: object = None) -> None:
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def _reconstruct() -> object:
    try:
        from numpy._core.multiarray import _reconstruct as fn
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct as fn  # type: ignore[no-redef]
    return fn


def _batch(data: object, labels: object) -> bytes:
    return pickle.dumps({"data": data, "labels": labels}, protocol=2)


CIFAR_DAMAGE: dict[str, Callable[[], bytes]] = {
    "evil-global": lambda: pickle.dumps(_Reduce(os.system, ("true",)), protocol=2),
    "memo-bomb": lambda: b"\x80\x02K\x01r" + struct.pack("<I", 2**30) + b".",
    "memo-bomb-put": lambda: b"(I1\np999999999\n.",
    "reconstruct-huge": lambda: _batch(
        _Reduce(_reconstruct(), (np.ndarray, (2_400_000_000,), b"b")), [0]
    ),
    "state-mismatch": lambda: _batch(
        _Reduce(
            _reconstruct(),
            (np.ndarray, (0,), b"b"),
            (1, (100_000, 3072), np.dtype("u1"), False, b"abc"),
        ),
        [0],
    ),
    "object-array": lambda: _batch(np.array([1, "a"], dtype=object), [0]),
    "record-dtype": lambda: _batch(np.zeros(2, dtype=[("a", "u1"), ("b", "f4")]), [0, 1]),
    "not-pickle": lambda: b"\x00\x01garbage\xff" * 10,
    "truncated": lambda: _batch(np.zeros((2, 3072), np.uint8), [0, 1])[:-50],
    "a-list": lambda: pickle.dumps([1, 2, 3], protocol=2),
    "no-labels": lambda: pickle.dumps({"data": np.zeros((2, 3072), np.uint8)}, protocol=2),
    "wrong-width": lambda: _batch(np.zeros((2, 100), np.uint8), [0, 1]),
    "label-count": lambda: _batch(np.zeros((2, 3072), np.uint8), [0]),
    "float-data": lambda: _batch(np.zeros((2, 3072), np.float32), [0, 1]),
    "empty": lambda: b"",
}


def make_cifar_roots(base: Path) -> dict[str, Path]:
    good = _batch(np.zeros((2, 3072), np.uint8), [0, 1])
    roots = {}
    for name, build in CIFAR_DAMAGE.items():
        root = base / f"cifar-{name}"
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True)
        for i, fname in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
            (folder / fname).write_bytes(build() if i == 0 else good)
        roots[name] = root
    return roots


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _npy_bytes(shape: tuple[int, ...], dtype: str, data: bytes) -> bytes:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def make_npz_files(base: Path) -> dict[str, Path]:
    x, y = np.random.default_rng(0).random((8, 4)).astype(np.float32), np.arange(8) % 2
    ok = {"x_train": x, "y_train": y, "x_test": x[:4], "y_test": y[:4]}
    files: dict[str, Path] = {}
    (base / "npz-not-zip.npz").write_bytes(b"not a zip file")
    files["not-zip"] = base / "npz-not-zip.npz"
    variants: dict[str, dict[str, np.ndarray]] = {
        "missing-array": {k: v for k, v in ok.items() if k != "y_test"},
        "nan-features": {**ok, "x_train": np.full((8, 4), np.nan, np.float32)},
        "inf-features": {**ok, "x_test": np.full((4, 4), np.inf, np.float32)},
        "object-features": {**ok, "x_train": np.array([[1, "a"]] * 8, dtype=object)},
        "label-count": {**ok, "y_train": y[:5]},
        "float-labels": {**ok, "y_train": y + 0.5},
        "negative-labels": {**ok, "y_test": -np.ones(4, np.int64)},
        "one-dim": {**ok, "x_train": np.zeros(8, np.float32)},
        "cols-differ": {**ok, "x_test": np.zeros((4, 5), np.float32)},
        "string-features": {**ok, "x_train": np.array([["a"] * 4] * 8)},
    }
    for name, arrays in variants.items():
        path = base / f"npz-{name}.npz"
        if name == "object-features":
            np.savez(path, **arrays, allow_pickle=True)  # type: ignore[arg-type]
        else:
            _npz(path, **arrays)
        files[name] = path
    # a 1 KB member whose header announces 4 GB (numpy would allocate it before reading)
    claims = base / "npz-claims-huge.npz"
    with zipfile.ZipFile(claims, "w", zipfile.ZIP_DEFLATED) as archive:
        for key, value in ok.items():
            if key == "x_train":
                archive.writestr("x_train.npy", _npy_bytes((100_000, 10_000), "<f4", b"\0" * 64))
            else:
                buffer = __import__("io").BytesIO()
                np.save(buffer, value)
                archive.writestr(f"{key}.npy", buffer.getvalue())
    files["claims-huge"] = claims
    return files


def _sidecar_mutations() -> dict[str, Callable[[dict], None]]:
    def drop(key: str) -> Callable[[dict], None]:
        return lambda d: d.pop(key)

    return {
        "format-int": lambda d: d.update(format=5),
        "format-other": lambda d: d.update(format="other/2"),
        "spec-str": lambda d: d.update(spec="x"),
        "spec-missing": drop("spec"),
        "spec-name-int": lambda d: d["spec"].update(name=5),
        "spec-name-unknown": lambda d: d["spec"].update(name="bogus"),
        "spec-shape-str": lambda d: d["spec"].update(input_shape=["a"]),
        "spec-shape-int": lambda d: d["spec"].update(input_shape=5),
        "spec-classes-str": lambda d: d["spec"].update(num_classes="10"),
        "spec-options-list": lambda d: d["spec"].update(options=[1]),
        "spec-option-unknown": lambda d: d["spec"].update(options={"widths": [3]}),
        "spec-huge": lambda d: d["spec"].update(input_shape=[1, 60000, 60000]),
        "spec-shape-mismatch": lambda d: d["spec"].update(input_shape=[1, 9, 9]),
        "weights-int": lambda d: d.update(weights=5),
        "weights-outside": lambda d: d.update(weights="../model.safetensors"),
        "weights-missing": lambda d: d.update(weights="nothere.safetensors"),
        "sha-int": lambda d: d.update(sha256=5),
        "sha-wrong": lambda d: d.update(sha256="0" * 64),
        "metadata-list": lambda d: d.update(metadata=[]),
        "training-int": lambda d: d["metadata"].update(training=5),
        "training-lr-str": lambda d: d["metadata"]["training"].update(lr="x"),
        "training-lr-huge": lambda d: d["metadata"]["training"].update(lr=1e308),
        "training-extra": lambda d: d["metadata"]["training"].update(bogus=1),
        "training-privacy-int": lambda d: d["metadata"]["training"].update(privacy=5),
        "training-missing": lambda d: d["metadata"].pop("training"),
        "data-int": lambda d: d["metadata"].update(data=5),
        "data-name-int": lambda d: d["metadata"]["data"].update(name=5),
        "data-name-unknown": lambda d: d["metadata"]["data"].update(name="bogus"),
        "summary-int": lambda d: d["metadata"].update(summary=5),
        "summary-epsilon-str": lambda d: d["metadata"]["summary"].update(epsilon="x"),
    }


def _safetensors_damage() -> dict[str, Callable[[bytes], bytes]]:
    def header(blob: bytes) -> dict:
        n = int.from_bytes(blob[:8], "little")
        return json.loads(blob[8 : 8 + n])

    def with_header(blob: bytes, change: Callable[[dict], None]) -> bytes:
        n = int.from_bytes(blob[:8], "little")
        h = header(blob)
        change(h)
        raw = json.dumps(h).encode()
        return len(raw).to_bytes(8, "little") + raw + blob[8 + n :]

    def first(h: dict) -> dict:
        return h[next(k for k in h if k != "__metadata__")]

    return {
        "empty": lambda b: b"",
        "three-bytes": lambda b: b"abc",
        "header-length-huge": lambda b: (2**62).to_bytes(8, "little") + b[8:],
        "header-not-json": lambda b: (10).to_bytes(8, "little") + b"not json!!" + b[8:],
        "truncated": lambda b: b[: len(b) // 2],
        "offsets-outside": lambda b: with_header(
            b, lambda h: first(h).update(data_offsets=[0, 10**12])
        ),
        "shape-huge": lambda b: with_header(b, lambda h: first(h).update(shape=[100000, 100000])),
        "dtype-bogus": lambda b: with_header(b, lambda h: first(h).update(dtype="Q99")),
        "renamed": lambda b: with_header(
            b, lambda h: h.update({"other": h.pop(next(k for k in h if k != "__metadata__"))})
        ),
        "shape-str": lambda b: with_header(b, lambda h: first(h).update(shape="x")),
    }


def make_model_folders(base: Path) -> tuple[Path, dict[str, Path]]:
    from privacylab.models import ModelSpec, build_model, save_model
    from privacylab.training.config import TrainConfig

    spec = ModelSpec("logreg", (1, 8, 8), 10, {})
    good = base / "model-good"
    metadata = {
        "data": {"name": "digits", "train_size": 1438, "test_size": 359},
        "training": TrainConfig(epochs=1).to_dict(),
        "summary": {"epsilon": None, "train_accuracy": 0.5},
        "result": {"history": []},
    }
    save_model(build_model("logreg", (1, 8, 8), 10, seed=0), good, spec, metadata)
    base_sidecar = json.loads((good / "model.json").read_text())
    folders: dict[str, Path] = {}
    for name, mutate in _sidecar_mutations().items():
        folder = base / f"model-sidecar-{name}"
        shutil.copytree(good, folder)
        sidecar = copy.deepcopy(base_sidecar)
        mutate(sidecar)
        (folder / "model.json").write_text(json.dumps(sidecar))
        folders[f"sidecar-{name}"] = folder
    for name, text in (("not-json", "{not json"), ("a-list", "[1, 2]"), ("empty", "")):
        folder = base / f"model-sidecar-{name}"
        shutil.copytree(good, folder)
        (folder / "model.json").write_text(text)
        folders[f"sidecar-{name}"] = folder
    blob = (good / "model.safetensors").read_bytes()
    for name, damage in _safetensors_damage().items():
        folder = base / f"model-weights-{name}"
        shutil.copytree(good, folder)
        (folder / "model.safetensors").write_bytes(damage(blob))
        sidecar = copy.deepcopy(base_sidecar)
        sidecar.pop("sha256")  # let the damage reach the safetensors checks
        (folder / "model.json").write_text(json.dumps(sidecar))
        folders[f"weights-{name}"] = folder
    return good, folders


# --------------------------------------------------------------------------- the table


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    out: dict[str, Path] = {"base": base}
    (base / "a-file").write_text("x")
    (base / "a-folder").mkdir()
    out.update({f"idx:{k}": v for k, v in make_idx_roots(base).items()})
    out.update({f"cifar:{k}": v for k, v in make_cifar_roots(base).items()})
    out.update({f"npz:{k}": v for k, v in make_npz_files(base).items()})
    good, folders = make_model_folders(base)
    out["model:good"] = good
    out.update({f"model:{k}": v for k, v in folders.items()})
    return out


def account_cases() -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []
    for bad in ("0", "-1", "nan", "inf", "1e-308", "1e308", "abc"):
        cases.append(
            (
                f"epsilon sigma={bad}",
                ["account", "epsilon", "--noise-multiplier", bad, *ACC, "--steps", "100"],
            )
        )
    for acc in ("rdp", "gdp", "pld", "rdp-classic"):
        cases.append(
            (
                f"epsilon sigma=1e-308 {acc}",
                [
                    "account",
                    "epsilon",
                    "--noise-multiplier",
                    "1e-308",
                    *ACC,
                    "--steps",
                    "100",
                    "--accountant",
                    acc,
                ],
            )
        )
    for bad in ("0", "1.5", "-0.1", "nan"):
        cases.append(
            (
                f"epsilon q={bad}",
                [
                    "account",
                    "epsilon",
                    *SIGMA,
                    "--sample-rate",
                    bad,
                    "--delta",
                    "1e-5",
                    "--steps",
                    "10",
                ],
            )
        )
    for bad in ("0", "1", "2", "nan", "-1e-5"):
        cases.append(
            (
                f"epsilon delta={bad}",
                [
                    "account",
                    "epsilon",
                    *SIGMA,
                    "--sample-rate",
                    "0.01",
                    "--delta",
                    bad,
                    "--steps",
                    "10",
                ],
            )
        )
    for bad in ("0", "-5", HUGE, "1.5", "10000000000000"):
        cases.append((f"epsilon steps={bad}", ["account", "epsilon", *SIGMA, *ACC, "--steps", bad]))
    for bad in ("0", "-1", "1e308", "nan"):
        cases.append(
            (f"epsilon epochs={bad}", ["account", "epsilon", *SIGMA, *ACC, "--epochs", bad])
        )
    cases += [
        (
            "epsilon steps and epochs",
            ["account", "epsilon", *SIGMA, *ACC, "--steps", "5", "--epochs", "1"],
        ),
        ("epsilon no steps", ["account", "epsilon", *SIGMA, *ACC]),
        (
            "epsilon accountant bogus",
            ["account", "epsilon", *SIGMA, *ACC, "--steps", "5", "--accountant", "bogus"],
        ),
        ("epsilon missing sigma", ["account", "epsilon", *ACC, "--steps", "5"]),
        (
            "epsilon unknown option",
            ["account", "epsilon", *SIGMA, *ACC, "--steps", "5", "--bogus"],
        ),
    ]
    for bad in ("0", "-1", "nan", "inf", "1e308", "100000"):
        cases.append(
            (f"noise epsilon={bad}", ["account", "noise", "--epsilon", bad, *ACC, "--steps", "100"])
        )
    cases += [
        (
            "noise epsilon=1e308 rdp",
            [
                "account",
                "noise",
                "--epsilon",
                "1e308",
                *ACC,
                "--steps",
                "100",
                "--accountant",
                "rdp",
            ],
        ),
        ("noise steps huge", ["account", "noise", "--epsilon", "1", *ACC, "--steps", HUGE]),
        (
            "noise unreachable epsilon",
            [
                "account",
                "noise",
                "--epsilon",
                "1e-9",
                *ACC,
                "--steps",
                "1000",
                "--accountant",
                "rdp",
            ],
        ),
        (
            "noise bad delta",
            [
                "account",
                "noise",
                "--epsilon",
                "1",
                "--sample-rate",
                "0.01",
                "--delta",
                "1",
                "--steps",
                "10",
            ],
        ),
    ]
    for bad in ("0", "nan", "1e308", "1e-308"):
        cases.append(
            (
                f"steps sigma={bad}",
                ["account", "steps", "--noise-multiplier", bad, *ACC, "--epsilon", "1"],
            )
        )
    for bad in ("0", "-2", "inf", "1e308"):
        cases.append((f"steps epsilon={bad}", ["account", "steps", *SIGMA, *ACC, "--epsilon", bad]))
    cases.append(
        (
            "steps q=2",
            ["account", "steps", *SIGMA, "--sample-rate", "2", "--delta", "1e-5", "--epsilon", "1"],
        )
    )
    curve = ["account", "curve", *SIGMA, *ACC]
    cases += [
        ("curve points=0", [*curve, "--epochs", "1", "--points", "0"]),
        ("curve points huge", [*curve, "--epochs", "1", "--points", "1000000000"]),
        ("curve epochs=0", [*curve, "--epochs", "0"]),
        ("curve epochs=1e308", [*curve, "--epochs", "1e308", "--points", "2"]),
        (
            "curve sigma=1e-308",
            [
                "account",
                "curve",
                "--noise-multiplier",
                "1e-308",
                *ACC,
                "--epochs",
                "1",
                "--points",
                "2",
            ],
        ),
        ("curve plot dir", [*curve, "--epochs", "1", "--points", "2", "--plot", "{base}/a-folder"]),
        ("curve plot empty", [*curve, "--epochs", "1", "--points", "2", "--plot", ""]),
        (
            "curve plot no folder",
            [*curve, "--epochs", "1", "--points", "2", "--plot", "{base}/nope/x.png"],
        ),
        ("curve plot txt", [*curve, "--epochs", "1", "--points", "2", "--plot", "{base}/x.txt"]),
        (
            "curve plot under file",
            [*curve, "--epochs", "1", "--points", "2", "--plot", "{base}/a-file/x.png"],
        ),
    ]
    return cases


def train_cases() -> list[tuple[str, list[str]]]:
    train = [
        "train",
        "--out",
        "{base}/train-out",
        "--dataset",
        "digits",
        "--model",
        "logreg",
        "--epochs",
        "1",
    ]
    cases: list[tuple[str, list[str]]] = []
    for option, values in {
        "--lr": ("0", "-1", "nan", "inf", "1e308"),
        "--epochs": ("0", "-1", HUGE),
        "--batch-size": ("0", "-3", HUGE),
        "--device": ("bogus", "cuda:99", "meta", ""),
        "--model": ("bogus", ""),
        "--dataset": ("bogus", "", "{base}/nope.npz"),
        "--optimizer": ("bogus",),
        "--schedule": ("bogus",),
        "--weight-decay": ("-1", "nan"),
        "--label-smoothing": ("1", "-0.1"),
        "--seed": ("-1",),
        "--root": ("{base}/nope",),
        "--out": ("", "{base}/a-file", "{base}/a-file/sub"),
    }.items():
        for value in values:
            cases.append((f"train {option}={value!r}", [*train, option, value]))
    mlp = [*train[:5], "--model", "mlp", "--epochs", "1"]
    for widths in ("2000000000", "100000,100000", "a,b", "0", "-5", "1.5"):
        cases.append((f"train --widths={widths}", [*mlp, "--widths", widths]))
    cases += [
        ("train activation bogus", [*mlp, "--activation", "bogus"]),
        ("train cnn norm bogus", [*train[:5], "--model", "cnn", "--norm", "bogus"]),
        ("train logreg widths", [*train, "--widths", "5"]),
        ("train epsilon without dp", [*train, "--epsilon", "1"]),
        ("train dp without epsilon", [*train, "--dp"]),
        ("train dp epsilon=1e308", [*train, "--dp", "--epsilon", "1e308"]),
        ("train dp epsilon=0", [*train, "--dp", "--epsilon", "0"]),
        ("train dp sigma=1e-308", [*train, "--dp", "--noise-multiplier", "1e-308"]),
        ("train dp delta=1", [*train, "--dp", "--epsilon", "1", "--delta", "1"]),
        ("train dp clip=0", [*train, "--dp", "--epsilon", "1", "--max-grad-norm", "0"]),
        ("train dp clip=nan", [*train, "--dp", "--epsilon", "1", "--max-grad-norm", "nan"]),
        ("train dp clipping bogus", [*train, "--dp", "--epsilon", "1", "--clipping", "bogus"]),
        ("train dp sampling bogus", [*train, "--dp", "--epsilon", "1", "--sampling", "bogus"]),
        ("train dp accountant gdp", [*train, "--dp", "--epsilon", "1", "--accountant", "gdp"]),
        ("train dp physical 0", [*train, "--dp", "--epsilon", "1", "--physical-batch-size", "0"]),
    ]
    out = "{base}/train-out"
    for key in IDX_DAMAGE | IDX_GZ_DAMAGE:
        cases.append(
            (
                f"train mnist idx {key}",
                ["train", "--out", out, "--dataset", "mnist", "--root", f"{{idx:{key}}}"],
            )
        )
    for key in CIFAR_DAMAGE:
        cases.append(
            (
                f"train cifar10 {key}",
                [
                    "train",
                    "--out",
                    out,
                    "--dataset",
                    "cifar10",
                    "--model",
                    "logreg",
                    "--root",
                    f"{{cifar:{key}}}",
                ],
            )
        )
    for key in (
        "not-zip",
        "missing-array",
        "nan-features",
        "inf-features",
        "object-features",
        "label-count",
        "float-labels",
        "negative-labels",
        "one-dim",
        "cols-differ",
        "string-features",
        "claims-huge",
    ):
        cases.append(
            (
                f"train npz {key}",
                ["train", "--out", out, "--dataset", f"{{npz:{key}}}", "--model", "logreg"],
            )
        )
    return cases


def run_cases() -> list[tuple[str, list[str]]]:
    run = ["run", "--quick", "--out", "{base}/run-out"]
    cases: list[tuple[str, list[str]]] = []
    for option, values in {
        "--model": ("bogus",),
        "--dataset": ("bogus", "{npz:nan-features}"),
        "--widths": ("2000000000", "100000,100000", "x"),
        "--device": ("bogus", "cuda:7"),
        "--attacks": ("", "bogus", ","),
        "--out": ("", "{base}/a-file"),
        "--cache": ("{base}/a-file",),
        "--epsilons": ("a", "0", "-1", "1e308", "nan"),
        "--members": ("0", "100000"),
        "--references": ("0", HUGE),
        "--epochs": ("0", "1000000"),
        "--workers": ("0",),
        "--audits": ("bogus",),
        "--seed": ("-1",),
        "--verdict-threshold": ("2", "nan"),
    }.items():
        for value in values:
            cases.append((f"run {option}={value!r}", [*run, option, value]))
    cases.append(("run nothing to attack", [*run, "--no-nonprivate", "--epsilons", ""]))
    cases.append(("run model widths mismatch", [*run, "--model", "logreg", "--widths", "5"]))
    return cases


def attack_cases() -> list[tuple[str, list[str]]]:
    good = ["attack", "membership", "--target", "{model:good}", "--references", "1"]
    cases: list[tuple[str, list[str]]] = [
        ("attack --attack ''", [*good, "--attack", ""]),
        ("attack --attack ','", [*good, "--attack", ","]),
        ("attack --attack bogus", [*good, "--attack", "bogus"]),
        ("attack --subsample -1", [*good, "--subsample", "-1"]),
        ("attack --subsample 0", [*good, "--subsample", "0"]),
        (
            "attack --references 0",
            ["attack", "membership", "--target", "{model:good}", "--references", "0"],
        ),
        (
            "attack --references huge",
            ["attack", "membership", "--target", "{model:good}", "--references", HUGE],
        ),
        ("attack --workers 0", [*good, "--workers", "0"]),
        ("attack --root missing", [*good, "--root", "{base}/nope"]),
        ("attack --cache file", [*good, "--cache", "{base}/a-file"]),
        ("attack --target ''", ["attack", "membership", "--target", ""]),
        ("attack --target missing", ["attack", "membership", "--target", "{base}/nope"]),
        ("attack --target file", ["attack", "membership", "--target", "{base}/a-file"]),
        ("attack --target empty folder", ["attack", "membership", "--target", "{base}/a-folder"]),
    ]
    for key in _sidecar_mutations():
        cases.append(
            (
                f"attack sidecar {key}",
                [*good[:2], "--target", f"{{model:sidecar-{key}}}", "--references", "1"],
            )
        )
    for key in ("not-json", "a-list", "empty"):
        cases.append((f"attack sidecar {key}", [*good[:2], "--target", f"{{model:sidecar-{key}}}"]))
    for key in _safetensors_damage():
        cases.append((f"attack weights {key}", [*good[:2], "--target", f"{{model:weights-{key}}}"]))
    return cases


def audit_cases() -> list[tuple[str, list[str]]]:
    audit = ["audit", "--store", "{base}/audit/store.sqlite"]
    cases: list[tuple[str, list[str]]] = []
    for option, values in {
        "--trials": ("0", "-1", HUGE),
        "--method": ("bogus", ""),
        "--epsilon": ("0", "nan", "inf", "1e308"),
        "--delta": ("0", "1"),
        "--confidence": ("0", "1", "nan"),
        "--executor": ("bogus",),
        "--workers": ("0", HUGE),
        "--store": ("", "{base}/a-folder", "{base}/a-file/store.sqlite"),
        "--seed": ("-1",),
        "--address": ("127.0.0.1:1",),
    }.items():
        for value in values:
            cases.append((f"audit {option}={value!r}", [*audit, option, value]))
    cases += [
        ("audit --k huge", [*audit, "--method", "clipbkd", "--k", HUGE]),
        ("audit --k 0", [*audit, "--method", "clipbkd", "--k", "0"]),
        ("audit --k for dirac", [*audit, "--k", "5"]),
        ("audit dirac on mlp", [*audit, "--model", "mlp"]),
        ("audit clipbkd model bogus", [*audit, "--method", "clipbkd", "--model", "bogus"]),
        ("audit clipbkd dataset bogus", [*audit, "--method", "clipbkd", "--dataset", "bogus"]),
        ("audit ray unreachable", [*audit, "--executor", "ray", "--address", "127.0.0.1:1"]),
        ("audit ray bad address", [*audit, "--executor", "ray", "--address", "nonsense"]),
    ]
    return cases


def other_cases() -> list[tuple[str, list[str]]]:
    return [
        ("unknown command", ["bogus"]),
        ("unknown account command", ["account", "bogus"]),
        ("attack unknown family", ["attack", "bogus"]),
    ]


CASES = (
    account_cases() + train_cases() + run_cases() + attack_cases() + audit_cases() + other_cases()
)


def _fill(args: list[str], files: dict[str, Path]) -> list[str]:
    out = []
    for arg in args:
        for key, path in files.items():
            arg = arg.replace(f"{{{key}}}", str(path))
        out.append(arg)
    return out


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"case ran longer than {seconds} s: it started work")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_line_error(code: int, stdout: str, stderr: str, where: str) -> None:
    assert "Traceback" not in stderr, f"{where}: traceback\n{stderr}"
    assert code == 2, f"{where}: exit {code}\nstdout: {stdout}\nstderr: {stderr}"
    assert stdout == "", f"{where}: printed a result: {stdout!r}"
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: stderr {stderr!r}"


def test_the_table_is_large_and_covers_every_command() -> None:
    assert len(CASES) >= 150
    commands = {" ".join(a for a in args[:2] if not a.startswith("-")) for _, args in CASES}
    for command in (
        "account epsilon",
        "account noise",
        "account steps",
        "account curve",
        "train",
        "run",
        "attack membership",
        "audit",
    ):
        assert any(
            c == command or c.startswith(command + " ") or c.split()[0] == command for c in commands
        ), command
    assert len({name for name, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "args"), CASES, ids=[name for name, _ in CASES])
def test_bad_invocation_is_one_line(name: str, args: list[str], files: dict[str, Path]) -> None:
    with _time_limit(CASE_SECONDS):
        result = runner.invoke(app, _fill(args, files))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{name}: {type(result.exception).__name__}: {result.exception}")
    assert_one_line_error(result.exit_code, result.stdout, result.stderr, name)


SUBPROCESS_CASES = [
    (
        "account sigma=1e-308 rdp",
        [
            "account",
            "epsilon",
            "--noise-multiplier",
            "1e-308",
            *ACC,
            "--steps",
            "100",
            "--accountant",
            "rdp",
        ],
    ),
    (
        "train --lr 1e308",
        [
            "train",
            "--out",
            "{base}/sub-train",
            "--dataset",
            "digits",
            "--model",
            "logreg",
            "--lr",
            "1e308",
        ],
    ),
    (
        "run --quick --model bogus",
        ["run", "--quick", "--model", "bogus", "--out", "{base}/sub-run"],
    ),
    (
        "attack damaged sidecar",
        ["attack", "membership", "--target", "{model:sidecar-training-extra}"],
    ),
    ("audit --trials 10**30", ["audit", "--trials", HUGE, "--store", "{base}/sub-audit/s.sqlite"]),
]


@pytest.mark.parametrize(("name", "args"), SUBPROCESS_CASES, ids=[n for n, _ in SUBPROCESS_CASES])
def test_bad_invocation_in_a_process(name: str, args: list[str], files: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "privacylab", *_fill(args, files)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=files["base"],
    )
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, name)


# --------------------------------------------------------------------------- memory

MEMORY_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from privacylab.errors import PrivacylabError
    from privacylab.data import load_dataset, load_numpy_pickle, read_idx
    from privacylab.models import load_model
    loaders = {
        "mnist": lambda p: load_dataset("mnist", p),
        "cifar": load_numpy_pickle,
        "npz": load_dataset,
        "model": load_model,
    }
    load_dataset("digits")  # warm up lazy imports and allocator pools first
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = []
    for kind, path in json.loads(sys.argv[1]):
        try:
            loaders[kind](path)
            outcome = "loaded"
        except PrivacylabError as error:
            outcome = "refused: " + str(error)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report.append({"path": path, "outcome": outcome, "grew_kb": peak - baseline})
    print(json.dumps(report))
    """
)


def test_no_small_bad_file_allocates_more_than_256_mb(files: dict[str, Path]) -> None:
    """Every loader is fed its small bad files in one fresh process; the process's peak RSS
    (ru_maxrss: numpy, torch and Python allocations alike) may never grow by 256 MB over its
    warmed-up baseline before each file is refused."""
    probes = [
        ("mnist", files["idx:gz-longer-than-header"]),
        ("mnist", files["idx:gz-header-beyond-ratio"]),
        ("mnist", files["idx:claims-more"]),
        ("mnist", files["idx:over-limit"]),
        ("cifar", files["cifar:memo-bomb"] / "cifar-10-batches-py" / "data_batch_1"),
        ("cifar", files["cifar:memo-bomb-put"] / "cifar-10-batches-py" / "data_batch_1"),
        ("cifar", files["cifar:reconstruct-huge"] / "cifar-10-batches-py" / "data_batch_1"),
        ("cifar", files["cifar:state-mismatch"] / "cifar-10-batches-py" / "data_batch_1"),
        ("npz", files["npz:claims-huge"]),
        ("model", files["model:sidecar-spec-huge"]),
        ("model", files["model:weights-shape-huge"]),
        ("model", files["model:weights-header-length-huge"]),
    ]
    for _, path in probes:
        size = (
            sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size
        )
        assert size < 4 * 1024**2, path
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, json.dumps([(k, str(p)) for k, p in probes])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for entry in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert entry["outcome"].startswith("refused: "), entry
        assert entry["grew_kb"] < 256 * 1024, entry


# --------------------------------------------------------------------------- Python API


def test_python_api_raises_privacylab_errors(files: dict[str, Path]) -> None:
    from privacylab.accounting import calibrate_noise_multiplier, dp_sgd, make_accountant
    from privacylab.audit.job import run_audit
    from privacylab.data import load_dataset, load_numpy_pickle, read_idx
    from privacylab.execution.ray_executor import RayExecutor
    from privacylab.experiment import RunConfig
    from privacylab.models import build_model, load_model

    calls: list[Callable[[], object]] = [
        lambda: make_accountant("rdp").compose(dp_sgd(1e-308, 0.01, 10)).epsilon(1e-5),
        lambda: make_accountant("gdp").compose(dp_sgd(1e-308, 0.01, 10)).epsilon(1e-5),
        lambda: calibrate_noise_multiplier(1e308, 1e-5, 0.01, 100),
        lambda: read_idx(files["idx:bad-magic"] / "train-images-idx3-ubyte"),
        lambda: load_dataset("mnist", files["idx:gz-longer-than-header"]),
        lambda: load_numpy_pickle(
            files["cifar:evil-global"] / "cifar-10-batches-py" / "data_batch_1"
        ),
        lambda: load_dataset("cifar10", files["cifar:record-dtype"]),
        lambda: load_dataset(str(files["npz:nan-features"])),
        lambda: load_model(files["model:weights-offsets-outside"]),
        lambda: load_model(files["model:sidecar-spec-shape-str"]),
        lambda: build_model("mlp", (1, 28, 28), 10, widths=[2_000_000_000]),
        lambda: RunConfig(model="bogus").validate(),
        lambda: RunConfig(model_options={"widths": [100_000, 100_000]}).validate(),
        lambda: RunConfig(lr=1e308).validate(),
        lambda: run_audit("dirac", epsilon=1.0, trials=10**30, store=files["base"] / "a.sqlite"),
        lambda: RayExecutor(1, address="127.0.0.1:1", connect_timeout=2).start(),
    ]
    for call in calls:
        with pytest.raises(PrivacylabError) as info:
            call()
        assert "\n" not in str(info.value)


def test_paths_with_rich_markup_are_printed_verbatim(tmp_path: Path) -> None:
    from rich.console import Console

    from privacylab.cli._common import _say, _writable_folder

    folder = tmp_path / "x[/]y"
    assert _writable_folder(folder) == folder
    console = Console(record=True, width=200)
    _say(console, f"wrote {folder}")
    assert str(folder) in console.export_text()


def test_result_store_keeps_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from privacylab.execution import ResultStore

    monkeypatch.chdir(tmp_path)
    with ResultStore("rel/store.sqlite") as store:
        assert store.path.is_absolute()
        assert store.path == (tmp_path / "rel" / "store.sqlite").resolve()


def test_trained_checkpoint_damage_is_one_line(tmp_path: Path) -> None:
    """A real checkpoint from `privacylab train`, damaged three ways, is one line on resume."""
    out = tmp_path / "m"
    args = ["train", "--out", str(out), "--dataset", "digits", "--model", "logreg"]
    first = runner.invoke(app, [*args, "--epochs", "1"])
    assert first.exit_code == 0, first.stderr
    checkpoints = sorted(p for p in (out / "checkpoint").rglob("*") if p.is_file())
    assert checkpoints
    pristine = {p: p.read_bytes() for p in checkpoints}
    for damage in (lambda b: b[: len(b) // 3], lambda b: b"", lambda b: b"\xff" * len(b)):
        for path, blob in pristine.items():
            path.write_bytes(damage(blob))
        with _time_limit(CASE_SECONDS):
            result = runner.invoke(app, [*args, "--epochs", "2"])
        assert_one_line_error(result.exit_code, result.stdout, result.stderr, "checkpoint")


def test_an_output_path_that_looks_like_rich_markup_works(tmp_path: Path) -> None:
    out = tmp_path / "x[/]y"
    args = ["train", "--out", str(out), "--dataset", "digits", "--model", "logreg", "--epochs", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}" in result.stderr
    assert (out / "model.json").is_file()
